"""The queue of waiting continuations in the run store: preempted runs whose next run
is not launched yet (`schemas.chain`), by the time of their next try. A run's record
(`continuation`) and its place in the queue change in one transaction
(`Runs.update`, `steps.end_run`); these methods read the queue and move an entry
ahead (`reconcile` sending a try, a try that found no target)."""

from __future__ import annotations

from datetime import datetime

from schemas import validate_run_id

from .base import StorePart, aware, score, text, translated

__all__ = ["Continuations"]


class Continuations(StorePart):
    """The queue of waiting continuations."""

    @translated
    def due(self, now: datetime, limit: int = 100) -> list[str]:
        """The ids of at most `limit` runs whose continuation is waiting and due at
        `now`, the longest due first. An entry stays until the record's continuation
        leaves `waiting`."""
        found = self._r.zrangebyscore(
            self.keys.continuations, "-inf", score(aware(now)), start=0, num=limit
        )
        return [text(m) for m in found]

    @translated
    def schedule(self, run_id: str, at: datetime) -> bool:
        """Moves the waiting continuation of `run_id` to `at`; whether it was
        waiting (an entry that left the queue is not put back)."""
        key, member = self.keys.continuations, validate_run_id(run_id)
        with self._r.pipeline(transaction=True) as pipe:
            pipe.zadd(key, {member: score(aware(at))}, xx=True)
            pipe.zscore(key, member)
            _, found = pipe.execute()
        return found is not None
