"""A job on a target: how to start it, its handle, and what it is doing.

JSON shapes of [`JobId`] and [`JobStatus`] match overbrainer's serde shapes (docs/protocol.md), so a
record written by overbrainer reads here and the other way round:
`{"dir": "/w/r1", "pid": 42, "container": null}`, and `"running"`,
`{"exited": 3}`, `"cancelled"`, `"lost"`.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, ClassVar, Final, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    StrictInt,
    field_validator,
    model_serializer,
    model_validator,
)

from .ids import Pid
from .preemption import WatchedCloud, check_metadata_url
from .protocol import check_run_cgroup

__all__ = [
    "ENV_NAME",
    "NO_PID",
    "SHELL_NAMES",
    "WATCHDOG_MAX_S",
    "Container",
    "JobCommand",
    "JobEnd",
    "JobId",
    "JobStatus",
    "check_absolute_path",
    "check_env_name",
    "check_secret_name",
    "check_secret_value",
    "parse_job_end",
]

ENV_NAME: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_CONTAINER_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")
WATCHDOG_MAX_S: Final = 1e9
"""Largest `deadline_request_after_s` and `watchdog_poll_s` (about 31 years): the
watchdog counts milliseconds in `sh` arithmetic."""


def check_absolute_path(path: str) -> str:
    """Returns `path` when it is an absolute path without a NUL byte, else raises
    `ValueError`. Any other byte, newline and quote included, is valid in a path and
    is quoted wherever it reaches a shell."""
    if not path.startswith("/"):
        raise ValueError(f"not an absolute path: {path[:200]!r}")
    if "\0" in path:
        raise ValueError("a path cannot hold a NUL byte")
    return path


def check_env_name(name: str) -> str:
    """Returns `name` when it is an environment variable name (letters, digits and
    `_`, not starting with a digit, not empty), else raises `ValueError` naming it."""
    if ENV_NAME.fullmatch(name) is None:
        raise ValueError(f"{name[:80]!r} is not an environment variable name")
    return name


SHELL_NAMES: Final = frozenset({"IFS", "OLDPWD", "OPTIND", "PPID", "PWD"})
"""Variables that every POSIX shell on a job's way (the launcher, the job wrapper, the
job's own `sh -c`) sets by itself (`IFS`, `PPID`, `PWD`, and `OLDPWD` at each `cd`) or
refuses a value of (`OPTIND`): a secret of one of these names would never reach the
job as given."""


_JOB_ENV_PREFIX: Final = "RUNWARDEN_"
"""The prefix of the variables the service sets in a job's environment
(`schemas.protocol`: its run id, mark, request and metrics paths)."""


def check_secret_name(name: str) -> str:
    """Returns `name` when a secret may have it: an environment variable name
    ([`check_env_name`]) that no shell sets by itself (not in [`SHELL_NAMES`]) and not
    one of the service's own (`RUNWARDEN_*`); else raises `ValueError` naming it."""
    check_env_name(name)
    if name in SHELL_NAMES:
        raise ValueError(
            f"a secret cannot be named {name}: the shells that start the job set it themselves"
        )
    if name.startswith(_JOB_ENV_PREFIX):
        # Set last, it would replace the run's id or mark in its processes: a cancel
        # would no longer find them, or would take them for another run's.
        raise ValueError(
            f"a secret cannot be named {name}: {_JOB_ENV_PREFIX}* are the service's own "
            "variables of the job"
        )
    return name


def check_secret_value(name: str, value: str) -> None:
    """Raises `ValueError`, naming the variable and never the value, when `value` holds
    a line break or a NUL byte: a line break would end the `read` that feeds a remote
    job early, and a NUL byte cannot live in an environment; either would hand the job
    a different value."""
    if any(c in value for c in "\n\r\0"):
        raise ValueError(f"{name} cannot be passed to the job")


