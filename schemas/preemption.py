"""Cloud preemption notices: which cloud a run watches, the metadata services' base
URLs, and what a run's record keeps of the watch (the watcher's state, the notice).

The watcher itself is a plain `sh` script on the target
(`workers/executors/notices.py`); when the cloud announces that the machine goes
away, it writes `notice.json` and asks the job for its `preempted` snapshot. These
are the shapes the service keeps of that: pure, no I/O.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from email.utils import parsedate_to_datetime
from typing import Annotated, Final, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from .stops import UtcDatetime

__all__ = [
    "DEFAULT_METADATA_URLS",
    "DOCUMENTED_LEAD_S",
    "METADATA_URL",
    "NO_CLIENT",
    "NoticeSource",
    "Preemption",
    "PreemptionMode",
    "RunNotice",
    "WatchedCloud",
    "WatcherState",
    "check_metadata_url",
    "derived_not_after",
    "iso_utc",
    "notice_left_s",
    "parse_not_after",
    "short_notice",
    "watched_cloud",
]

PreemptionMode = Literal["aws", "gcp", "azure", "auto", "off"]
"""What a run (`LaunchSpec.preemption`) or a target (`TargetConfig.preemption`) asks:
a cloud's notices, `auto` (the watcher probes each and watches those that answer),
or `off` (no watcher)."""
WatchedCloud = Literal["aws", "gcp", "azure", "auto"]
"""A mode that starts a watcher: every [`PreemptionMode`] but `off`."""
NoticeSource = Literal[
    "aws-spot", "aws-rebalance", "gcp-preempted", "gcp-maintenance", "azure-preempt"
]
"""Where a notice came from (`workers/executors/notices.py` says what each means):

- `aws-spot`: AWS's Spot interruption notice (IMDSv2 `spot/instance-action`): the
  instance is stopped, hibernated or terminated at its `time`, two minutes on;
- `aws-rebalance`: AWS's rebalance recommendation (`events/recommendations/
  rebalance`): the instance is at an elevated risk of interruption, often earlier
  than the spot notice; no time is given;
- `gcp-preempted`: GCP's `instance/preempted` turned `TRUE`: the Spot or preemptible
  VM is being preempted (30 s until it is powered off);
- `gcp-maintenance`: GCP's `instance/maintenance-event` turned
  `TERMINATE_ON_HOST_MAINTENANCE`: the host's maintenance stops the VM (60 s on);
- `azure-preempt`: an Azure Scheduled Event of type `Preempt` (Spot VM eviction),
  not before its `NotBefore`, at least 30 s on.
"""
DOCUMENTED_LEAD_S: Final[dict[str, float]] = {"gcp-preempted": 30.0, "gcp-maintenance": 60.0}
"""Seconds from a notice to the machine's stop as the cloud documents it, for the
sources whose notice carries no time: GCP powers a Spot VM off 30 s after its
preemption notice (Compute Engine, "Spot VMs", preemption process; the API's
`Scheduling.skipGuestOsShutdown`: "30 seconds for Spot VMs"), and changes
`maintenance-event` 60 s before the maintenance (Compute Engine, "Query metadata
server for maintenance event notices"). The not-after of such a notice is derived:
when it was seen plus this."""

DEFAULT_METADATA_URLS: Final = {
    "aws": "http://169.254.169.254",
    "gcp": "http://metadata.google.internal",
    "azure": "http://169.254.169.254",
}
"""Each cloud's documented metadata service (the settings' defaults)."""
METADATA_URL: Final = re.compile(r"http://(?:[A-Za-z0-9.-]+|\[[0-9A-Fa-f:.]+\])(?::[0-9]{1,5})?")
"""What a metadata base URL may be: `http://host[:port]`, nothing more (it reaches a
shell on the target, quoted; no path, no credentials, no query)."""
NO_CLIENT: Final = "preemption notices cannot be watched: no curl or wget on the target"
"""What `show` says when the watcher found no HTTP client."""
_NO_CLIENT_STATE: Final = "neither curl nor wget is installed"
_TEXT_LIMIT: Final = 200


def check_metadata_url(url: str) -> str:
    """`url` without a trailing `/` when it is `http://host[:port]`, else `ValueError`
    quoting (the start of) it."""
    bare = url[:-1] if url.endswith("/") else url
    if METADATA_URL.fullmatch(bare) is None:
        raise ValueError(f"the metadata URL {url[:80]!r} is not http://host[:port]")
    return bare


def watched_cloud(
    run: PreemptionMode | None, target: PreemptionMode
) -> WatchedCloud | None:
    """What a run watches: its own mode when it gave one (`off` included), else its
    target's; None for `off`."""
    mode = target if run is None else run
    return None if mode == "off" else mode


