"""Targets: where runs go. A target is this machine (`local`) or an SSH destination,
with the directory holding its run directories, and, for a local target, the user its
jobs run as. Never holds a secret: SSH keys are referenced by path, and the agent is
used when it holds them."""

from __future__ import annotations

import re
from typing import Annotated, Final, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from .auth import OPERATOR, WORKER
from .job import check_absolute_path, check_env_name
from .preemption import PreemptionMode
from .secrets import PRODUCER_NAME

__all__ = [
    "RUN_AS_ROOT",
    "SLURM_RESERVED_OPTIONS",
    "TARGET_NAME",
    "SlurmOptions",
    "SshOptions",
    "TargetConfig",
    "TargetName",
    "check_user_name",
]

RUN_AS_ROOT: Final = "root"
"""`run_as` of a local target whose jobs a worker that is root runs as root: said
explicitly, never the default (`workers.permits.check_launch`)."""

TARGET_NAME: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
"""What a target's name is (`fullmatch`)."""
TargetName = Annotated[str, Field(pattern=rf"^{TARGET_NAME.pattern}$")]

_USER_NAME: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]{0,31}")


def check_user_name(name: str) -> str:
    """Returns `name` when it can name the user a local target's jobs run as, else
    raises `ValueError` saying why.

    A name is 1 to 32 characters: a letter or `_`, then letters, digits, `_`, `.` and
    `-` (what `useradd` accepts, less the forms other tools read differently: a
    leading `-` is an option, a leading digit or `#` a uid, a trailing `$` a machine
    account). `root` is refused: a job run as root can read everything the worker
    has, which is what running it as another user is for (`TargetConfig.run_as`
    takes `root` apart, as the operator's word that a root worker may run the
    target's jobs as itself: [`RUN_AS_ROOT`])."""
    if _USER_NAME.fullmatch(name) is None:
        raise ValueError(
            f"{name[:40]!r} is not a user name (a letter or _, then letters, digits, _ . -;"
            " at most 32)"
        )
    if name == "root":
        raise ValueError("run_as root protects nothing: name an unprivileged user")
    return name


class SshOptions(BaseModel):
    """How to reach an SSH target: `user@host[:port]` or an ssh config alias, and
    optional paths (on the worker) of the identity, known_hosts and ssh config."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    destination: str = Field(min_length=1, max_length=300)
    port: Annotated[int, Field(gt=0, lt=65536)] | None = None
    identity: str | None = None
    known_hosts: str | None = None
    ssh_config: str | None = None


_SLURM_NAME: Final = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}")
_SBATCH_OPTION: Final = re.compile(r"--([a-z][a-z0-9-]{0,63})(?:=([^\x00\n\r]{0,512}))?")
SLURM_RESERVED_OPTIONS: Final = frozenset({
    "export", "export-file", "get-user-env", "signal", "chdir", "output", "error",
    "input", "open-mode", "parsable", "wrap", "uid", "gid", "requeue", "no-requeue",
    "array", "test-only", "wait", "hold", "job-name", "partition", "account",
})  # fmt: skip
"""`sbatch` options runwarden sets itself (`workers.executors.slurm`), refused in
`SlurmOptions.sbatch_args`: the job's environment, signal, directory, output and
requeueing are the protocol's."""


