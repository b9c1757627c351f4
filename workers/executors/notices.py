"""Cloud preemption notices, watched on the target by a plain POSIX `sh` script.

[`notice_watch_script`] returns a script that runs beside a job (like the watchdog
of `scripts.watchdog_script`: no Python, no worker, no Redis), watches the cloud's
metadata service for a notice that the machine is about to go away, and then asks
the job for its snapshot itself: it writes `notice.json` (what the cloud said) and
`snapshot.request` holding [`NOTICE_REASON`] (`preempted`), unless a request is
already there. The service reads both with [`parse_notice`] and
[`parse_notice_state`].

Sources watched (each one documented by its cloud; the test fakes in
`bench/harness/fakecloud.py` emulate those documents; what each means for the machine:
`schemas.preemption.NoticeSource`, and docs/preemption.md):

- `aws-spot`: IMDSv2 `GET /latest/meta-data/spot/instance-action` answers 200
  (404: no notice);
- `aws-rebalance`: IMDSv2 `GET /latest/meta-data/events/recommendations/rebalance`
  answers 200 (an earlier hint than the spot notice);
- `gcp-preempted`: `GET /computeMetadata/v1/instance/preempted` (long poll) is
  `TRUE`;
- `gcp-maintenance`: `GET /computeMetadata/v1/instance/maintenance-event` (long
  poll) is `TERMINATE_ON_HOST_MAINTENANCE` (or `SHUTDOWN_ON_HOST_MAINTENANCE`);
- `azure-preempt`: `GET /metadata/scheduledevents?api-version=2020-07-01` lists an
  event with `"EventType": "Preempt"`.

What stays out of reach: the watcher trusts whatever answers at the base URL (a
hostile metadata server can always fake a notice; it cannot make the script run
anything, write elsewhere, or grow without bound). GCP's
`MIGRATE_ON_HOST_MAINTENANCE` is a live migration: the job keeps running, so it
asks nothing. Azure delivers the events of a whole availability set or placement
group to each VM; the watcher does not filter them by the VM's own name
(`Resources`), so a sibling's preemption also asks this job for a snapshot. Azure's
first Scheduled Events request may take up to two minutes while the service enables
itself; the watcher cuts each request at [`NOTICE_HTTP_MAX_S`] and asks again every
poll. A notice raised and withdrawn between two polls (AWS, Azure) is missed.
"""

from __future__ import annotations

import json
import math
import secrets as _secrets
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final, Literal, get_args

from schemas.preemption import DEFAULT_METADATA_URLS, METADATA_URL, NoticeSource
from schemas.protocol import NOTICE_FILE, NOTICE_PID_FILE, NOTICE_STATE_FILE

from .errors import InvalidArgument, ProtocolError
from .scripts.common import Script, sh

__all__ = [
    "DEFAULT_BASE_URLS",
    "NOTICE_FILE",
    "NOTICE_FILE_LIMIT",
    "NOTICE_GCP_WAIT_S",
    "NOTICE_HTTP_MAX_S",
    "NOTICE_PID_FILE",
    "NOTICE_PROBE_S",
    "NOTICE_REASON",
    "NOTICE_SOURCES",
    "NOTICE_STATE_FILE",
    "NOTICE_TOOLS",
    "Notice",
    "NoticeState",
    "Provider",
    "notice_watch_script",
    "parse_notice",
    "parse_notice_state",
]

Provider = Literal["aws", "gcp", "azure", "auto"]
"""Which cloud to watch; `auto` probes each and watches those that answer."""

