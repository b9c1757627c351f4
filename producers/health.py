"""The service's health as a producer reads it: [`read_health`] reads the store once
(`store.health`) and judges the reading (`schemas.health.assess`). What
`runwarden status`, `Runwarden.health()` and the web view's `/health` show.

    from producers.health import read_health
    report = read_health()          # a `schemas.health.HealthReport`
    report.ok, report.problems

Bounded in time: every connect and every reply waits at most `timeout_s` (no retry),
and a reading is two round trips, so a Redis that is down or hangs gives a report
("unreachable") within about twice `timeout_s`, never a hang or an exception. Behind
Sentinel (`sentinel://`), finding the primary first asks each sentinel once, in turn,
until one names it up (a connect and a reply, at most `timeout_s` each): the bound
grows by at most twice `timeout_s` per sentinel that does not answer, and sentinels
that name no primary give "unreachable" with what each one said
(`store.runstore`).
"""

from __future__ import annotations

import time
from typing import Final
from urllib.parse import urlsplit

from schemas import RunwardenError, Settings
from schemas.events import DEFAULT_QUEUE
from schemas.health import periodic_tasks
from schemas.health_report import (
    LATE_AFTER_S,
    REQUIRED_QUEUES,
    HealthReport,
    assess,
    unreachable,
)
from schemas.sentinel import is_sentinel, parse_sentinel
from schemas.text import clean_text, error_line, format_bytes
from store import RunStore

from .defaults import HEALTH_TIMEOUT_S

__all__ = [
    "HEALTH_TIMEOUT_S",
    "QUEUES_SHOWN",
    "HealthRow",
    "read_health",
    "redis_address",
    "report_rows",
]

QUEUES_SHOWN: Final = (*REQUIRED_QUEUES, DEFAULT_QUEUE)
"""The queues whose depth is reported: every queue of `schemas.events`."""

HealthRow = tuple[str, str, str, str]
"""One row of [`report_rows`]: what, state, name, detail."""


def redis_address(settings: Settings) -> str:
    """Where `settings` look for Redis, for people: the URL without its user,
    password or query (`redis://host:6379/0`, `unix:///path/redis.sock`); the embedded
    server's socket when no URL is set; behind Sentinel, the sentinels and the master's
    name (`sentinel://h1:26379,h2:26379/mymaster`)."""
    if settings.redis_url is None:
        return f"unix://{settings.embedded_socket} (embedded)"
    url = settings.redis_url.get_secret_value()
    if is_sentinel(url):
        return parse_sentinel(url).public()
    parts = urlsplit(url)
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    try:
        port = parts.port
    except ValueError:
        port = None
    netloc = host if port is None else f"{host}:{port}"
    return f"{parts.scheme}://{netloc}{parts.path}"


def _line(error: BaseException) -> str:
    line = error_line(error)
    return line.removeprefix("run store: ").replace(" (Health.read_health)", "")


def read_health(
    settings: Settings | None = None,
    *,
    late_after_s: float = LATE_AFTER_S,
    timeout_s: float = HEALTH_TIMEOUT_S,
) -> HealthReport:
    """The health of the service `settings` (default: from the environment) point at:
    Redis, the workers and beat, the periodic tasks (periods from `settings`, late
    past `late_after_s` seconds), the queues, the deadlines. Never raises for a Redis
    that cannot be read (down, hanging, refusing the password, or its password file
    unreadable): the report says unreachable, and is not ok.

    Raises:
        ValueError: `late_after_s` negative, or `timeout_s` not positive.
    """
    if not 0 < timeout_s < float("inf"):
        raise ValueError(f"timeout_s must be a positive number of seconds, not {timeout_s!r}")
    if not 0 <= late_after_s < float("inf"):
        raise ValueError(f"late_after_s must be a finite number >= 0, not {late_after_s!r}")
    settings = settings or Settings()
    address = redis_address(settings)
    # With the embedded default, nothing answers until `runwarden serve` runs.
    hint = " (the embedded Redis runs with `runwarden serve`)" if settings.redis_url is None else ""
    periods = periodic_tasks(settings)
    try:
        store = RunStore.from_url(settings.store_url(), timeout_s=timeout_s)
    except (RunwardenError, ValueError) as error:  # the password file, a malformed URL
        return unreachable(address, _line(error) + hint, time.time(), late_after_s)
    try:
        readings = store.health.read_health(QUEUES_SHOWN, list(periods))
    except RunwardenError as error:
        return unreachable(address, _line(error) + hint, time.time(), late_after_s)
    finally:
        store.client.close()
    return assess(readings, address=address, periods=periods, late_after_s=late_after_s)