class SlurmOptions(BaseModel):
    """How a Slurm target's jobs are submitted: `partition` and `account` (`sbatch
    --partition/--account`; none: the cluster's defaults), more `sbatch` options in
    the long `--name[=value]` form (`--time=2:00:00`, `--gres=gpu:4`, `--qos=high`;
    not one of [`SLURM_RESERVED_OPTIONS`]), and `signal_lead_s`: how long before the
    time limit Slurm warns the job (`--signal=B:USR1@<lead>`, a `deadline` request;
    Slurm may send it up to 60 s earlier)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    partition: str | None = None
    account: str | None = None
    sbatch_args: tuple[str, ...] = ()
    signal_lead_s: Annotated[int, Field(strict=True, ge=1, le=65535)] = 300

    @field_validator("partition", "account")
    @classmethod
    def _name(cls, value: str | None) -> str | None:
        if value is not None and _SLURM_NAME.fullmatch(value) is None:
            raise ValueError(f"{value[:40]!r} is not a Slurm partition or account name")
        return value

    @field_validator("sbatch_args")
    @classmethod
    def _args(cls, args: tuple[str, ...]) -> tuple[str, ...]:
        for arg in args:
            found = _SBATCH_OPTION.fullmatch(arg)
            if found is None:
                raise ValueError(
                    f"{arg[:60]!r} is not an sbatch option of the form --name or --name=value"
                )
            if found.group(1) in SLURM_RESERVED_OPTIONS:
                raise ValueError(f"--{found.group(1)} is set by runwarden on a Slurm target")
        return args


class TargetConfig(BaseModel):
    """A target as stored and shown: configuration the operator writes (signed, see
    `schemas.auth`), never something a message can create or change.

    `run_as` names the user the target's jobs run as, so a job cannot read the
    worker's environment, files or Redis socket (`workers/executors/runas.py`), nor
    fight the scripts of an SSH target's login user, its control user, who starts them
    through `sudo -n -u USER` (`workers/executors/ssh/transport.py`); `root` (local
    targets only) says the operator accepts that a worker that is root runs them as
    root, which it refuses otherwise (`workers.permits.check_launch`). Without it an
    SSH target's jobs run as its login user."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: TargetName
    kind: Literal["local", "ssh"]
    workdir: str
    ssh: SshOptions | None = None
    allow_secrets: tuple[str, ...] = ()
    """The names of the secrets a run on this target may receive; a launch naming any
    other is refused, and nothing is started."""
    producers: tuple[str, ...] | None = None
    """The producers (`runwarden producers add NAME`) whose stops, bulk stops, cancels
    and launches may act on this target's runs, besides the operator and the workers
    themselves, which always may; None: every producer (`targets add --producer
    NAME`, repeatable). Checked by the worker against the message's signature
    ([`allows_producer`])."""
    upload_roots: tuple[str, ...] = ()
    """Directories of the worker a launch may upload from (the upload path, resolved,
    must be one of them or below one); none: no upload is allowed."""
    run_as: str | None = None
    """The user the target's jobs run as (on an SSH target, through `sudo -n` by its
    login user); `root` (local targets only): as the worker, which must be root,
    accepted explicitly (`RUN_AS_ROOT`)."""
    preemption: PreemptionMode = "off"
    """Whose preemption notices the target's runs watch by default (a run's own
    `LaunchSpec.preemption` wins): the machine's cloud, `auto`, or `off`."""
    slurm: SlurmOptions | None = None
    """Set for a Slurm cluster: the jobs are submitted with `sbatch` from the login
    node (this machine for a local target, the SSH destination for an SSH one) and run
    where Slurm puts them, as the user who submits them; `workdir` must be on a
    filesystem the compute nodes share (`workers/executors/slurm.py`)."""

    @field_validator("workdir")
    @classmethod
    def _workdir(cls, value: str) -> str:
        return check_absolute_path(value).rstrip("/") or "/"

    @field_validator("allow_secrets")
    @classmethod
    def _secret_names(cls, names: tuple[str, ...]) -> tuple[str, ...]:
        for name in names:
            check_env_name(name)
        return tuple(sorted(set(names)))

    @field_validator("producers")
    @classmethod
    def _producer_names(cls, names: tuple[str, ...] | None) -> tuple[str, ...] | None:
        if names is None:
            return None
        for name in names:
            if PRODUCER_NAME.fullmatch(name) is None:
                raise ValueError(f"{name[:40]!r} is not a producer's name (a-z0-9-, 1-32)")
        return tuple(sorted(set(names)))

    def allows_producer(self, producer: str) -> bool:
        """Whether `producer` (a message's verified signer) may act on this target's
        runs: the operator and the workers always; another when the target names no
        producers or names it."""
        if producer in (OPERATOR, WORKER) or self.producers is None:
            return True
        return producer in self.producers

    @field_validator("upload_roots")
    @classmethod
    def _roots(cls, roots: tuple[str, ...]) -> tuple[str, ...]:
        return tuple(sorted({check_absolute_path(root).rstrip("/") or "/" for root in roots}))

    def refused_secrets(self, names: tuple[str, ...]) -> list[str]:
        """The names of `names` this target does not allow, sorted."""
        return sorted(set(names) - set(self.allow_secrets))

    @field_validator("run_as")
    @classmethod
    def _run_as(cls, value: str | None) -> str | None:
        if value is None or value == RUN_AS_ROOT:
            return value
        return check_user_name(value)

    @property
    def jobs_as_root(self) -> bool:
        """Whether the operator accepted that a worker that is root runs this local
        target's jobs as root (`run_as: root`)."""
        return self.run_as == RUN_AS_ROOT

    @model_validator(mode="after")
    def _ssh(self) -> TargetConfig:
        if (self.kind == "ssh") != (self.ssh is not None):
            raise ValueError("an ssh target needs its ssh options, and only it")
        if self.slurm is not None and self.preemption != "off":
            raise ValueError(
                "a Slurm target's jobs get Slurm's own notices (time limit, preemption),"
                " not a cloud's: preemption must be off"
            )
        if self.slurm is not None and self.run_as not in (None, RUN_AS_ROOT):
            raise ValueError(
                "a Slurm target's jobs run as the user who submits them (the worker's, or"
                " the SSH login user): run_as is not supported there"
            )
        if self.kind == "ssh" and self.run_as == RUN_AS_ROOT:
            raise ValueError(
                "run_as root is for local targets: an ssh target's jobs run as its login "
                "user, or as an unprivileged user of their own"
            )
        return self