# The file names are the protocol's (`schemas.protocol`): `notice.json`, the notice
# the watcher saw, relative to the run directory, one JSON object (see [`Notice`])
# replaced atomically and written before `snapshot.request`; `.runwarden/notice.state`,
# one line saying what the watcher does (see [`parse_notice_state`]);
# `.runwarden/notice.pid`, the watcher's pid (its supervisor), like `watchdog.pid`,
# which stays after the end.
NOTICE_REASON: Final = "preempted"
"""The reason the watcher writes to `snapshot.request`."""
NOTICE_SOURCES: Final[tuple[str, ...]] = get_args(NoticeSource)
DEFAULT_BASE_URLS: Final[Mapping[str, str]] = DEFAULT_METADATA_URLS
"""Each cloud's documented metadata service: `http://169.254.169.254` for AWS and
Azure, `http://metadata.google.internal` for GCP (which resolves to that address on
GCP; the service's settings `RUNWARDEN_METADATA_*_URL` override each)."""
NOTICE_TOOLS: Final = ("sh", "head", "sed", "tr", "date", "sleep", "mv", "ln", "rm", "mkdir")
"""What the script needs on the PATH besides the shell's builtins (`kill`, `read`,
`printf`, `command`), plus an HTTP client: `curl`, or `wget` with `timeout`."""

# The script (`sh/notice_watch.sh`) writes the reason and these limits as literals, with
# the 64 KiB it keeps of a response, the AWS token's TTL and the Azure API version; a
# unit test checks that both say the same.
NOTICE_HTTP_MAX_S: Final = 5
"""Longest AWS or Azure request (and GCP's first plain read), in seconds."""
NOTICE_PROBE_S: Final = 2
"""Longest probe request at the start, in seconds (one per cloud asked)."""
NOTICE_GCP_WAIT_S: Final = 30
"""GCP's long-poll `timeout_sec`: the server answers within this many seconds even
without a change; the request itself is cut 5 s later."""
NOTICE_FILE_LIMIT: Final = 4096
"""Largest `notice.json` [`parse_notice`] accepts, in bytes (the script writes at
most about 400)."""
_FIELD_LIMIT: Final = 64  # characters kept of `not_after` and `detail`
_MIN_POLL_MS: Final = 100
_MAX_POLL_S: Final = 3600.0
_BASE_URL = METADATA_URL


def _base_urls(base_urls: Mapping[str, str]) -> dict[str, str]:
    urls = dict(DEFAULT_BASE_URLS)
    for cloud, url in base_urls.items():
        if cloud not in DEFAULT_BASE_URLS:
            raise InvalidArgument(f"no metadata service is named {cloud[:40]!r}")
        bare = url[:-1] if url.endswith("/") else url
        if not _BASE_URL.fullmatch(bare):
            raise InvalidArgument(f"the {cloud} base URL {url[:80]!r} is not http://host[:port]")
        urls[cloud] = bare
    return urls


