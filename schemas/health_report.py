"""Service health, what `runwarden status` shows ([`HealthReport`]) and the one pure rule
that judges a reading of the store ([`assess`], of a `schemas.health.HealthReadings`):
what is down, what deserves a look.

Down (the report is not `ok`; `runwarden status` exits 1): Redis unreachable; no live
worker consuming `runwarden`, `runwarden.retrieve` or `runwarden.watch`; no live beat; a
periodic task late by more than `late_after_s`. Warnings (shown, `ok` unchanged): Redis
memory above [`MEMORY_WARN_FRACTION`] of `maxmemory`, or not reported; a process whose
heartbeat stopped without a shutdown; more than one live beat; a deadline overdue by
more than `late_after_s` (reconcile is not firing it).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Final

from pydantic import BaseModel, ConfigDict

from .defaults import LATE_AFTER_S
from .events import QUEUE, QUEUE_RETRIEVE, QUEUE_WATCH
from .health import (
    HEARTBEAT_KEPT_S,
    ChildState,
    HealthReadings,
    Role,
    SeenProcess,
)
from .stops import DeadlineKind

__all__ = [
    "LATE_AFTER_S",
    "MEMORY_WARN_FRACTION",
    "REQUIRED_QUEUES",
    "DeadlinesStatus",
    "HealthReport",
    "NextDeadline",
    "PeriodicStatus",
    "ProcessStatus",
    "QueueStatus",
    "RedisStatus",
    "ServeChildStatus",
    "ServeStatus",
    "assess",
    "unreachable",
]


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


MEMORY_WARN_FRACTION: Final = 0.8
"""Share of Redis's `maxmemory` in use past which the report warns."""
REQUIRED_QUEUES: Final = (QUEUE, QUEUE_RETRIEVE, QUEUE_WATCH)
"""Queues that at least one live worker must consume."""


class RedisStatus(_Model):
    reachable: bool
    address: str
    """Where Redis was looked for, without credentials."""
    error: str | None = None
    used_memory: int | None = None
    maxmemory: int | None = None
    memory_fraction: float | None = None
    """`used_memory / maxmemory`; None without a limit."""


class ProcessStatus(_Model):
    name: str
    hostname: str | None
    pid: int | None
    queues: tuple[str, ...]
    alive: bool
    heartbeat_age_s: float
    """Seconds since its last heartbeat."""


class PeriodicStatus(_Model):
    task: str
    period_s: float
    last_run_age_s: float | None
    """Seconds since it last ran; None when it never did."""
    late_s: float | None
    """`now - last run - period`, at least 0 (a task never run: counted from the start
    of the oldest live beat); None when it cannot be told (no run, no live beat)."""
    late: bool
    """Late by more than the report's `late_after_s`."""


class QueueStatus(_Model):
    name: str
    depth: int
    """Messages waiting in the queue, every priority list counted."""
    by_priority: dict[str, int]
    """Priority step -> messages, for each list of the queue that holds any."""


class NextDeadline(_Model):
    run_id: str
    stop_id: str
    kind: DeadlineKind
    due_in_s: float
    """Negative when it is overdue."""


class DeadlinesStatus(_Model):
    pending: int
    overdue: int
    next: NextDeadline | None


class ServeChildStatus(_Model):
    name: str
    pid: int | None
    state: ChildState
    restarts: int
    last_end: str | None
    """How it last ended; None if it never did."""
    last_end_age_s: float | None
    """Seconds since it last ended (None if it never did)."""


class ServeStatus(_Model):
    name: str
    hostname: str
    pid: int
    up_s: float | None
    """Seconds since serve started."""
    restarts: int
    """Restarts of all its children."""
    children: tuple[ServeChildStatus, ...]


class HealthReport(_Model):
    """What `runwarden status` shows; `model_dump(mode="json")` is its `--json`."""

    ok: bool
    """No problem: every part the service needs is up."""
    checked_at: float
    """Unix seconds of the check (Redis's clock; this machine's when unreachable)."""
    late_after_s: float
    problems: tuple[str, ...]
    warnings: tuple[str, ...]
    redis: RedisStatus
    workers: tuple[ProcessStatus, ...]
    beats: tuple[ProcessStatus, ...]
    periodic: tuple[PeriodicStatus, ...]
    queues: tuple[QueueStatus, ...]
    unacked: int | None
    deadlines: DeadlinesStatus | None
    serve: tuple[ServeStatus, ...] = ()
    """Each live `runwarden serve` on this Redis, with its children's restarts."""


def _r(value: float) -> float:
    return round(value, 3)


def unreachable(address: str, error: str, checked_at: float, late_after_s: float) -> HealthReport:
    """The report when Redis cannot be read: down, and nothing else known."""
    return HealthReport(
        ok=False,
        checked_at=_r(checked_at),
        late_after_s=late_after_s,
        problems=(f"redis: unreachable at {address}: {error}",),
        warnings=(),
        redis=RedisStatus(reachable=False, address=address, error=error),
        workers=(),
        beats=(),
        periodic=(),
        queues=(),
        unacked=None,
        deadlines=None,
    )


def _processes(
    seen: Sequence[SeenProcess], role: Role, now: float, warnings: list[str]
) -> tuple[ProcessStatus, ...]:
    shown = []
    for process in seen:
        beat = process.heartbeat
        at = beat.at if beat is not None else process.last_seen
        age = _r(max(0.0, now - at))
        if beat is None and age > HEARTBEAT_KEPT_S:
            continue
        if beat is None:
            warnings.append(
                f"{role} {process.name}: no heartbeat for {age:.1f} s (ended without a shutdown)"
            )
        shown.append(
            ProcessStatus(
                name=process.name,
                hostname=beat.hostname if beat else None,
                pid=beat.pid if beat else None,
                queues=beat.queues if beat else (),
                alive=beat is not None,
                heartbeat_age_s=age,
            )
        )
    return tuple(shown)


