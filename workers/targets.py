"""Executors for targets, built from their stored configuration once the operator's
signature of it is checked: one per target and process (an SSH executor's connection
is per process anyway), rebuilt when the target's configuration changes."""

from __future__ import annotations

import os
import threading
from pathlib import Path

from schemas import TargetConfig
from store import RunStore

from .executors import Executor, LocalExecutor, RunAsExecutor, SshExecutor
from .identity import Identities

__all__ = ["build_executor", "executor_for", "target_config"]

_lock = threading.Lock()
_cache: dict[str, tuple[TargetConfig, Executor]] = {}
# A forked child (a Celery prefork child) builds its own executors.
os.register_at_fork(after_in_child=_cache.clear)


def build_executor(config: TargetConfig) -> Executor:
    """A new executor for `config` (nothing is opened yet): a local target with
    `run_as` runs its jobs as that user (`RunAsExecutor`).

    Raises:
        InvalidArgument: for an SSH destination or config that cannot be used, or a
            `run_as` user this machine does not have or cannot change to.
    """
    if config.kind == "local" or config.ssh is None:
        if config.run_as is not None:
            return RunAsExecutor(config.workdir, config.run_as)
        return LocalExecutor(config.workdir)
    ssh = config.ssh
    return SshExecutor.connect(
        ssh.destination,
        config.workdir,
        port=ssh.port,
        identity=Path(ssh.identity) if ssh.identity else None,
        known_hosts=Path(ssh.known_hosts) if ssh.known_hosts else None,
        ssh_config=Path(ssh.ssh_config) if ssh.ssh_config else None,
    )


def target_config(store: RunStore, name: str, identities: Identities) -> TargetConfig:
    """The configuration of target `name`, signed by the operator.

    Raises:
        UnknownTarget: when there is no such target.
        Unauthenticated: when the record is not signed by the operator (written into
            Redis by anyone else): it is never used.
        StoreError: when the store cannot be read.
    """
    raw, signature = store.get_target_signed(name)
    identities.check_target(name, raw, signature)
    return TargetConfig.model_validate(raw)


def executor_for(store: RunStore, name: str, identities: Identities) -> Executor:
    """The executor of target `name` for this process.

    Raises:
        UnknownTarget: when there is no such target.
        Unauthenticated: when its record is not signed by the operator.
        StoreError: when the store cannot be read.
    """
    config = target_config(store, name, identities)
    with _lock:
        cached = _cache.get(name)
        if cached is not None and cached[0] == config:
            return cached[1]
        executor = build_executor(config)
        _cache[name] = (config, executor)
        return executor
