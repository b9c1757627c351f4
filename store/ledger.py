"""The stop ledger in the run store: each run's events (`schemas.ledger`), appended
in the order they were recorded and kept as long as the run's record; the index of
runs by their newest event; and the one transaction that records an event: the
append, the metrics it moves and the webhook deliveries it queues, all or nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Final

from pydantic import ValidationError

from schemas import StoreError, validation_message
from schemas.ledger import LEDGER_EVENT, LedgerEvent
from schemas.metrics import Sample

from .base import StoreBase, StorePart, aware, score, text, translated
from .counters import Counters

__all__ = ["HISTORY_PAGE", "Ledger"]

HISTORY_PAGE: Final = 50
"""Runs read per round when the newest events of every run are gathered."""


def _event(raw: bytes | str, run_id: str) -> LedgerEvent:
    try:
        return LEDGER_EVENT.validate_json(raw)
    except ValidationError as error:
        raise StoreError(
            f"run store: a ledger event of run {run_id!r} is unreadable "
            f"({validation_message(error)})"
        ) from error


class Ledger(StorePart):
    """The ledger (`RunStore.ledger`): `record`, `events`, `history`; an event's
    metrics are counted by `counters` in the transaction that records it."""

    def __init__(self, shared: StoreBase, counters: Counters) -> None:
        super().__init__(shared)
        self._counters = counters

    @translated
    def record(
        self,
        event: LedgerEvent,
        samples: Sequence[Sample] = (),
        deliveries: Sequence[tuple[str, str]] = (),
        *,
        now: datetime | None = None,
    ) -> None:
        """Appends `event` to its run's ledger, moves the metrics of `samples`, and
        queues each `(webhook name, delivery JSON)` of `deliveries` on that webhook's
        list for the run (due at `now`, default the current time, unless the list
        already waits: it keeps its turn), in one transaction: all of it or none.

        Raises:
            ValueError: a bad webhook name or a sample with the wrong labels.
            StoreError: Redis failed (the event may then be recorded or not).
        """
        due = score(aware(now or datetime.now(UTC)))
        with self._r.pipeline(transaction=True) as pipe:
            pipe.rpush(self.keys.ledger(event.run_id), event.model_dump_json())
            pipe.zadd(self.keys.ledger_runs, {event.run_id: score(event.at)}, gt=True)
            self._counters.queue(pipe, samples)
            for name, delivery in deliveries:
                member = self.keys.hook_member(name, event.run_id)
                pipe.rpush(self.keys.hook(member), delivery)
                pipe.zadd(self.keys.hooks, {member: due}, nx=True)
            pipe.execute()

    @translated
    def events(self, run_id: str, last: int | None = None) -> list[LedgerEvent]:
        """The ledger of run `run_id`, oldest first (the order recorded): all of it,
        or its `last` newest events. Empty for a run without one.

        Raises:
            StoreError: Redis failed, or an event is unreadable.
        """
        if last is not None and last < 1:
            raise ValueError("last must be at least 1")
        start = 0 if last is None else -last
        raws = self._r.lrange(self.keys.ledger(run_id), start, -1)
        return [_event(raw, run_id) for raw in raws]

    @translated
    def history(self, run_id: str | None = None, limit: int = 500) -> list[LedgerEvent]:
        """The newest `limit` events of run `run_id`, or of every run when None,
        newest first (by `at`; a run's events of one time in reverse order of
        recording). Reads the runs by their newest event, and stops once no run
        left can hold an event newer than the `limit`-th found.

        Raises:
            StoreError: Redis failed, or an event is unreadable.
        """
        if limit < 1:
            raise ValueError("limit must be at least 1")
        if run_id is not None:
            return list(reversed(self.events(run_id, last=limit)))
        found: list[LedgerEvent] = []
        offset = 0
        while True:
            page = self._r.zrevrange(
                self.keys.ledger_runs, offset, offset + HISTORY_PAGE - 1, withscores=True
            )
            if not page:
                break
            for member, newest in page:
                if len(found) >= limit:
                    found = sorted(found, key=lambda e: e.at, reverse=True)[:limit]
                    if newest < score(found[-1].at):
                        return found
                found.extend(reversed(self.events(text(member), last=limit)))
            offset += HISTORY_PAGE
        return sorted(found, key=lambda e: e.at, reverse=True)[:limit]