def notice_watch_script(
    dir: str,
    provider: Provider,
    base_urls: Mapping[str, str] = DEFAULT_BASE_URLS,
    poll_s: float = 1.0,
) -> Script:
    """The preemption-notice watcher of the job in `dir`: a plain POSIX `sh` script
    (dash and busybox `sh`; `sh/notice_watch.sh`), run as `sh -c` beside the job,
    outside its process group (as the launcher starts the watchdog: `setsid`, stdio
    on /dev/null). Its arguments are the run directory, the provider, the three base
    URLs, the poll period in milliseconds and a random token for its temporary names.

    Start:
    - takes the job's pid and its leader's start time from its arguments after its
      own (`sh -c WATCHER rw-notice ARG... PID START`, as the launcher starts it:
      never from a file the job could rewrite); started without them, it reads the
      pid from `job.pid`.
      Exit 3 when that is not a pid above 1. It records its own pid in
      `.runwarden/notice.pid` and moves to `/`;
    - picks its HTTP client: `curl` where present; else `wget` run under `timeout`
      (GNU wget; or busybox wget, which cannot PUT, so AWS is then unavailable);
    - with `auto`, probes GCP, Azure, then AWS (each request at most
      [`NOTICE_PROBE_S`] s: GCP must answer with its `Metadata-Flavor: Google`
      header, Azure with its `/metadata/versions` list, AWS with an IMDSv2 token)
      and watches those that answered; a named provider is watched even when its
      probe gets no answer;
    - writes `.runwarden/notice.state`: `watching <clouds> with <client>[ (auto)]
      [ (no answer yet)]`, or `unavailable: <why>` and exits 4 (no curl nor wget;
      wget without `timeout`; AWS with busybox wget; nothing answered to `auto`).

    Watch: one background subshell per source loop (AWS, Azure, each GCP key):
    - AWS: an IMDSv2 token (PUT `/latest/api/token`, TTL 21600 s) kept until a 401,
      then renewed once and the GET retried; each poll GETs `spot/instance-action`
      then `events/recommendations/rebalance`. A 200 on either is the notice (AWS
      documents the items as present only then): `aws-spot` with the JSON `action`
      as detail (the first 64 characters of the body when it has none) and `time`
      as not-after; `aws-rebalance` with `rebalance noticeTime=<t>` and no not-after.
    - GCP: `preempted` and `maintenance-event`, each first read plainly, then long
      polled (`?wait_for_change=true&timeout_sec=30&last_etag=<ETag>`): a change is
      seen as soon as the server answers. `TRUE` is `gcp-preempted`;
      `TERMINATE_ON_HOST_MAINTENANCE` (or `SHUTDOWN_ON_HOST_MAINTENANCE`) is
      `gcp-maintenance`; no not-after (GCP gives none: the service derives one
      from `seen_at`, `schemas.preemption.DOCUMENTED_LEAD_S`).
    - Azure: each poll GETs the Scheduled Events document; the first event with
      `"EventType": "Preempt"` is `azure-preempt`, its `NotBefore` the not-after,
      detail `Preempt <EventStatus>`; other event types are ignored.
    - Each loop takes at most one turn per `poll_s` (min 0.1 s), however fast the
      server answers or fails: an erroring server is never asked in a busy loop.
      One exception: GCP's plain read that gave an ETag is followed at once by its
      first long poll (which waits by itself; at most two requests a turn).
      Every request goes past any proxy (the services are link-local), is bounded
      in time (`curl -m`, `timeout`; [`NOTICE_HTTP_MAX_S`], GCP's long poll 35 s)
      and in bytes (64 KiB of headers and of body: `head -c` after curl,
      `ulimit -f` around wget); an answer cut short by either bound, or by a broken
      connection, counts as no answer. Answers are only matched with `case` and
      `sed` (in the C locale), never evaluated; a token or ETag is used only when
      made of the characters such values have; the values written are cut to 64
      printable ASCII characters and JSON-escaped.

    On a notice (the job still running): writes `notice.json` (a temporary name
    unique to the writer, renamed), then `snapshot.request` holding `preempted`
    only when no request exists (a complete temporary file hard-linked into place,
    as the watchdog does: the first reason is kept). Then the watcher ends: the job
    answers the request and ends, and the first notice is the one that mattered.

    End: the supervisor checks every `poll_s` that the job still runs (no
    `exit_code` nor `cancelled`, the run directory there, a process left in the
    job's group: `kill -0`, as status decides "running", and, with the start time
    given, a leader that started then: a reused pid is not the job) and whether a loop
    recorded a notice; then (about 0.1 s) it ends its loops and their requests
    under way (their pids are recorded in its scratch directory, renamed first so
    that no request starts after), removes the scratch directory (`$TMPDIR` or
    `/tmp`, `rw-notice.<pid>.<random>`, mode 700, created fresh: when it cannot be,
    the state says so and the exit is 5), writes `done: the job ended` or
    `done: recorded the <source> notice` to the state, and exits 0. SIGTERM, SIGINT
    and SIGHUP end it the same way (exit 0, `done: stopped by a signal`).
    Killed with SIGKILL, its loops end by themselves within a poll (GCP: within
    its 35 s long poll) and its scratch directory stays.

    `base_urls` maps `aws`, `gcp`, `azure` to `http://host[:port]` (the others keep
    [`DEFAULT_BASE_URLS`]).

    Raises:
        InvalidArgument: for a provider outside `aws`, `gcp`, `azure`, `auto`, a
            base URL that is not `http://host[:port]`, an unknown cloud in
            `base_urls`, a `poll_s` that is not finite, above 0 and at most
            3600 s, or a `dir` holding a NUL byte.
    """
    if provider not in get_args(Provider):
        raise InvalidArgument(f"provider {str(provider)[:40]!r} is not aws, gcp, azure or auto")
    if not math.isfinite(poll_s) or not 0 < poll_s <= _MAX_POLL_S:
        raise InvalidArgument("poll_s is a number of seconds above 0 and at most 3600")
    urls = _base_urls(base_urls)
    poll_ms = max(_MIN_POLL_MS, round(poll_s * 1000))
    args = (dir, provider, urls["aws"], urls["gcp"], urls["azure"], str(poll_ms))
    return Script(sh("group", "clock", "notice_watch"), (*args, _secrets.token_hex(6)))