class Container(BaseModel):
    """A container running the job, stopped by cancel (`<engine> stop -t 30 <name>`)."""

    # Unknown fields are ignored, as serde does: a record from a newer tool reads.
    model_config = ConfigDict(frozen=True, extra="ignore")

    engine: Literal["docker", "podman"]
    name: str

    @field_validator("name")
    @classmethod
    def _name(cls, name: str) -> str:
        if _CONTAINER_NAME.fullmatch(name) is None:
            raise ValueError(f"invalid container name {name[:80]!r}")
        return name


NO_PID: Final = 2**22 + 1
"""The `JobId.pid` of a Slurm job: above Linux's `PID_MAX_LIMIT` (2^22), so no process
has it; a signal to it reaches nothing."""


class JobId(BaseModel):
    """Handle of a started job, enough to find it again from any process."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    dir: str
    """Run directory on the target, absolute."""
    pid: Pid
    """Pid of the job's session leader, also its process-group id. Never 0 or 1."""
    container: Container | None = None
    """The container the job runs in, if any."""
    start: Annotated[int, Field(strict=True, ge=0, lt=2**63)] | None = None
    """When the leader started, in clock ticks since the target's boot (field 22 of
    `/proc/<pid>/stat`), read by the launcher; None where the target has no `/proc`
    or the job was adopted. With it, a live process group whose leader started at
    another time is another job's (the pid was reused): never this job's, never
    signalled for it (docs/protocol.md, "Status")."""
    mark: Annotated[str, Field(pattern=r"^[a-z0-9][a-z0-9_.-]{0,63}$")] | None = None
    """The run's mark, in the environment of every process of the job
    (`schemas.protocol.mark_entry`: `RUNWARDEN_MARK`, or `RUNWARDEN_RUN_ID` for a run
    launched before marks): how cancel finds the processes that left the job's process
    group. None for a job started without it (adopted)."""
    cgroup: str | None = None
    """The run's cgroup v2 directory on the target (`JobCommand.cgroup`), which holds
    every process of the job, whatever session or environment it made itself: a
    cancel ends them all through it. None: the job is not contained (the target
    cannot create one, or the job was adopted)."""
    slurm: Annotated[int, Field(strict=True, gt=0, lt=2**32)] | None = None
    """The Slurm job id of a job submitted to a Slurm cluster (`workers.executors.slurm`),
    None for any other. Its processes are Slurm's to find and signal (the compute
    node's, not the login node's): `pid` is then [`NO_PID`], which no process has, so
    no process group of the login node is ever signalled for it."""

    @field_validator("dir")
    @classmethod
    def _dir(cls, value: str) -> str:
        return check_absolute_path(value)

    @field_validator("cgroup")
    @classmethod
    def _cgroup(cls, value: str | None) -> str | None:
        return None if value is None else check_run_cgroup(value)

    @model_serializer(mode="wrap")
    def _compact(self, handler: Any) -> Any:
        # Without them, the JSON is overbrainer's shape to the byte.
        data = handler(self)
        if isinstance(data, dict):
            for name in ("start", "mark", "cgroup", "slurm"):
                if data.get(name) is None:
                    data.pop(name, None)
        return data


