"""Beat's scheduler: Celery's `PersistentScheduler` (the schedule's state in the file
given with `-s`) that writes beat's heartbeat (`workers.heartbeat`) on its ticks, at
most twice per `HEARTBEAT_INTERVAL_S`. `workers.app` makes it beat's scheduler and
sets `beat_max_loop_interval` to that interval, so beat ticks, and beats, at least
that often; a beat that is killed, or hangs in its loop, stops beating.

The heartbeat is written before the tick's work, so a tick held by a slow Redis
delays it by at most `workers.heartbeat.WRITE_TIMEOUT_S`; at shutdown it is removed.
"""

from __future__ import annotations

import socket
from typing import Any

from celery.beat import PersistentScheduler

from schemas.health import HEARTBEAT_INTERVAL_S

from .app import settings
from .heartbeat import HeartbeatWriter

__all__ = ["HeartbeatScheduler"]


class HeartbeatScheduler(PersistentScheduler):  # type: ignore[misc]
    """`PersistentScheduler` with beat's heartbeat, named `beat@<hostname>`."""

    _writer: HeartbeatWriter | None = None

    def _heartbeat(self) -> HeartbeatWriter:
        if self._writer is None:
            self._writer = HeartbeatWriter(settings, "beat", f"beat@{socket.gethostname()}")
        return self._writer

    def tick(self, *args: Any, **kwargs: Any) -> float:
        # Beat sleeps up to one interval between ticks: half an interval between
        # writes keeps the gap between two heartbeats near one interval.
        self._heartbeat().write_due(HEARTBEAT_INTERVAL_S / 2)
        interval: float = super().tick(*args, **kwargs)
        return interval

    def close(self) -> None:
        super().close()
        if self._writer is not None:
            self._writer.end()
