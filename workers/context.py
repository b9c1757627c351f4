"""The context every run operation shares: the run store, the settings, how to send a
task (now or after a countdown), and the executor of a target for this process.

The operations (`workers.launch`, `.stops`, `.finish`, `.artifacts`, `.watch`,
`.policies`) are functions of a `Context`; `workers.tasks` builds one per process and
is the Celery edge around them. Every operation re-reads the state it acts on and
changes it by compare-and-set, so a duplicate, late or concurrent call changes
nothing more.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from schemas import Settings, TargetConfig
from store import RunStore

from .executors import Executor
from .identity import Identities
from .targets import executor_for, target_config

__all__ = ["Context", "Scheduler", "utcnow"]

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

    def __post_init__(self) -> None:
        self.worker_id = self.worker_id or f"{os.uname().nodename}:{os.getpid()}"
        self.identities = Identities(self.settings)

    def executor(self, target: str) -> Executor:
        """The executor of target `target` for this process (built once, rebuilt when
        the target's configuration changes).

        Raises:
            UnknownTarget, Unauthenticated, StoreError, InvalidArgument.
        """
        return executor_for(self.store, target, self.identities)

    def target(self, name: str) -> TargetConfig:
        """The operator-signed configuration of target `name`.

        Raises:
            UnknownTarget, Unauthenticated, StoreError.
        """
        return target_config(self.store, name, self.identities)


def utcnow() -> datetime:
    """The current time, timezone-aware UTC."""
    return datetime.now(UTC)
