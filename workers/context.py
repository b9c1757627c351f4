"""The context every run operation shares: the run store, the settings, how to send a
task (now or after a countdown), and this process's own state: the executor of each
target (built once per target and process, rebuilt when the target's configuration
changes; an SSH executor's connection is per process anyway) and the webhook
delivery (the configured webhooks, the delivery threads).

The operations (`workers.launch`, `.stops`, `.finish`, `.artifacts`, `.watch`,
`.policies`) are functions of a `Context`; `workers.tasks` builds one per process and
is the Celery edge around them. Every operation re-reads the state it acts on and
changes it by compare-and-set, so a duplicate, late or concurrent call changes
nothing more.
"""

from __future__ import annotations

import functools
import logging
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from redis.exceptions import RedisError

from schemas import NotFound, RunRecord, Settings, StoreError, TargetConfig, UnknownTarget
from schemas.metrics import SCRIPT_TIMEOUTS, Sample
from schemas.targets import SlurmOptions, SshOptions
from store import RunStore

from .executors import Executor, InvalidArgument, LocalExecutor, RunAsExecutor, ScriptExecutor
from .executors.local import job_environment
from .executors.transport import LocalTransport
from .identity import Identities
from .target_versions import TargetVersions
from .webhooks import WebhookDelivery

__all__ = ["Context", "Scheduler", "build_executor", "utcnow"]

log = logging.getLogger("runwarden")

Scheduler = Callable[[str, dict[str, Any], float], None]
"""Sends task `name` with keyword arguments `kwargs` (a body in `kwargs["body"]`)
after a countdown in seconds (0: now). May raise: the durable tables in the store
(deadlines, retrievals) make every send that matters retried by `reconcile`."""


@dataclass
class Context:
    """What the run operations of one worker process share."""

    store: RunStore
    settings: Settings
    schedule: Scheduler
    worker_id: str = field(default="")
    """Names this process in deadline leases; default `<host>:<pid>`."""
    identities: Identities = field(init=False)
    """The producers' keys: who sent a message, who signed a target."""
    webhooks: WebhookDelivery = field(init=False)
    """This process's webhook delivery: the configured webhooks, the threads."""
    proofs_read: dict[str, tuple[str, float]] = field(default_factory=dict, init=False)
    """Run id -> the signature of the proof this process's follow ticks last read of
    it and when (monotonic seconds), while its stop waits for a proof
    (`workers.watch`)."""
    _executors: dict[str, tuple[TargetConfig, Executor]] = field(
        default_factory=dict, init=False, repr=False
    )
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)

    def __post_init__(self) -> None:
        self.worker_id = self.worker_id or f"{os.uname().nodename}:{os.getpid()}"
        self.identities = Identities(self.settings)
        self.target_versions = TargetVersions(self.settings.state_dir)
        self.webhooks = WebhookDelivery(self.store, self.settings)

    def executor(self, target: str) -> Executor:
        """The executor of target `target` for this process (built once, rebuilt when
        the target's configuration changes).

        Raises:
            UnknownTarget, Unauthenticated, StoreError, InvalidArgument.
        """
        return self.executor_for(self.target(target))

    def executor_for(self, config: TargetConfig) -> Executor:
        """The executor of the target `config` (already read and checked, as
        [`target`] returns it) for this process: built once, rebuilt when the
        configuration changes.

        Raises:
            InvalidArgument: the configuration cannot make an executor here.
        """
        with self._lock:
            cached = self._executors.get(config.name)
            if cached is not None and cached[0] == config:
                return cached[1]
            executor = build_executor(config)
            if isinstance(executor, ScriptExecutor):
                executor.transport.on_timeout = functools.partial(self._count_timeout, config.name)
            self._executors[config.name] = (config, executor)
            return executor

    def _count_timeout(self, target: str, action: str) -> None:
        """Counts a script of `target` ended at its deadline
        (`runwarden_script_timeouts_total`) and logs it. Never raises: a lost count
        never changes what the operation does next."""
        log.warning("target %s: a %s script passed its deadline and was ended", target, action)
        try:
            self.store.counters.add([Sample(SCRIPT_TIMEOUTS, (target, action), 1)])
        except StoreError:
            log.warning("target %s: cannot count the %s script's timeout", target, action)

    def target(self, name: str) -> TargetConfig:
        """The configuration of target `name`, signed by the operator.

        Raises:
            UnknownTarget: when there is no such target (or only its tombstone).
            Unauthenticated: when the record is not signed by the operator (written
                into Redis by anyone else), or is older than one this machine saw
                (written back), or the versions seen cannot be recorded: it is never
                used.
            StoreError: when the store cannot be read.
        """
        record = self.store.targets.get_signed(name)
        self.target_versions.check(name, self.identities.check_target(name, record))
        if record.config is None:
            raise UnknownTarget(name)  # its signed tombstone: removed
        return TargetConfig.model_validate(record.config)

    def send(self, task: str, run_id: str) -> None:
        """Sends `task` for `run_id` now (body `{"run_id": ...}`). A failure to send is
        logged only: every task sent so is queued durably in the store (a retrieval, a
        continuation), and `reconcile` sends it again."""
        try:
            self.schedule(task, {"body": {"run_id": run_id}}, 0.0)
        except Exception:  # noqa: BLE001 - reconcile sends it from the store's queue
            log.warning("run %s: cannot send the task %s", run_id, task)

    def records(self, run_ids: list[str]) -> list[RunRecord | None]:
        """The records of `run_ids` in one round trip; one that is gone, or stored
        unreadable (a value that does not parse), is logged and read as missing (it
        must not stop the others).

        Raises:
            StoreError: Redis itself failed (out of reach, a restart): never read as
                missing, which would stop following runs that are fine.
        """
        try:
            return self.store.runs.get_many(run_ids)
        except StoreError as error:
            if isinstance(error.__cause__, RedisError):
                raise
            found: list[RunRecord | None] = []
            for run_id in run_ids:
                try:
                    found.append(self.store.runs.get(run_id))
                except StoreError as one:
                    if isinstance(one.__cause__, RedisError):
                        raise
                    log.exception("run %s: unreadable; no longer followed", run_id)
                    found.append(None)
                except NotFound:
                    log.warning("run %s: no record; no longer followed", run_id)
                    found.append(None)
            return found


