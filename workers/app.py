"""The Celery app of the workers: JSON only, acks late, one consistent visibility
timeout, beat entries for the periodic watches (DESIGN.md §4).

    celery -A workers.app worker      celery -A workers.app beat

Settings come from `schemas.Settings` (environment `RUNWARDEN_*`), read once when
this module is imported.
"""

from __future__ import annotations

from typing import Any, Final

from celery import Celery
from kombu.entity import Queue

from schemas import Settings
from schemas.events import (
    TASK_FOLLOW_TICK,
    TASK_POLICY_TICK,
    TASK_POLL_REQUESTS,
    TASK_RECONCILE,
    TASK_RETRIEVE,
)

__all__ = ["ETA_TASK_LIMIT", "QUEUE", "QUEUE_RETRIEVE", "app", "celery_config", "settings"]

QUEUE: Final = "runwarden"
QUEUE_RETRIEVE: Final = "runwarden.retrieve"
"""The queue of `runwarden.retrieve` alone: a retrieval may download for hours, and
must never hold a worker process that a stop's deadline or a follow tick needs.
`runwarden serve` (and compose) run one worker for it; a worker started without
`-Q` consumes both queues."""
ETA_TASK_LIMIT: Final = 10_000
"""Most countdown tasks one worker holds in memory at once; past it the broker keeps
them (and `reconcile` still fires overdue deadlines)."""


def celery_config(settings: Settings) -> dict[str, Any]:
    """The Celery configuration for `settings`, shared by the workers and beat.

    The visibility timeout is set once and used for the broker, the result backend
    and the app alike: longer than the longest countdown plus a task's run time, so
    that a countdown task held for its ETA is not redelivered while it waits.
    """
    url = settings.broker_url()
    visibility = {"visibility_timeout": int(settings.visibility_timeout_s)}
    return {
        "broker_url": url,
        "result_backend": url,
        "broker_transport_options": visibility,
        "result_backend_transport_options": visibility,
        "broker_connection_retry_on_startup": True,
        "task_serializer": "json",
        "result_serializer": "json",
        "event_serializer": "json",
        "accept_content": ["json"],
        "result_accept_content": ["json"],
        "task_acks_late": True,
        "task_reject_on_worker_lost": True,
        "task_acks_on_failure_or_timeout": True,
        "worker_prefetch_multiplier": 1,
        "worker_eta_task_limit": ETA_TASK_LIMIT,
        "worker_enable_soft_shutdown_on_idle": True,
        "worker_soft_shutdown_timeout": 30.0,
        "worker_send_task_events": True,
        "task_send_sent_event": True,
        "task_track_started": True,
        "task_time_limit": int(settings.task_max_runtime_s),
        "result_expires": 24 * 3600,
        "task_default_queue": QUEUE,
        "task_queues": (Queue(QUEUE), Queue(QUEUE_RETRIEVE)),  # type: ignore[no-untyped-call]
        "task_routes": {TASK_RETRIEVE: {"queue": QUEUE_RETRIEVE}},
        "timezone": "UTC",
        "enable_utc": True,
        "beat_schedule": {
            "follow-tick": {"task": TASK_FOLLOW_TICK, "schedule": settings.follow_poll_s},
            "poll-requests": {"task": TASK_POLL_REQUESTS, "schedule": settings.request_poll_s},
            "reconcile": {"task": TASK_RECONCILE, "schedule": settings.reconcile_s},
            "policies": {"task": TASK_POLICY_TICK, "schedule": settings.policy_s},
        },
        "beat_max_loop_interval": max(1.0, min(settings.follow_poll_s, settings.reconcile_s)),
    }


settings = Settings()
app = Celery("runwarden", include=["workers.tasks"])
app.conf.update(celery_config(settings))
