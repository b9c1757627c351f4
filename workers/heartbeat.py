"""The heartbeats of a worker's main process and of beat (`schemas.health`): a key
with a time to live, written every `HEARTBEAT_INTERVAL_S` (`store.health`), which
`runwarden status` reads. A process killed without a word stops writing and its key
lapses `HEARTBEAT_TTL_S` later; a clean shutdown removes it at once.

A worker's heartbeat is written by a thread of its main process, started at Celery's
`worker_ready` (the pool is up, the queues are consumed) and ended at
`worker_shutting_down` / `worker_shutdown` ([`install`]). Beat writes its own from its
scheduler's loop (`workers.beat`), so a beat that stops ticking stops beating.

Writing never raises: a failed write (Redis down, the secrets directory unreadable)
is logged, at most once a minute, and tried again at the next interval. Each write
waits at most [`WRITE_TIMEOUT_S`] on Redis.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from typing import Any, Final

from celery import signals

from schemas import RunwardenError, Settings
from schemas.health import HEARTBEAT_INTERVAL_S, HEARTBEAT_TTL_S, Heartbeat, Role
from store import RunStore

__all__ = ["WRITE_TIMEOUT_S", "HeartbeatThread", "HeartbeatWriter", "install", "publish_rule"]

log = logging.getLogger("runwarden.heartbeat")

WRITE_TIMEOUT_S: Final = 1.0
"""Longest wait on Redis of one heartbeat write (connect or reply), in seconds."""
_LOG_EVERY_S: Final = 60.0


class HeartbeatWriter:
    """Writes the heartbeat of one process: `name` of `role`, its queues read from
    `queues` at each write. Not thread-safe: one writer per thread."""

    def __init__(
        self,
        settings: Settings,
        role: Role,
        name: str,
        queues: Callable[[], tuple[str, ...]] = tuple,
        *,
        ttl_s: float = HEARTBEAT_TTL_S,
        store: RunStore | None = None,
    ) -> None:
        """`store`: the store to write to; by default one on `settings`' Redis, made at
        the first write, each wait on Redis bounded by `WRITE_TIMEOUT_S`."""
        self.settings = settings
        self.role: Role = role
        self.name = name
        self._queues = queues
        self._ttl_s = ttl_s
        self._store = store
        self._own_store = store is None
        self._started: float | None = None
        self._last_write = -float("inf")
        self._last_log = -float("inf")

    def _connected(self) -> RunStore:
        if self._store is None:
            self._store = RunStore.from_url(self.settings.store_url(), timeout_s=WRITE_TIMEOUT_S)
        return self._store

    def _failed(self, what: str, error: Exception) -> None:
        now = time.monotonic()
        if now - self._last_log >= _LOG_EVERY_S:
            self._last_log = now
            log.warning("heartbeat of %s %s: %s failed: %s", self.role, self.name, what, error)

    def write(self) -> bool:
        """Writes one heartbeat; whether it was written."""
        self._last_write = time.monotonic()
        try:
            beat = Heartbeat(
                name=self.name,
                hostname=socket.gethostname()[:255],
                pid=os.getpid(),
                queues=self._queues(),
                started=self._started,
            )
            written = self._connected().health.heartbeat(self.role, beat, self._ttl_s)
        except (RunwardenError, ValueError) as error:
            self._failed("writing", error)
            return False
        self._started = written.started
        return True

    def write_due(self, interval_s: float = HEARTBEAT_INTERVAL_S) -> bool:
        """Writes one heartbeat when the last was `interval_s` seconds ago or more;
        whether it wrote one."""
        if time.monotonic() - self._last_write < interval_s:
            return False
        return self.write()

    def end(self) -> None:
        """Removes the heartbeat (a clean shutdown) and closes the connection."""
        try:
            self._connected().health.end_heartbeat(self.role, self.name)
        except (RunwardenError, ValueError) as error:
            self._failed("ending", error)
        if self._own_store and self._store is not None:
            self._store.client.close()
            self._store = None


class HeartbeatThread:
    """A daemon thread writing `writer`'s heartbeat every `interval_s` seconds until
    [`stop`], which ends the heartbeat."""

    def __init__(self, writer: HeartbeatWriter, interval_s: float = HEARTBEAT_INTERVAL_S) -> None:
        self.writer = writer
        self._interval_s = interval_s
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="runwarden-heartbeat", daemon=True)
        self._lock = threading.Lock()
        self._ended = False

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        while True:
            self.writer.write()
            if self._stopping.wait(self._interval_s):
                break
        self._end()

    def _end(self) -> None:
        with self._lock:
            if not self._ended:
                self._ended = True
                self.writer.end()

    def stop(self, wait_s: float = 5.0) -> None:
        """Stops writing and removes the heartbeat (at most once), waiting up to
        `wait_s` seconds for the thread."""
        self._stopping.set()
        if self._thread.is_alive():
            self._thread.join(wait_s)
        self._end()

    def signal_stop(self) -> None:
        """Asks the thread to stop and remove the heartbeat, without waiting (safe in
        a signal handler)."""
        self._stopping.set()


_running: HeartbeatThread | None = None


def _consumed(consumer: Any) -> Callable[[], tuple[str, ...]]:
    """The names of the queues `consumer` (Celery's) consumes, as they stand."""

    def queues() -> tuple[str, ...]:
        task_consumer = getattr(consumer, "task_consumer", None)
        if task_consumer is None:
            return ()
        return tuple(sorted({str(q.name) for q in task_consumer.queues}))

    return queues


def publish_rule(settings: Settings, name: str) -> bool:
    """Publishes the rule worker `name` decides its stops' timeouts by (`settings`'
    `budget_rule`: the default timeouts and how they are learned), so `runwarden
    show` and the web view predict a stop's timeouts from the workers' settings, not
    their own. Written at the worker's start, each wait on Redis bounded by
    [`WRITE_TIMEOUT_S`]; never raises (a failure is logged): whether it was written."""
    try:
        store = RunStore.from_url(settings.store_url(), timeout_s=WRITE_TIMEOUT_S)
    except (RunwardenError, ValueError) as error:
        log.warning("worker %s: cannot publish its timeouts' rule: %s", name, error)
        return False
    try:
        store.budgets.publish_rule(name, settings.budget_rule)
    except (RunwardenError, ValueError) as error:
        log.warning("worker %s: cannot publish its timeouts' rule: %s", name, error)
        return False
    finally:
        store.client.close()
    return True


def install(settings: Settings) -> None:
    """Connects the worker's heartbeat to Celery's signals, for `settings`' Redis
    (again: replaces the handlers of the last call). Started at `worker_ready` in the
    main process, stopped at `worker_shutting_down` (a warm or cold shutdown begins:
    no new work is taken) and `worker_shutdown`."""

    def ready(sender: Any = None, **_: Any) -> None:
        global _running  # noqa: PLW0603 - one heartbeat per worker process
        if _running is not None:
            return
        name = str(getattr(sender, "hostname", "") or f"worker@{socket.gethostname()}")
        publish_rule(settings, name)
        writer = HeartbeatWriter(settings, "worker", name, _consumed(sender))
        _running = HeartbeatThread(writer)
        _running.start()

    def shutting_down(**_: Any) -> None:
        if _running is not None:
            _running.signal_stop()

    def shutdown(**_: Any) -> None:
        global _running  # noqa: PLW0603 - see ready
        if _running is not None:
            _running.stop()
            _running = None

    # Installed again (a test, another app), the new handlers replace the old ones.
    for signal, handler, uid in (
        (signals.worker_ready, ready, "runwarden-heartbeat-ready"),
        (signals.worker_shutting_down, shutting_down, "runwarden-heartbeat-shutting-down"),
        (signals.worker_shutdown, shutdown, "runwarden-heartbeat-shutdown"),
    ):
        signal.disconnect(dispatch_uid=uid)
        signal.connect(handler, weak=False, dispatch_uid=uid)
