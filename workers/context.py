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

from schemas import Settings
from store import RunStore

from .executors import Executor
from .targets import executor_for

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

    def __post_init__(self) -> None:
        self.worker_id = self.worker_id or f"{os.uname().nodename}:{os.getpid()}"

    def executor(self, target: str) -> Executor:
        """The executor of target `target` for this process (built once, rebuilt when
        the target's configuration changes).

        Raises:
            UnknownTarget, StoreError, InvalidArgument.
        """
        return executor_for(self.store, target)


def utcnow() -> datetime:
    """The current time, timezone-aware UTC."""
    return datetime.now(UTC)
