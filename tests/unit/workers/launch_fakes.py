"""A fake target for the launch logic's unit tests: run directories as a dict of files,
a spawn that writes `job.pid` as the launcher's wrapper does, and hooks to kill the
"worker" (raise `Killed`, a BaseException nothing in the launch catches, as SIGKILL
is caught by nothing) or break the connection at chosen points."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import fakeredis

from bench.harness.users import as_the_worker
from schemas import JobCommand, JobId, JobStatus, Settings, TargetConfig, UnknownTarget
from schemas.protocol import CANCEL_FILE, CANCELLING_FILE, CLAIM_FILE, EXIT_FILE, PID_FILE
from store import RunStore
from workers.context import Context
from workers.executors import SshError

T0 = datetime(2026, 3, 4, 5, 6, 7, tzinfo=UTC)


class Killed(BaseException):
    """The worker process died here."""


Hook = Callable[[], None]


@dataclass
class FakeExecutor:
    """A target whose files live in `files` (absolute path -> bytes)."""

    workdir: str = "/w"
    files: dict[str, bytes] = field(default_factory=dict)
    spawned: list[JobCommand] = field(default_factory=list)
    cancelled: list[JobId] = field(default_factory=list)
    uploads: list[tuple[str, tuple[str, ...]]] = field(default_factory=list)
    statuses: dict[int, JobStatus] = field(default_factory=dict)
    calls: list[str] = field(default_factory=list)
    unreachable: bool = False
    on_upload: Hook | None = None
    before_spawn: Hook | None = None
    after_spawn: Hook | None = None
    _pids: itertools.count[int] = field(default_factory=lambda: itertools.count(1000))

    def _reach(self, action: str) -> None:
        self.calls.append(action)
        if self.unreachable:
            raise SshError("connect", "the target cannot be reached")

    def claim(self, dir: str, owner: str) -> bool:
        self._reach("claim")
        path = f"{dir}/{CLAIM_FILE}"
        current = self.files.setdefault(path, owner.encode() + b"\n")
        return current == owner.encode() + b"\n"

    def upload(self, local: Path, remote: str, skip: Sequence[str] = ()) -> None:
        self._reach("upload")
        self.uploads.append((remote, tuple(skip)))
        for entry in sorted(local.iterdir()):
            if entry.name not in skip and entry.is_file():
                self.files[f"{remote}/{entry.name}"] = entry.read_bytes()
        if self.on_upload is not None:
            self.on_upload()

    def spawn(self, job: JobCommand) -> JobId:
        self._reach("spawn")
        for name in (EXIT_FILE, CANCEL_FILE, CANCELLING_FILE, PID_FILE):
            self.files.pop(f"{job.dir}/{name}", None)
        if self.before_spawn is not None:
            self.before_spawn()
        pid = next(self._pids)
        self.files[f"{job.dir}/{PID_FILE}"] = f"{pid}\n".encode()
        self.spawned.append(job)
        if self.after_spawn is not None:
            self.after_spawn()
        return JobId(dir=job.dir, pid=pid)

    def read_from(self, path: str, offset: int, limit: int) -> bytes:
        self._reach("read")
        return self.files.get(path, b"")[offset : offset + limit]

    def status(self, job: JobId) -> JobStatus:
        self._reach("status")
        return self.statuses.get(job.pid, JobStatus.RUNNING)

    def cancel(self, job: JobId) -> None:
        self._reach("cancel")
        self.cancelled.append(job)
        self.statuses[job.pid] = JobStatus.CANCELLED

    def release(self, job: JobId) -> None:
        self._reach("release")

    def find_marked(self, mark: str) -> tuple[int, int] | None:
        """No process table here: a job is found by its `job.pid` alone."""
        self._reach("probe")
        return None

    def pid_of(self, run_dir: str) -> int | None:
        raw = self.files.get(f"{run_dir}/{PID_FILE}")
        return None if raw is None else int(raw)


def fake_context(executor: FakeExecutor, **settings: float) -> Context:
    """A worker's context on fakeredis whose only target, `local`, is `executor`."""
    store = RunStore(fakeredis.FakeRedis(server=fakeredis.FakeServer()))
    values = {"launch_max_runtime_s": 60.0, "launch_grace_s": 30.0, **settings}
    ctx = Context(store, Settings(**values), lambda name, kwargs, countdown: None, "w")  # type: ignore[arg-type]

    def executor_for(config: TargetConfig) -> FakeExecutor:
        if config.name != "local":
            raise UnknownTarget(config.name)
        return executor

    def target_for(target: str) -> TargetConfig:
        if target != "local":
            raise UnknownTarget(target)
        # Its workdir is the fake executor's; every upload root is allowed here.
        return TargetConfig(
            name="local", kind="local", workdir="/w", upload_roots=("/",), **as_the_worker()
        )

    ctx.executor_for = executor_for  # type: ignore[method-assign,assignment]
    ctx.target = target_for  # type: ignore[method-assign]
    return ctx