class WatcherState(BaseModel):
    """The notice watcher's last state line (`.runwarden/notice.state`)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: Literal["watching", "unavailable", "done"]
    text: Annotated[str, Field(max_length=_TEXT_LIMIT)]
    """The rest of the line: `aws with curl`, why it is unavailable, how it ended."""

    def said(self, *, ended: bool = False) -> str:
        """The state for people; `ended`: the run has ended (a watcher last seen
        watching then watched until the end)."""
        if self.kind == "unavailable":
            if self.text.startswith(_NO_CLIENT_STATE):
                return NO_CLIENT
            return f"preemption notices cannot be watched: {self.text}"
        if self.kind == "done":
            return f"the watcher ended: {self.text}"
        return f"watched {self.text} until the run ended" if ended else f"watching {self.text}"


class RunNotice(BaseModel):
    """A cloud's preemption notice as the run record keeps it."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    source: NoticeSource
    seen_at: UtcDatetime | None = None
    """When the watcher saw it, by the target's clock; None when that clock could not
    be read."""
    not_after: Annotated[str, Field(max_length=64)] | None = None
    """When the machine goes away at the earliest, ISO 8601 UTC
    (`2026-03-04T05:08:07Z`, [`iso_utc`]): the cloud's own time (AWS `time`, ISO;
    Azure `NotBefore`, an HTTP date), or, for GCP, derived from when it was seen
    ([`DOCUMENTED_LEAD_S`], `not_after_derived`); None when there is none (AWS's
    rebalance) or the cloud's text is no time. A record that holds another form
    reads normalised."""
    not_after_derived: bool = False
    """`not_after` is the notice's time plus what its cloud documents, not the
    cloud's own figure."""
    detail: Annotated[str, Field(max_length=64)] | None = None
    recorded_at: UtcDatetime
    """When the service recorded it."""
    left_s: float | None = None
    """Seconds from `seen_at` (else `recorded_at`) to `not_after`, when that parses."""
    short: bool = False
    """The notice leaves less time than the proof timeout of its stop."""
    note: Annotated[str, Field(max_length=500)] | None = None
    """For people: what was done about a short notice."""

    @field_validator("not_after")
    @classmethod
    def _iso(cls, value: str | None) -> str | None:
        when = parse_not_after(value)
        return None if when is None else iso_utc(when)

    def said(self) -> str:
        """One line for people: `aws-spot (terminate), seen 2026-03-04 05:06:07 UTC,
        not after 2026-03-04T05:08:07Z[ (derived: ...)][; <note>]`."""
        text = self.source + (f" ({self.detail})" if self.detail else "")
        seen = self.seen_at or self.recorded_at
        text += f", seen {seen:%Y-%m-%d %H:%M:%S} UTC"
        if self.not_after:
            text += f", not after {self.not_after}"
            lead = DOCUMENTED_LEAD_S.get(self.source)
            if self.not_after_derived and lead is not None:
                text += f" (derived: the {lead:g} s its cloud documents)"
        return f"{text}; {self.note}" if self.note else text


class Preemption(BaseModel):
    """The preemption watch of a run (`RunRecord.preemption`)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    cloud: WatchedCloud | None = None
    """What the watcher was started for; None: not started by runwarden (an adopted
    run whose directory holds a watcher's files)."""
    watcher: WatcherState | None = None
    """The watcher's last state line seen by the follow; None before it wrote one."""
    notice: RunNotice | None = None
    """The first notice seen; None while none came."""

    def said(self, *, ended: bool = False) -> str:
        """One line for people: the cloud and the watcher's state."""
        cloud = self.cloud or "started elsewhere"
        if self.watcher is None:
            return f"{cloud}: no word from the watcher yet"
        return f"{cloud}: {self.watcher.said(ended=ended)}"


def parse_not_after(text: str | None) -> datetime | None:
    """The time of a notice's `not_after`: ISO 8601 (AWS, `2026-03-04T05:06:07Z`) or
    RFC 1123 (Azure, `Wed, 04 Mar 2026 05:06:07 GMT`), as UTC; None for anything else
    (never raises: the text comes from the cloud through the target)."""
    if not text:
        return None
    try:
        when = datetime.fromisoformat(text)
    except ValueError:
        try:
            when = parsedate_to_datetime(text)
        except (TypeError, ValueError, IndexError):
            return None
    return when.replace(tzinfo=UTC) if when.tzinfo is None else when.astimezone(UTC)


def iso_utc(when: datetime) -> str:
    """`when` as ISO 8601 UTC with a `Z`, to the second (milliseconds when it has
    them): `2026-03-04T05:06:07Z`, `2026-03-04T05:06:07.250Z`."""
    when = when.replace(tzinfo=UTC) if when.tzinfo is None else when.astimezone(UTC)
    text = when.strftime("%Y-%m-%dT%H:%M:%S")
    if when.microsecond:
        text += f".{when.microsecond // 1000:03d}"
    return text + "Z"


def derived_not_after(source: str, seen: datetime) -> str | None:
    """The not-after of a `source` notice seen at `seen` that carries no time: `seen`
    plus what its cloud documents ([`DOCUMENTED_LEAD_S`]), ISO 8601 UTC; None for a
    source with no documented figure."""
    lead = DOCUMENTED_LEAD_S.get(source)
    return None if lead is None else iso_utc(seen + timedelta(seconds=lead))


def notice_left_s(notice: RunNotice) -> float | None:
    """Seconds from when the notice was seen (else recorded) to its `not_after`;
    None when it has none that parses."""
    until = parse_not_after(notice.not_after)
    if until is None:
        return None
    return (until - (notice.seen_at or notice.recorded_at)).total_seconds()


def short_notice(notice: RunNotice, proof_timeout_s: float) -> RunNotice:
    """`notice` with `left_s`, and, when that is less than `proof_timeout_s` (the
    proof timeout of the stop it opened), `short` and a note saying so."""
    left = notice_left_s(notice)
    if left is None or left >= proof_timeout_s:
        return notice.model_copy(update={"left_s": left})
    note = (
        f"the {notice.source} notice leaves {max(left, 0.0):.0f} s, less than the proof"
        f" timeout ({proof_timeout_s:g} s): the snapshot was asked at once"
    )
    return notice.model_copy(update={"left_s": left, "short": True, "note": note})

