"""The retrieval queue in the run store: runs whose artifacts are to be retrieved,
by the time of their next attempt. A run's record (`artifacts`) and its place in the
queue change in one transaction (`Runs.update`); these methods move or drop
the queue entry alone (the reconciler's resend, a finished retrieval)."""

from __future__ import annotations

from datetime import UTC, datetime

from schemas import validate_run_id

from .base import StorePart, aware, score, text, translated

__all__ = ["Retrievals"]


class Retrievals(StorePart):
    """The queue of pending retrievals (`RunStore.retrievals`)."""

    @translated
    def schedule(self, run_id: str, at: datetime) -> None:
        """Marks the artifacts of run `run_id` as to be retrieved at `at` (or moves its
        next attempt there). Durable: [`Retrievals.due`] returns it until
        [`Retrievals.drop`]."""
        self._r.zadd(self.keys.retrievals, {validate_run_id(run_id): score(aware(at))})

    @translated
    def due(self, now: datetime, limit: int = 100) -> list[str]:
        """Ids of the runs whose retrieval is due at or before `now`, earliest first."""
        if limit < 1:
            raise ValueError("limit must be at least 1")
        reply = self._r.zrangebyscore(
            self.keys.retrievals, "-inf", score(aware(now)), start=0, num=limit
        )
        return [text(member) for member in reply]

    @translated
    def pending(self, limit: int = 1000) -> list[tuple[str, datetime]]:
        """Every scheduled retrieval with its next attempt, earliest first."""
        reply = self._r.zrange(self.keys.retrievals, 0, limit - 1, withscores=True)
        return [(text(m), datetime.fromtimestamp(due, UTC)) for m, due in reply]

    @translated
    def drop(self, run_id: str) -> bool:
        """Removes run `run_id` from the scheduled retrievals; whether it was there."""
        return bool(self._r.zrem(self.keys.retrievals, validate_run_id(run_id)))