def _periodic(
    readings: HealthReadings, periods: Mapping[str, float], late_after_s: float
) -> tuple[PeriodicStatus, ...]:
    now = readings.now
    starts = [
        b.heartbeat.started
        for b in readings.beats
        if b.heartbeat is not None and b.heartbeat.started is not None
    ]
    beat_started = min(starts) if starts else None
    shown = []
    for task, period in periods.items():
        last = readings.ticks.get(task)
        since = last if last is not None else beat_started
        late = None if since is None else _r(max(0.0, now - since - period))
        shown.append(
            PeriodicStatus(
                task=task,
                period_s=period,
                last_run_age_s=None if last is None else _r(max(0.0, now - last)),
                late_s=late,
                late=late is not None and late > late_after_s,
            )
        )
    return tuple(shown)


def _serves(readings: HealthReadings, warnings: list[str]) -> tuple[ServeStatus, ...]:
    shown = []
    for state in readings.serves:
        since = max(0.0, readings.now - state.at)
        children = []
        for child in state.children:
            ago = child.last_end_ago_s
            age = None if ago is None else _r(since + ago)
            if child.state == "restarting":
                warnings.append(
                    f"serve: {child.name} is being restarted ({child.last_end or 'ended'}, "
                    f"restart {child.restarts + 1})"
                )
            children.append(
                ServeChildStatus(
                    name=child.name,
                    pid=child.pid,
                    state=child.state,
                    restarts=child.restarts,
                    last_end=child.last_end,
                    last_end_age_s=age,
                )
            )
        shown.append(
            ServeStatus(
                name=state.name,
                hostname=state.hostname,
                pid=state.pid,
                up_s=None if state.started is None else _r(max(0.0, readings.now - state.started)),
                restarts=sum(c.restarts for c in state.children),
                children=tuple(children),
            )
        )
    return tuple(shown)


def _memory(readings: HealthReadings, warnings: list[str]) -> float | None:
    used, limit = readings.used_memory, readings.maxmemory
    if used is None or limit is None:
        warnings.append("redis: memory not reported (INFO refused)")
        return None
    if limit <= 0:
        return None
    fraction = used / limit
    if fraction > MEMORY_WARN_FRACTION:
        warnings.append(
            f"redis: {fraction:.0%} of maxmemory in use ({used} of {limit} bytes), "
            f"above {MEMORY_WARN_FRACTION:.0%}"
        )
    return round(fraction, 4)


def _deadlines(
    readings: HealthReadings, late_after_s: float, warnings: list[str]
) -> DeadlinesStatus:
    reading = readings.deadlines
    first = reading.next
    upcoming = None
    if first is not None:
        due_in = _r(first.due.timestamp() - readings.now)
        upcoming = NextDeadline(
            run_id=first.run_id, stop_id=first.stop_id, kind=first.kind, due_in_s=due_in
        )
        if -due_in > late_after_s:
            warnings.append(
                f"deadline {first.kind} of run {first.run_id}: overdue by {-due_in:.1f} s "
                "(reconcile is not firing it)"
            )
    return DeadlinesStatus(pending=reading.pending, overdue=reading.overdue, next=upcoming)


def assess(
    readings: HealthReadings,
    *,
    address: str,
    periods: Mapping[str, float],
    late_after_s: float = LATE_AFTER_S,
    required_queues: Sequence[str] = REQUIRED_QUEUES,
) -> HealthReport:
    """The report of `readings` of the Redis at `address` (shown as given: pass it
    without credentials), each periodic task of `periods` (name -> period, seconds)
    judged late past `late_after_s` seconds. Pure: the same readings give the same
    report.

    Raises:
        ValueError: `late_after_s` negative or not finite.
    """
    if not 0 <= late_after_s < float("inf"):
        raise ValueError(f"late_after_s must be a finite number >= 0, not {late_after_s!r}")
    now = readings.now
    problems: list[str] = []
    warnings: list[str] = []
    fraction = _memory(readings, warnings)
    workers = _processes(readings.workers, "worker", now, warnings)
    for queue in required_queues:
        if not any(w.alive and queue in w.queues for w in workers):
            problems.append(f"workers: no live worker consumes the queue {queue!r}")
    beats = _processes(readings.beats, "beat", now, warnings)
    live_beats = sum(b.alive for b in beats)
    if live_beats == 0:
        problems.append("beat: no live beat (periodic tasks are not sent)")
    elif live_beats > 1:
        warnings.append(f"beat: {live_beats} live beats (each sends every periodic task)")
    periodic = _periodic(readings, periods, late_after_s)
    for task in periodic:
        if task.late:
            problems.append(
                f"periodic: {task.task} late by {task.late_s:.1f} s "
                f"(every {task.period_s:g} s; over {late_after_s:g} s)"
            )
    deadlines = _deadlines(readings, late_after_s, warnings)
    serves = _serves(readings, warnings)
    queues = tuple(
        QueueStatus(
            name=name,
            depth=sum(lists.values()),
            by_priority={str(step): n for step, n in sorted(lists.items()) if n > 0},
        )
        for name, lists in readings.queues.items()
    )
    return HealthReport(
        ok=not problems,
        checked_at=_r(now),
        late_after_s=late_after_s,
        problems=tuple(problems),
        warnings=tuple(warnings),
        redis=RedisStatus(
            reachable=True,
            address=address,
            used_memory=readings.used_memory,
            maxmemory=readings.maxmemory,
            memory_fraction=fraction,
        ),
        workers=workers,
        beats=beats,
        periodic=periodic,
        queues=queues,
        unacked=readings.unacked,
        deadlines=deadlines,
        serve=serves,
    )
