"""How long a run's saves took, in the run store: the samples its stop budgets are
learned from (`schemas.budget`). Each run keeps its last [`SAVES_KEPT`] samples,
newest first; a resumed run also reads those of the runs it was resumed from.

Samples come from two places: the follow, which pushes the `save` lines of the
metrics it records in the same transaction ([`queue_saves`], so a line is never
counted twice), and the end of a stop that proved ([`Budgets.record_save`]).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any, Final, NamedTuple

from pydantic import ValidationError

from schemas import NotFound, RunRecord
from schemas.budget import BudgetRule, SaveSample

from .base import StoreBase, StorePart, text, translated
from .runs import Runs

__all__ = ["SAVES_KEPT", "Budgets", "PublishedRule", "queue_saves"]

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


class PublishedRule(NamedTuple):
    """The rule a worker decides its stops' timeouts by, as it published it."""

    worker: str
    rule: BudgetRule
    at: datetime
    """When it was published (at the worker's start), on Redis's clock."""


class Budgets(StorePart):
    """Stop budgets (`RunStore.budgets`): the save samples of runs, and the rules the
    workers decide timeouts by."""

    def __init__(self, shared: StoreBase, runs: Runs) -> None:
        super().__init__(shared)
        self._runs = runs

    @translated
    def publish_rule(self, worker: str, rule: BudgetRule) -> None:
        """Records `rule` as the one worker `worker` decides its stops' timeouts by
        (its settings), stamped with Redis's clock, so a producer predicts a stop's
        timeouts as the workers will decide them."""
        if not worker:
            raise ValueError("a published rule needs its worker's name")
        seconds, micros = self._r.time()
        value = {**dataclasses.asdict(rule), "at": int(seconds) + int(micros) / 1e6}
        self._r.hset(self.keys.budget_rules, worker[:255], json.dumps(value))

    @translated
    def rules(self) -> list[PublishedRule]:
        """The rules the workers published, newest first. An entry that cannot be
        read (written by something else) is skipped."""
        found = []
        for name, raw in self._r.hgetall(self.keys.budget_rules).items():
            try:
                fields = json.loads(raw)
                at = datetime.fromtimestamp(float(fields.pop("at")), UTC)
                found.append(PublishedRule(text(name), BudgetRule(**fields), at))
            except (ValueError, TypeError, KeyError, AttributeError, OverflowError):
                continue
        return sorted(found, key=lambda published: published.at, reverse=True)

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
    def learned(self, run: RunRecord) -> list[SaveSample]:
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
                earlier = self._runs.get(source)
            except NotFound:
                break
            found += self.saves(earlier.id)
            source = earlier.resumed_from
        return found[:SAVES_KEPT]