def build_executor(config: TargetConfig) -> Executor:
    """A new executor for `config` (nothing is opened yet): a local target with
    `run_as` runs its jobs as that user (`RunAsExecutor`), but `run_as: root` as this
    process, which must be root; an SSH target with `run_as` through `sudo -n` on the
    target (`SshExecutor`).

    Raises:
        InvalidArgument: for an SSH destination or config that cannot be used, or a
            `run_as` user this machine does not have or cannot change to.
    """
    if config.slurm is not None:
        return _slurm_executor(config, config.slurm)
    if config.kind == "local" or config.ssh is None:
        if config.jobs_as_root:
            if os.geteuid() != 0:
                raise InvalidArgument("run_as root needs a worker that is root")
            return LocalExecutor(config.workdir)
        if config.run_as is not None:
            return RunAsExecutor(config.workdir, config.run_as)
        return LocalExecutor(config.workdir)
    return _ssh_executor(config, config.ssh, config.run_as)


def _ssh_executor(config: TargetConfig, ssh: SshOptions, run_as: str | None) -> ScriptExecutor:
    """An SSH executor of `config`'s workdir at `ssh` (nothing opened yet), its jobs as
    `run_as` through `sudo -n` (None: the login user)."""
    from .executors import SshExecutor  # noqa: PLC0415 - paramiko only when needed

    return SshExecutor.connect(
        ssh.destination,
        config.workdir,
        port=ssh.port,
        identity=Path(ssh.identity) if ssh.identity else None,
        known_hosts=Path(ssh.known_hosts) if ssh.known_hosts else None,
        ssh_config=Path(ssh.ssh_config) if ssh.ssh_config else None,
        run_as=run_as,
    )


def _slurm_executor(config: TargetConfig, options: SlurmOptions) -> Executor:
    """The executor of a Slurm target: `sbatch` and the scripts on its login node, this
    machine (as this process's user, the job's environment this process's less its
    own variables) or the SSH destination (as its login user)."""
    from .executors.slurm import SlurmExecutor  # noqa: PLC0415 - only with Slurm targets

    if config.kind == "local" or config.ssh is None:
        if os.geteuid() == 0 and not config.jobs_as_root:
            raise InvalidArgument(
                "this worker is root: a local Slurm target's jobs would run as root; say so"
                " with run_as root"
            )
        transport = LocalTransport(env=job_environment(os.environ))
        return SlurmExecutor(transport, config.workdir, options)
    login = _ssh_executor(config, config.ssh, None)
    return SlurmExecutor(login.transport, config.workdir, options)


def utcnow() -> datetime:
    """The current time, timezone-aware UTC."""
    return datetime.now(UTC)
