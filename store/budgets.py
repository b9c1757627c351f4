"""How long a run's saves took, in the run store: the samples its stop budgets are
learned from (`schemas.budget`). Each run keeps its last [`SAVES_KEPT`] samples,
newest first; a resumed run also reads those of the runs it was resumed from.

Samples come from two places: the follow, which pushes the `save` lines of the
metrics it records in the same transaction ([`queue_saves`], so a line is never
counted twice), and the end of a stop that proved ([`BudgetsMixin.record_save`]).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

from pydantic import ValidationError

from schemas import NotFound, RunRecord
from schemas.budget import SaveSample

from .base import text, translated
from .runs import RunsMixin

__all__ = ["SAVES_KEPT", "BudgetsMixin", "queue_saves"]

SAVES_KEPT: Final = 20
"""Samples kept per run (the newest), and the most a run's budget is learned from,
its resume sources' included."""
_RESUME_DEPTH: Final = 20
"""Resume sources read at most, newest first (a chain of resumes is walked no
further)."""


def queue_saves(pipe: Any, key: str, samples: Sequence[SaveSample]) -> None:
    """Queues on `pipe` the push of `samples` (oldest first, so the newest ends up
    first) onto the samples list `key`, trimmed to [`SAVES_KEPT`]: for a transaction
    that records what the samples come from."""
    if not samples:
        return
    pipe.lpush(key, *(s.model_dump_json() for s in samples))
    pipe.ltrim(key, 0, SAVES_KEPT - 1)


class BudgetsMixin(RunsMixin):
    """The save samples of runs."""

    @translated
    def record_save(self, run_id: str, sample: SaveSample) -> None:
        """Pushes `sample` onto the samples of run `run_id` (trimmed to the newest
        [`SAVES_KEPT`]), in one transaction."""
        with self._r.pipeline(transaction=True) as pipe:
            queue_saves(pipe, self.keys.saves(run_id), [sample])
            pipe.execute()

    @translated
    def saves(self, run_id: str) -> list[SaveSample]:
        """The samples of run `run_id` alone, newest first. A stored entry that cannot
        be read (written by something else) is skipped."""
        raws = self._r.lrange(self.keys.saves(run_id), 0, SAVES_KEPT - 1)
        found: list[SaveSample] = []
        for raw in raws:
            try:
                found.append(SaveSample.model_validate_json(text(raw)))
            except ValidationError:
                continue
        return found

    @translated
    def learned_saves(self, run: RunRecord) -> list[SaveSample]:
        """The samples a stop of `run` learns from, newest first, at most
        [`SAVES_KEPT`]: its own, then (while fewer) those of the run it was resumed
        from, and of that run's source, and so on: a resumed run starts with what its
        sources learned. A source that no longer exists, or a cycle, ends the walk."""
        found = self.saves(run.id)
        seen = {run.id}
        source = run.resumed_from
        for _ in range(_RESUME_DEPTH):
            if len(found) >= SAVES_KEPT or source is None or source in seen:
                break
            seen.add(source)
            try:
                earlier = self.get_run(source)
            except NotFound:
                break
            found += self.saves(earlier.id)
            source = earlier.resumed_from
        return found[:SAVES_KEPT]