@dataclass(frozen=True)
class Notice:
    """What `notice.json` holds."""

    source: str
    """One of [`NOTICE_SOURCES`]."""
    seen_at: float | None
    """When the watcher saw it, in Unix seconds (ms precision where the target's
    `date` has `%N`); None when the target's clock could not be read."""
    not_after: str | None
    """The notice's own time, as the cloud wrote it (AWS `time`, ISO 8601; Azure
    `NotBefore`, an HTTP date), at most 64 characters; None when the cloud gives none
    (GCP, AWS's rebalance). The service records it as ISO 8601 UTC."""
    detail: str | None
    """The cloud's raw action or event type, at most 64 characters."""


def parse_notice(data: bytes) -> Notice:
    """The [`Notice`] in the bytes of a `notice.json`.

    Raises:
        ProtocolError: for more than [`NOTICE_FILE_LIMIT`] bytes, bytes that are not
            one JSON object of the shape the watcher writes, or an unknown source.
    """
    if len(data) > NOTICE_FILE_LIMIT:
        raise ProtocolError(f"notice.json holds {len(data)} bytes")
    try:
        value = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ProtocolError(f"notice.json is not JSON: {error}") from error
    if not isinstance(value, dict) or set(value) != {"source", "seen_at", "not_after", "detail"}:
        raise ProtocolError("notice.json is not a notice object")
    source, seen_at = value["source"], value["seen_at"]
    if source not in NOTICE_SOURCES:
        raise ProtocolError(f"notice.json names an unknown source {str(source)[:40]!r}")
    if seen_at is not None and (isinstance(seen_at, bool) or not isinstance(seen_at, int | float)):
        raise ProtocolError("notice.json seen_at is not a number")
    for name in ("not_after", "detail"):
        field = value[name]
        if field is not None and (not isinstance(field, str) or len(field) > _FIELD_LIMIT):
            raise ProtocolError(f"notice.json {name} is not a short string")
    return Notice(
        source,
        None if seen_at is None else float(seen_at),
        value["not_after"],
        value["detail"],
    )


@dataclass(frozen=True)
class NoticeState:
    """What `notice.state` says."""

    kind: Literal["watching", "unavailable", "done"]
    text: str
    """The rest of the line: the clouds and client, why it is unavailable, or how
    it ended."""


def parse_notice_state(data: bytes) -> NoticeState:
    """The [`NoticeState`] of the bytes of a `notice.state` (its first line, at most
    200 characters, read).

    Raises:
        ProtocolError: for a line that starts with none of `watching `,
            `unavailable: `, `done: `.
    """
    line = data[:200].decode("utf-8", "replace").split("\n", 1)[0]
    kinds: tuple[tuple[str, Literal["watching", "unavailable", "done"]], ...] = (
        ("watching ", "watching"),
        ("unavailable: ", "unavailable"),
        ("done: ", "done"),
    )
    for prefix, kind in kinds:
        if line.startswith(prefix):
            return NoticeState(kind, line[len(prefix) :])
    raise ProtocolError(f"notice.state says {line[:80]!r}")