# --- the report for people ------------------------------------------------------------


def _age(seconds: float | None) -> str:
    return "never" if seconds is None else f"{seconds:.1f} s ago"


def _memory(report: HealthReport) -> str:
    redis = report.redis
    if redis.used_memory is None:
        return "memory not reported"
    text = f"memory {format_bytes(redis.used_memory)}"
    if redis.maxmemory and redis.memory_fraction is not None:
        return text + f" of {format_bytes(redis.maxmemory)} ({redis.memory_fraction:.1%})"
    return text + ", no maxmemory"


def _processes(report: HealthReport) -> list[HealthRow]:
    rows = []
    for role, processes in (("worker", report.workers), ("beat", report.beats)):
        if not processes:
            rows.append((role, "DOWN", "-", "never seen"))
        for p in processes:
            detail = f"heartbeat {_age(p.heartbeat_age_s)}"
            if p.alive:
                detail = f"host {p.hostname}, pid {p.pid}, {detail}"
            if p.queues:
                detail += ", queues " + " ".join(p.queues)
            rows.append((role, "up" if p.alive else "DOWN", p.name, detail))
    return rows


def _periodic(report: HealthReport) -> list[HealthRow]:
    rows = []
    for t in report.periodic:
        late = "late unknown" if t.late_s is None else f"late {t.late_s:.1f} s"
        detail = f"every {t.period_s:g} s, ran {_age(t.last_run_age_s)}, {late}"
        rows.append(("periodic", "LATE" if t.late else "ok", t.task, detail))
    return rows


def _queues(report: HealthReport) -> list[HealthRow]:
    rows = []
    for q in report.queues:
        detail = f"{q.depth} waiting"
        if set(q.by_priority) - {"0"}:
            steps = ", ".join(f"{step}: {n}" for step, n in q.by_priority.items())
            detail += f" (by priority {steps})"
        rows.append(("queue", "ok", q.name, detail))
    if report.unacked is not None:
        rows.append(("unacked", "ok", "-", f"{report.unacked} running or held for later"))
    return rows


def _serve(report: HealthReport) -> list[HealthRow]:
    rows = []
    for serve in report.serve:
        up = "" if serve.up_s is None else f", up {serve.up_s:.0f} s"
        detail = f"host {serve.hostname}, pid {serve.pid}{up}, {serve.restarts} restart(s)"
        rows.append(("serve", "up", serve.name, detail))
        for child in serve.children:
            detail = "thread of serve" if child.pid is None else f"pid {child.pid}"
            if child.state == "restarting":
                detail = "waiting to be restarted"
            detail += f", {child.restarts} restart(s)"
            if child.last_end is not None and child.last_end_age_s is not None:
                detail += f", last {child.last_end} {child.last_end_age_s:.1f} s ago"
            state = "up" if child.state == "up" else "RESTARTING"
            rows.append(("child", state, child.name, detail))
    return rows


def _deadlines(report: HealthReport) -> list[HealthRow]:
    d = report.deadlines
    if d is None:
        return []
    detail = f"{d.pending} pending, {d.overdue} overdue"
    if d.next is not None:
        due = d.next.due_in_s
        when = f"in {due:.1f} s" if due >= 0 else f"overdue by {-due:.1f} s"
        detail += f"; next: {d.next.kind} of run {d.next.run_id} (stop {d.next.stop_id}) {when}"
    return [("deadlines", "ok", "-", detail)]


def report_rows(report: HealthReport) -> list[HealthRow]:
    """`report` as a table for people, one row per part: (what, state, name,
    detail), e.g. `("worker", "up", "runwarden@vm", "host vm, pid 7, heartbeat 0.4 s
    ago, queues celery runwarden")`, then `runwarden serve` and each process it
    supervises (`("child", "up", "beat", "pid 9, 1 restart(s), last killed by SIGKILL
    4.2 s ago")`). State is `up`, `ok`, `DOWN`, `LATE` or `RESTARTING`; times are in
    seconds; every text read from Redis is cleaned of control characters."""
    redis = report.redis
    if not redis.reachable:
        rows = [("redis", "DOWN", redis.address, "unreachable")]
    else:
        rows = [("redis", "up", redis.address, _memory(report))]
        rows += _processes(report) + _periodic(report) + _queues(report) + _deadlines(report)
        rows += _serve(report)
    return [(w, s, clean_text(n), clean_text(x)) for w, s, n, x in rows]