class JobCommand(BaseModel):
    """A job to start in the background.

    `env` holds the job's own, non-secret variables (such as
    `RUNWARDEN_SNAPSHOT_REQUEST`); they may appear on a command line. `secrets` reach
    the job's environment only: never a command line, a file, a log or Redis. Both
    are set on top of the target's environment, secrets last.

    With `deadline_request_after_s`, spawn also starts the on-target watchdog beside
    the job (plain `sh`, in a session of its own, see
    `workers.executors.scripts.watchdog_script`): it asks for the `deadline` snapshot
    by itself, even when Redis and every worker are gone, and exits with the job.

    With `preemption`, spawn also starts the preemption-notice watcher beside the job
    (plain `sh`, in a session of its own, see
    `workers.executors.notices.notice_watch_script`): when the cloud announces the
    machine's end, it writes `notice.json` and asks for the `preempted` snapshot by
    itself, and exits with the job.
    """

    # A rejected secret must not appear in the error pydantic raises (it would be
    # logged, or stored as a task's failure).
    model_config = ConfigDict(frozen=True, extra="forbid", hide_input_in_errors=True)

    dir: str
    """Run directory on the target, absolute. The job runs there."""
    script: str = Field(min_length=1)
    """POSIX shell commands of the job."""
    env: dict[str, str] = Field(default_factory=dict)
    secrets: dict[str, SecretStr] = Field(default_factory=dict, repr=False)
    container: Container | None = None
    deadline_request_after_s: float | None = Field(
        default=None, gt=0, le=WATCHDOG_MAX_S, allow_inf_nan=False
    )
    """Seconds after the job starts (by the target's clock) at which the watchdog
    writes `snapshot.request` holding `deadline`, unless a request is already there
    (the first reason is kept). None: no watchdog."""
    watchdog_poll_s: float = Field(default=5.0, gt=0, le=WATCHDOG_MAX_S, allow_inf_nan=False)
    """How often the watchdog checks whether the job ended, in seconds (at least
    0.01 s is used): it exits within about this long of the job's end."""
    preemption: WatchedCloud | None = None
    """Whose preemption notices the watcher watches; None: no watcher."""
    metadata_urls: dict[str, str] = Field(default_factory=dict)
    """The metadata base URLs by cloud (`aws`, `gcp`, `azure`; `http://host[:port]`);
    a cloud left out is asked at its documented address."""
    notice_poll_s: float = Field(default=1.0, gt=0, le=3600, allow_inf_nan=False)
    """How often the watcher asks AWS and Azure and checks the job's end, in seconds
    (at least 0.1 s is used)."""
    wait_for_all: bool = False
    """When the job's main process ends: False, its leftover processes (its process
    group, every process carrying its mark) are ended (SIGTERM, SIGKILL after 10 s)
    before its exit code is written; True, the exit code is written only once none
    is left, and the job runs until then (docs/protocol.md, "Spawn")."""
    cgroup: str | None = None
    """A cgroup v2 directory (absolute, not existing yet) the launcher creates and
    enters before it starts the job, so every process of the job is in it; None: no
    cgroup (docs/protocol.md, "Containment")."""

    @field_validator("dir", "cgroup")
    @classmethod
    def _dir(cls, value: str | None) -> str | None:
        return None if value is None else check_absolute_path(value)

    @field_validator("script")
    @classmethod
    def _script(cls, value: str) -> str:
        if "\0" in value:
            raise ValueError("a job script cannot hold a NUL byte")
        return value

    @field_validator("env")
    @classmethod
    def _env(cls, env: dict[str, str]) -> dict[str, str]:
        for name, value in env.items():
            check_env_name(name)
            if "\0" in value:
                raise ValueError(f"{name} cannot hold a NUL byte")
        return env

    @field_validator("metadata_urls")
    @classmethod
    def _metadata_urls(cls, urls: dict[str, str]) -> dict[str, str]:
        for cloud in urls:
            if cloud not in ("aws", "gcp", "azure"):
                raise ValueError(f"no metadata service is named {cloud[:40]!r}")
        return {cloud: check_metadata_url(url) for cloud, url in urls.items()}

    @model_validator(mode="before")
    @classmethod
    def _wrap_secrets(cls, data: Any) -> Any:
        # Pydantic attaches a field's input to every error about that field; wrapping
        # each value in SecretStr before the field is validated makes that input
        # masked, so no error (message, JSON, input) can carry a raw secret. A value
        # that is not a string becomes one that fails the check below by name.
        if isinstance(data, dict) and isinstance(data.get("secrets"), dict):
            data = dict(data)
            data["secrets"] = {
                name: value
                if isinstance(value, SecretStr)
                else SecretStr(value if isinstance(value, str) else "\0")
                for name, value in data["secrets"].items()
            }
        return data

    @field_validator("secrets")
    @classmethod
    def _secrets(cls, secrets: dict[str, SecretStr]) -> dict[str, SecretStr]:
        for name, value in secrets.items():
            check_secret_name(name)
            check_secret_value(name, value.get_secret_value())
        return secrets


