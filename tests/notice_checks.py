"""What the notice watcher's integration tests check, shared by its test modules:
the fixed figures (poll period, clouds, sources, client names), which environments
can watch which cloud, and checks of the watcher's end and of its requests."""

from __future__ import annotations

from bench.harness.fakecloud import FakeCloud
from bench.harness.notice_env import ENVS, Env, Watched, none_naming, wait_until

__all__ = [
    "CLIENT_NAMES",
    "CLOUDS",
    "DASH_CURL",
    "POLL_S",
    "SEEN_S",
    "SOME_ENVS",
    "SOURCES",
    "WATCHABLE",
    "WATCHED_PATH",
    "answered_as_documented",
    "polling",
    "settled",
]

POLL_S = 0.3
SEEN_S = 2 * POLL_S + 3
"""Longest wait for a notice to be acted on (`snapshot.request`, the notice file): a
poll and the request's own time, which a loaded machine stretches (each poll runs
the client and the parsing as processes: a CI run had a busybox-curl poll past 1.3 s)."""
CLOUDS = ("aws", "gcp", "azure")
CLIENT_NAMES = {"curl": "curl", "wget": "GNU wget", "busybox-wget": "busybox wget"}
SOURCES = {"aws": "aws-spot", "gcp": "gcp-preempted", "azure": "azure-preempt"}
# busybox wget cannot PUT: AWS is unavailable with it (tested apart).
WATCHABLE = [
    (env, cloud)
    for env in ENVS
    if env.client != "none"
    for cloud in CLOUDS
    if not (env.client == "busybox-wget" and cloud == "aws")
]
DASH_CURL = Env("dash", "curl")
SOME_ENVS = [DASH_CURL, Env("busybox", "curl"), Env("dash", "wget"), Env("busybox", "busybox-wget")]


def settled(watch: Watched, fake: FakeCloud) -> None:
    """The watcher is gone (exit 0) and left no process, scratch or temporary file."""
    assert watch.proc is not None
    watch.proc.wait(timeout=POLL_S + 2)
    assert watch.proc.returncode == 0, watch.proc.stderr.read() if watch.proc.stderr else ""
    # busybox's timeout leaves a watcher process for up to a second after a request.
    assert none_naming(fake.port, 2.5)
    assert not watch.scratch()
    names = [p.name for p in watch.dir.rglob("*")]
    assert not [n for n in names if "rw-tmp" in n or (n.startswith("notice.") and "." in n[7:])]


def polling(fake: FakeCloud, path: str, count: int = 2) -> None:
    """Waits for `count` answered requests to `path` (GCP: for a long poll under way
    there after an answered read)."""

    def enough() -> bool:
        seen = fake.seen(path)
        if fake.name == "gcp":
            return any(s.query.get("wait_for_change") and s.status is None for s in seen)
        return sum(s.status is not None for s in seen) >= count

    found = wait_until(enough, 10)
    assert found is not None, [(s.method, s.path, s.status) for s in fake.seen()]


WATCHED_PATH = {
    "aws": "/latest/meta-data/spot/instance-action",
    "gcp": "/computeMetadata/v1/instance/preempted",
    "azure": "/metadata/scheduledevents",
}


def answered_as_documented(fake: FakeCloud) -> None:
    """Every request the watcher made was one the service accepts."""
    allowed = {"aws": {200, 404}, "gcp": {200}, "azure": {200}}[fake.name]
    wrong = [(s.method, s.path, s.status) for s in fake.seen() if s.status not in (None, *allowed)]
    assert not wrong
