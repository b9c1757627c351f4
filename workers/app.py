"""The Celery app of the workers: the wire contract of `schemas.events` (JSON only, the
queues and routes, one visibility timeout), plus what only a worker and beat need:
acks late, prefetch 1, a bounded number of held countdowns, the beat entries of the
periodic watches (docs/architecture.md, "Tasks"), and the heartbeats of the workers'
main processes and of beat (`workers.heartbeat`, `workers.beat`).

    celery -A workers.app worker      celery -A workers.app beat
    python -m workers.start worker -n NAME@%h      (the same, 0.6 s of CPU less: workers.start)

Settings come from `schemas.Settings` (environment `RUNWARDEN_*`), read once when
this module is imported.
"""

from __future__ import annotations

from typing import Any, Final

from celery import Celery, Task
from kombu.entity import Queue

from schemas import Settings
from schemas.errors import require_extra
from schemas.events import (
    DEFAULT_QUEUE,
    QUEUE,
    QUEUE_RETRIEVE,
    QUEUE_WATCH,
    TASK_FOLLOW_TICK,
    TASK_POLICY_TICK,
    TASK_RECONCILE,
    wire_config,
)
from schemas.health import HEARTBEAT_INTERVAL_S

from . import heartbeat

__all__ = [
    "CHILD_MAX_RSS_KIB",
    "ETA_TASK_LIMIT",
    "NO_EVENTS",
    "QuietTask",
    "app",
    "celery_config",
    "settings",
]

CHILD_MAX_RSS_KIB: Final = 96 * 1024
"""A pool process whose resident memory passed this (KiB) once a task is done is
replaced by a fresh one (Celery's `worker_max_memory_per_child`): a task that handled
thousands of runs at once (a bulk stop) leaves Python's allocator holding its peak,
which it never gives back to the system. An idle pool process holds about 60 MiB,
most of it shared with the main process."""

ETA_TASK_LIMIT: Final = 10_000
"""Most countdown tasks one worker holds in memory at once; past it the broker keeps
them (and `reconcile` still fires overdue deadlines)."""


class _NoEvents:
    """An event dispatcher that sends nothing: given as a message's
    `event_dispatcher` (a publishing option Celery passes to the dispatcher of the
    message's `task-sent` event), the message is sent without that event."""

    def publish(self, *args: Any, **kwargs: Any) -> None:
        return None


NO_EVENTS: Final = _NoEvents()
"""Send a message with `event_dispatcher=NO_EVENTS`: no `task-sent` event for it."""


class QuietTask(Task):  # type: ignore[misc]
    """A task that monitoring never sees: the periodic ticks and their fan-out, one
    every second or two, which would otherwise fill Flower's task list and bury the
    countdowns of the stops in flight. A worker sends no task event for it
    (`send_events`: received, started, succeeded, failed) and sending it, from beat
    or a worker, sends no `task-sent` event ([`NO_EVENTS`]), and its result (and
    started state) is not stored unless the sender asks (`ignore_result=False`):
    nobody reads them, and stored they were two writes per tick and about 200 keys a
    minute kept for a day. Its failures are still logged by the worker, and
    `runwarden status` tells from the store when each periodic task last ran."""

    send_events = False

    def apply_async(self, *args: Any, **options: Any) -> Any:
        options.setdefault("event_dispatcher", NO_EVENTS)
        options.setdefault("ignore_result", True)
        return super().apply_async(*args, **options)


def _entry(task: str, every_s: float) -> dict[str, Any]:
    """A beat entry sending `task` every `every_s` seconds, its result not stored as
    [`QuietTask`] sends it (for a beat that sends it by name)."""
    return {"task": task, "schedule": every_s, "options": {"ignore_result": True}}


def celery_config(settings: Settings) -> dict[str, Any]:
    """The Celery configuration of the workers and beat for `settings`: the shared
    wire configuration (`schemas.events.wire_config`) and the worker's own."""
    return wire_config(settings) | {
        "task_acks_late": True,
        "task_reject_on_worker_lost": True,
        "task_acks_on_failure_or_timeout": True,
        "worker_prefetch_multiplier": 1,
        "worker_eta_task_limit": ETA_TASK_LIMIT,
        "worker_max_memory_per_child": CHILD_MAX_RSS_KIB,
        "worker_enable_soft_shutdown_on_idle": True,
        "worker_soft_shutdown_timeout": 30.0,
        "worker_send_task_events": True,
        "task_track_started": True,
        "task_time_limit": int(settings.task_max_runtime_s),
        "result_expires": 24 * 3600,
        "task_queues": tuple(Queue(q) for q in (QUEUE, QUEUE_RETRIEVE, QUEUE_WATCH, DEFAULT_QUEUE)),  # type: ignore[no-untyped-call]
        "timezone": "UTC",
        "enable_utc": True,
        "beat_schedule": {
            "follow-tick": _entry(TASK_FOLLOW_TICK, settings.follow_poll_s),
            "reconcile": _entry(TASK_RECONCILE, settings.reconcile_s),
            "policies": _entry(TASK_POLICY_TICK, settings.policy_s),
        },
        # Beat's scheduler writes beat's heartbeat on its ticks (`workers.beat`): it
        # ticks at least once per heartbeat interval.
        "beat_scheduler": "workers.beat:HeartbeatScheduler",
        "beat_max_loop_interval": HEARTBEAT_INTERVAL_S,
    }


# A worker without its extra says so at start, before its tasks import the SSH client.
require_extra("worker", "a runwarden worker", "paramiko")
settings = Settings()
app = Celery("runwarden", include=["workers.tasks"])
app.conf.update(celery_config(settings))
heartbeat.install(settings)
