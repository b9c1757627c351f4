"""Executors for targets, built from their stored configuration: one per target and
process (an SSH executor's connection is per process anyway), rebuilt when the
target's configuration changes."""

from __future__ import annotations

import os
import threading
from pathlib import Path

from schemas import TargetConfig
from store import RunStore

from .executors import Executor, LocalExecutor, RunAsExecutor, SshExecutor

__all__ = ["build_executor", "executor_for"]

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


def executor_for(store: RunStore, name: str) -> Executor:
    """The executor of target `name` for this process.

    Raises:
        UnknownTarget: when there is no such target.
        StoreError: when the store cannot be read.
    """
    config = TargetConfig.model_validate(store.get_target(name))
    with _lock:
        cached = _cache.get(name)
        if cached is not None and cached[0] == config:
            return cached[1]
        executor = build_executor(config)
        _cache[name] = (config, executor)
        return executor