_Kind = Literal["running", "exited", "cancelled", "lost"]


class JobStatus(BaseModel):
    """What a job is doing: running, exited with a code, cancelled, or lost (neither
    running nor ended normally: killed without writing its exit code, or its run
    directory is gone)."""

    model_config = ConfigDict(frozen=True)

    kind: _Kind
    code: StrictInt | None = None

    RUNNING: ClassVar[JobStatus]
    CANCELLED: ClassVar[JobStatus]
    LOST: ClassVar[JobStatus]

    @classmethod
    def exited(cls, code: int) -> JobStatus:
        """Ended with exit code `code` (a signed 32-bit integer)."""
        return cls(kind="exited", code=code)

    @model_validator(mode="before")
    @classmethod
    def _from_serde(cls, data: Any) -> Any:
        if isinstance(data, str):
            if data == "exited":
                raise ValueError("an exited status carries its code: {\"exited\": N}")
            return {"kind": data}
        if isinstance(data, dict) and set(data) == {"exited"}:
            return {"kind": "exited", "code": data["exited"]}
        return data

    @model_validator(mode="after")
    def _code(self) -> JobStatus:
        if (self.kind == "exited") != (self.code is not None):
            raise ValueError("an exit code goes with the exited status, and only with it")
        if self.code is not None and not -(2**31) <= self.code < 2**31:
            raise ValueError(f"exit code {self.code} is out of range")
        return self

    @model_serializer
    def _to_serde(self) -> str | dict[str, int]:
        if self.kind == "exited":
            assert self.code is not None
            return {"exited": self.code}
        return self.kind

    @property
    def is_finished(self) -> bool:
        """Whether the job has stopped for good (anything but running)."""
        return self.kind != "running"

    def __str__(self) -> str:
        return f"exited({self.code})" if self.kind == "exited" else self.kind


JobStatus.RUNNING = JobStatus(kind="running")
JobStatus.CANCELLED = JobStatus(kind="cancelled")
JobStatus.LOST = JobStatus(kind="lost")


_END_COUNT: Final = re.compile(r"(leftovers|survived|waited) ([0-9]{1,9})")
_END_SIGNAL: Final = re.compile(r"signal ([A-Z][A-Z0-9]{0,15})")


class JobEnd(BaseModel):
    """What the job wrapper recorded about the end of the job's main process beyond its
    exit code (`.runwarden/ended`, written just before `exit_code`)."""

    model_config = ConfigDict(frozen=True)

    signal: str | None = None
    """The signal the exit code above 128 stands for, by the target's own numbering
    (`TERM`, `USR1`...), without the `SIG` prefix."""
    leftovers: int = Field(default=0, ge=0)
    """The run's processes still there when its main process ended, then ended."""
    survived: int = Field(default=0, ge=0)
    """Of those, how many were still there after SIGKILL when the wrapper gave up."""
    waited: int = Field(default=0, ge=0)
    """With `wait_for_all`: the processes the run waited for after its main process."""


def parse_job_end(content: bytes) -> JobEnd | None:
    """The [`JobEnd`] of the wrapper's `.runwarden/ended` (`content`, a bounded read):
    one `signal NAME` line and `leftovers|survived|waited N` lines; a line that is not
    one of these is skipped (the file is the job's to rewrite: it can only change the
    words of the run's message). None for empty content."""
    if not content.strip():
        return None
    found: dict[str, Any] = {}
    for raw in content.decode("ascii", "replace").splitlines():
        line = raw.strip()
        if (match := _END_SIGNAL.fullmatch(line)) is not None:
            found["signal"] = match[1]
        elif (match := _END_COUNT.fullmatch(line)) is not None:
            found[match[1]] = int(match[2])
    return JobEnd(**found)
