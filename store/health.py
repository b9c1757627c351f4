"""Service health in the run store: the heartbeats of workers and beat, when each
periodic task last ran, and one reading of everything `runwarden status` reports
(keys: `store.keys`, "health"; shapes and rules: `schemas.health`).

Every time written or read here is unix seconds on Redis's clock (`TIME`), so a
heartbeat's age and a task's lateness never depend on the clocks of the machines
that wrote them. A heartbeat is a key with a time to live: a process is alive while
its key is there, and Redis drops it by itself when the process stops writing.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any, TypeVar

from pydantic import ValidationError
from redis.exceptions import RedisError

from schemas import Deadline
from schemas.health import (
    HEARTBEAT_BYTES,
    HEARTBEAT_KEPT_S,
    PROCESSES_SHOWN,
    DeadlinesReading,
    HealthReadings,
    Heartbeat,
    Role,
    SeenProcess,
    ServeState,
)

from .base import StorePart, millis, replace_model, text, translated
from .keys import BROKER_PRIORITY_STEPS
from .memory import MemoryUse, memory_use

__all__ = ["Health"]

_ROLES: tuple[Role, Role] = ("worker", "beat")


_Live = TypeVar("_Live", Heartbeat, ServeState)
"""A record kept alive by rewriting it: a process's heartbeat or a serve's state."""

def _seconds(reply: Any) -> float:
    """A `TIME` reply as unix seconds."""
    whole, micros = reply
    return int(whole) + int(micros) / 1_000_000


def _time(raw: Any) -> float | None:
    """A stored time (unix seconds as text); None when absent or unreadable."""
    try:
        value = float(text(raw))
    except (TypeError, ValueError):
        return None
    return value if math.isfinite(value) else None


def _number(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


class Health(StorePart):
    """Heartbeats, periodic task runs, Redis's memory, and the health reading
    (`RunStore.health`)."""

    @translated
    def memory(self) -> MemoryUse:
        """Redis's memory use now, and its limit (`INFO memory`).

        Raises:
            StoreError: Redis failed, or its answer lacks the numbers.
        """
        return memory_use(self._r)

    @translated
    def redis_now(self) -> float:
        """Redis's clock, unix seconds."""
        return _seconds(self._r.time())

    @translated
    def heartbeat(self, role: Role, beat: Heartbeat, ttl_s: float) -> Heartbeat:
        """Writes `beat` as the live heartbeat of the process `beat.name` of `role`, for
        `ttl_s` seconds, stamped with Redis's clock (`at`, and `started` when it has
        none); returns what was written. Forgets the processes of `role` whose
        heartbeat stopped more than `HEARTBEAT_KEPT_S` ago.

        Raises:
            ValueError: an unknown role, or `ttl_s` not a positive number.
            StoreError: Redis failed.
        """
        ttl_ms = millis(ttl_s, "a heartbeat's time to live")
        key, seen = self.keys.heartbeat(role, beat.name), self.keys.heartbeats(role)
        return self._write_live(key, seen, beat, ttl_ms)

    @translated
    def end_heartbeat(self, role: Role, name: str) -> None:
        """Removes the heartbeat of process `name` of `role` and forgets the process: a
        clean shutdown, which is not a failure to report."""
        pipe = self._r.pipeline(transaction=True)
        pipe.delete(self.keys.heartbeat(role, name))
        pipe.zrem(self.keys.heartbeats(role), name)
        pipe.execute()

    @translated
    def write_serve(self, state: ServeState, ttl_s: float) -> ServeState:
        """Writes `state` as the live record of `runwarden serve` `state.name`, for
        `ttl_s` seconds, stamped with Redis's clock (`at`, and `started` when it has
        none); returns what was written. Forgets the serves whose record stopped more
        than `HEARTBEAT_KEPT_S` ago.

        Raises:
            ValueError: `ttl_s` not a positive number.
            StoreError: Redis failed.
        """
        ttl_ms = millis(ttl_s, "a serve record's time to live")
        return self._write_live(self.keys.serve(state.name), self.keys.serves, state, ttl_ms)

    def _write_live(self, key: str, seen: str, record: _Live, ttl_ms: int) -> _Live:
        """Writes `record` (a heartbeat or a serve's state) at `key` for `ttl_ms`,
        stamped with Redis's clock (`at`, and `started` when it has none), and its name
        in the sorted set `seen`, forgetting names stopped more than
        `HEARTBEAT_KEPT_S` ago; one transaction. Returns what was written."""
        now = _seconds(self._r.time())
        started = now if record.started is None else record.started
        written = replace_model(record, at=now, started=started)
        pipe = self._r.pipeline(transaction=True)
        pipe.set(key, written.model_dump_json(), px=ttl_ms)
        pipe.zadd(seen, {record.name: now})
        pipe.zremrangebyscore(seen, "-inf", now - HEARTBEAT_KEPT_S)
        pipe.execute()
        return written

    @translated
    def end_serve(self, name: str) -> None:
        """Removes the record of serve `name`: it stopped cleanly."""
        pipe = self._r.pipeline(transaction=True)
        pipe.delete(self.keys.serve(name))
        pipe.zrem(self.keys.serves, name)
        pipe.execute()

    @translated
    def record_tick(self, task: str) -> float:
        """Records that the periodic task `task` runs now; returns now (Redis's clock)."""
        if not task:
            raise ValueError("a periodic task has a name")
        now = _seconds(self._r.time())
        self._r.hset(self.keys.ticks, task, repr(now))
        return now

    @translated
    def read_health(self, queues: Sequence[str], tasks: Sequence[str]) -> HealthReadings:
        """One reading for the health report: Redis's clock and memory, the processes
        of each role seen in the last `HEARTBEAT_KEPT_S` (at most `PROCESSES_SHOWN`
        each, latest first) with their live heartbeats (at most `HEARTBEAT_BYTES`
        each), when each of `tasks` last ran, the broker's lists of each of `queues`
        and its unacknowledged messages, and the deadline table. Two round trips;
        writes nothing. The live records of `runwarden serve` too (at most
        `PROCESSES_SHOWN`, `HEARTBEAT_BYTES` each).

        A Redis that refuses `INFO` (an ACL) reads as memory not reported; a
        heartbeat or deadline that does not fit its shape reads as absent.

        Raises:
            StoreError: Redis failed.
        """
        lists = [(q, step) for q in queues for step in BROKER_PRIORITY_STEPS]
        pipe = self._r.pipeline(transaction=False)
        pipe.time()
        pipe.info("memory")
        for role in _ROLES:
            pipe.zrevrange(self.keys.heartbeats(role), 0, PROCESSES_SHOWN - 1, withscores=True)
        pipe.zrevrange(self.keys.serves, 0, PROCESSES_SHOWN - 1)
        pipe.hmget(self.keys.ticks, ["-", *tasks])  # HMGET needs one field at least
        for queue, step in lists:
            pipe.llen(self.keys.broker_queue(queue, step))
        pipe.hlen(self.keys.broker_unacked)
        pipe.zcard(self.keys.deadlines)
        pipe.zrange(self.keys.deadlines, 0, 0, withscores=True)
        now_reply, memory, *replies = pipe.execute(raise_on_error=False)
        for reply in (now_reply, *replies):
            if isinstance(reply, RedisError):
                raise reply
        now = _seconds(now_reply)
        seen = {role: [(text(n), float(s)) for n, s in replies.pop(0)] for role in _ROLES}
        serve_names = [text(n) for n in replies.pop(0)]
        ran = replies.pop(0)[1:]
        depths = [int(replies.pop(0)) for _ in lists]
        unacked, pending, first = replies

        pipe = self._r.pipeline(transaction=False)
        for role in _ROLES:
            for name, _ in seen[role]:
                pipe.getrange(self.keys.heartbeat(role, name), 0, HEARTBEAT_BYTES - 1)
        for name in serve_names:
            pipe.getrange(self.keys.serve(name), 0, HEARTBEAT_BYTES - 1)
        pipe.zcount(self.keys.deadlines, "-inf", now)
        *raws, overdue = pipe.execute()
        serve_raws = raws[len(raws) - len(serve_names) :]
        raws = raws[: len(raws) - len(serve_names)]

        processes: dict[Role, list[SeenProcess]] = {role: [] for role in _ROLES}
        for role in _ROLES:
            for name, last in seen[role]:
                beat = _heartbeat(raws.pop(0), name)
                processes[role].append(SeenProcess(name=name, last_seen=last, heartbeat=beat))
        queue_lists: dict[str, dict[int, int]] = {q: {} for q in queues}
        for (queue, step), depth in zip(lists, depths, strict=True):
            queue_lists[queue][step] = depth
        used = maxmemory = None
        if isinstance(memory, dict):
            used, maxmemory = _number(memory.get("used_memory")), _number(memory.get("maxmemory"))
        return HealthReadings(
            now=now,
            used_memory=used,
            maxmemory=maxmemory,
            workers=tuple(processes["worker"]),
            beats=tuple(processes["beat"]),
            ticks={t: v for t, v in zip(tasks, map(_time, ran), strict=True) if v is not None},
            queues=queue_lists,
            unacked=int(unacked),
            deadlines=DeadlinesReading(
                pending=int(pending), overdue=int(overdue), next=_deadline(first)
            ),
            serves=tuple(
                s
                for s in (_serve(r, n) for r, n in zip(serve_raws, serve_names, strict=True))
                if s is not None
            ),
        )


def _heartbeat(raw: Any, name: str) -> Heartbeat | None:
    if not raw:
        return None  # lapsed: the process stopped writing
    try:
        beat = Heartbeat.model_validate_json(raw)
    except ValidationError:
        return None
    return beat if beat.name == name else None


def _serve(raw: Any, name: str) -> ServeState | None:
    if not raw:
        return None  # lapsed: that serve stopped writing
    try:
        state = ServeState.model_validate_json(raw)
    except ValidationError:
        return None
    return state if state.name == name else None


def _deadline(reply: Any) -> Deadline | None:
    if not reply:
        return None
    member, due = reply[0]
    try:
        return Deadline.from_member(text(member), datetime.fromtimestamp(float(due), UTC))
    except ValueError:
        return None
