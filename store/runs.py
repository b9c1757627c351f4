"""Runs in the run store: records, their indexes (all runs and runs by target, by
creation time), and state transitions as compare-and-set (WATCH/MULTI, bounded
retries) under the rules of `schemas.run.transitioned`."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from datetime import UTC, datetime
from typing import Any

from schemas import (
    ArtifactsPhase,
    Conflict,
    JobId,
    NotFound,
    RunRecord,
    RunState,
    Snapshot,
    validate_run_id,
)
from schemas.chain import ContinuationPhase
from schemas.run import transitioned

from .base import StorePart, aware, load_model, score, text, translated
from .keys import Keys

__all__ = ["Runs", "index_continuation", "index_preparing", "index_retrieval"]

_CHUNK = 500
"""Records read per MGET when listing runs."""


def index_preparing(keys: Keys, pipe: Any, current: RunRecord, new: RunRecord) -> None:
    """Takes a run that leaves `preparing` out of the index of preparing runs (and
    its launch key out of theirs), and moves it between the sets of runs by state
    (`Keys.runs_in`), in the same transaction as its record."""
    if current.state is RunState.PREPARING and new.state is not RunState.PREPARING:
        pipe.zrem(keys.preparing, new.id)
        pipe.hdel(keys.preparing_keys, new.id)
    if current.state is not new.state:
        pipe.srem(keys.runs_in(str(current.state)), new.id)
    pipe.sadd(keys.runs_in(str(new.state)), new.id)


def index_continuation(keys: Keys, pipe: Any, record: RunRecord) -> None:
    """Keeps the queue of waiting continuations in step with the record's
    `continuation`, in the same transaction: waiting -> queued; else not."""
    waiting = record.continuation
    queued = waiting is not None and waiting.phase is ContinuationPhase.WAITING
    _queue(pipe, keys.continuations, record.id, waiting.at if waiting and queued else None, queued)


def index_retrieval(keys: Keys, pipe: Any, record: RunRecord) -> None:
    """Keeps the retrieval queue in step with the record's `artifacts`, in the
    same transaction: pending -> queued at its next attempt; else not queued."""
    artifacts = record.artifacts
    queued = artifacts is not None and artifacts.phase is ArtifactsPhase.PENDING
    due = artifacts.next_attempt if artifacts and queued else None
    _queue(pipe, keys.retrievals, record.id, due, queued)


def _queue(pipe: Any, key: str, run_id: str, due: datetime | None, queued: bool) -> None:
    """Queues on `pipe` the run in the sorted set `key` at `due` (now when None), or
    its removal when not `queued`."""
    if queued:
        pipe.zadd(key, {run_id: score(aware(due or datetime.now(UTC)))})
    else:
        pipe.zrem(key, run_id)


class Runs(StorePart):
    """Run records (`RunStore.runs`): create, read, find, update, transition."""

    @translated
    def create(
        self, record: RunRecord, *, key: str | None = None, replaces: str | None = None
    ) -> bool:
        """Stores a new run record, atomically with its indexes (a `preparing` record
        also in the index of preparing runs, with its launch key). False (and nothing
        changed) when a run with this id already exists.

        With `key` (a launch's idempotency key, `schemas.idempotency`), the key is
        mapped to this run in the same step ([`Launches.launch`]); the key must be free,
        or map to `replaces` (the run whose claimed directory was taken, which the
        launch gives up for the next id). A key that maps to this very run already
        answers True, changing nothing: a retry of a creation whose reply was lost.

        Raises:
            Conflict: the key maps to another run (nothing changed).
            ValueError: an invalid key or `replaces` id.
        """
        keys = [
            self.keys.run(record.id),
            self.keys.runs,
            self.keys.runs_of(record.target),
            self.keys.preparing,
            self.keys.preparing_keys,
            self.keys.runs_in(str(record.state)),
        ]
        if key is not None:
            keys.append(self.keys.launch(key))
        elif replaces is not None:
            raise ValueError("replaces goes with a launch key")
        preparing = "1" if record.state is RunState.PREPARING else "0"
        done = self._script(
            "create_run",
            keys=keys,
            args=[
                record.model_dump_json(),
                record.created.timestamp(),
                record.id,
                preparing,
                key or "",
                "" if replaces is None else validate_run_id(replaces),
            ],
        )
        if done == -1:
            raise Conflict(
                f"launch key {key!r} already belongs to another run than {record.id!r}",
                run_id=record.id,
            )
        return bool(done)

    @translated
    def get(self, run_id: str) -> RunRecord:
        """The record of run `run_id`. Raises `NotFound` when there is none."""
        raw = self._r.get(self.keys.run(run_id))
        if raw is None:
            raise NotFound(run_id)
        return load_model(RunRecord, raw, f"record of run {run_id!r}")

    @translated
    def get_many(self, run_ids: Sequence[str]) -> list[RunRecord | None]:
        """The records of `run_ids`, in order, in one round trip (MGET); None for a run
        that does not exist. Raises `StoreError` for an unreadable record."""
        if not run_ids:
            return []
        raws = self._r.mget([self.keys.run(run_id) for run_id in run_ids])
        return [
            None if raw is None else load_model(RunRecord, raw, f"record of run {run_id!r}")
            for run_id, raw in zip(run_ids, raws, strict=True)
        ]

    @translated
    def count_by_state(self) -> dict[RunState, int]:
        """How many runs are in each state, from the sets of runs by state
        (`Keys.runs_in`, kept by every write of a record): one round trip, whatever
        the number of runs. On a store from before those sets, the first call builds
        them from the records, once (`_index_states`)."""
        if not self._r.exists(self.keys.runs_by_state):
            self._index_states()
        pipe = self._r.pipeline(transaction=False)
        for state in RunState:
            pipe.scard(self.keys.runs_in(str(state)))
        return {state: int(n) for state, n in zip(RunState, pipe.execute(), strict=True)}

    def _index_states(self) -> None:
        """Puts every run in the set of its state and in no other, each under a watch
        of its record (a writer meanwhile is never undone: the run is read again),
        then sets the marker that they are complete."""
        others = [self.keys.runs_in(str(state)) for state in RunState]
        for raw_id in self._r.zrange(self.keys.runs, 0, -1):
            run_id = text(raw_id)
            key = self.keys.run(run_id)

            def step(pipe: Any, key: str = key, run_id: str = run_id) -> None:
                raw = pipe.get(key)
                if raw is None:
                    pipe.unwatch()
                    return
                record = load_model(RunRecord, raw, f"record of run {run_id!r}")
                pipe.multi()
                for other in others:
                    pipe.srem(other, run_id)
                pipe.sadd(self.keys.runs_in(str(record.state)), run_id)

            self._compare_and_set([key], step, f"run {run_id!r} changes too often", run_id)
        self._r.set(self.keys.runs_by_state, "1")

    @translated
    def find(
        self,
        target: str | None = None,
        states: Iterable[RunState] | None = None,
        limit: int | None = None,
    ) -> list[RunRecord]:
        """Runs, newest `created` first (equal times: by id, descending), of `target`
        when given, in one of `states` when given, at most `limit` of them."""
        index = self.keys.runs if target is None else self.keys.runs_of(target)
        wanted = None if states is None else {RunState(s) for s in states}
        if limit is not None and limit < 1:
            raise ValueError("limit must be at least 1")
        last = limit - 1 if wanted is None and limit is not None else -1
        ids = [text(i) for i in self._r.zrevrange(index, 0, last)]
        runs: list[RunRecord] = []
        for start in range(0, len(ids), _CHUNK):
            chunk = ids[start : start + _CHUNK]
            raws = self._r.mget([self.keys.run(i) for i in chunk])
            for run_id, raw in zip(chunk, raws, strict=True):
                if raw is None:
                    continue
                record = load_model(RunRecord, raw, f"record of run {run_id!r}")
                if wanted is None or record.state in wanted:
                    runs.append(record)
                    if limit is not None and len(runs) >= limit:
                        return runs
        return runs

    @translated
    def update(self, run_id: str, mutate: Callable[[RunRecord], RunRecord | None]) -> RunRecord:
        """Applies `mutate` to run `run_id` as one optimistic transaction (WATCH/MULTI)
        and returns the record stored after the call.

        `mutate` gets a fresh copy of the stored record and returns the new record,
        or None to leave it unchanged. It may be called several times (once per
        attempt, when another writer changed the record meanwhile), so it must not
        have side effects; an exception it raises propagates, nothing changed. The
        new record is validated; its `id` must not change (a changed `target` or
        `created` moves the run in the indexes). A change of `artifacts` moves the run
        in the retrieval queue in the same transaction.

        Raises:
            NotFound: no such run.
            Conflict: still losing to other writers after the bounded attempts.
            ValueError: the new record is invalid or changes the id.
        """
        return self._update(run_id, mutate)[0]

    def _update(
        self, run_id: str, mutate: Callable[[RunRecord], RunRecord | None]
    ) -> tuple[RunRecord, bool]:
        key = self.keys.run(run_id)

        def step(pipe: Any) -> tuple[RunRecord, bool]:
            raw = pipe.get(key)
            if raw is None:
                raise NotFound(run_id)
            current = load_model(RunRecord, raw, f"record of run {run_id!r}")
            new = mutate(current.model_copy(deep=True))
            if new is None or new == current:
                pipe.unwatch()
                return current, False
            new = RunRecord.model_validate_json(new.model_dump_json())
            if new.id != run_id:
                raise ValueError("an update cannot change a run's id")
            pipe.multi()
            pipe.set(key, new.model_dump_json())
            if new.artifacts != current.artifacts:
                index_retrieval(self.keys, pipe, new)
            if new.continuation != current.continuation:
                index_continuation(self.keys, pipe, new)
            index_preparing(self.keys, pipe, current, new)
            created = new.created.timestamp()
            if new.target != current.target:
                pipe.zrem(self.keys.runs_of(current.target), run_id)
            pipe.zadd(self.keys.runs, {run_id: created})
            pipe.zadd(self.keys.runs_of(new.target), {run_id: created})
            return new, True

        updated, _ = self._compare_and_set(
            [key],
            step,
            f"run {run_id!r} is being changed by too many writers at once; try again",
            run_id,
        )
        return updated

    @translated
    def transition(
        self,
        run_id: str,
        to_state: RunState,
        *,
        message: str | None = None,
        snapshot: Snapshot | None = None,
        job: JobId | None = None,
        expect: set[RunState] | None = None,
    ) -> RunRecord:
        """Moves run `run_id` to `to_state` atomically and returns the stored record.
        Same as [`Runs.apply_transition`], without saying whether anything changed."""
        return self.apply_transition(
            run_id, to_state, message=message, snapshot=snapshot, job=job, expect=expect
        )[0]

    @translated
    def apply_transition(
        self,
        run_id: str,
        to_state: RunState,
        *,
        message: str | None = None,
        snapshot: Snapshot | None = None,
        job: JobId | None = None,
        expect: set[RunState] | None = None,
    ) -> tuple[RunRecord, bool]:
        """Moves run `run_id` to `to_state` as one compare-and-set, under the rules of
        `schemas.run.transitioned` (checked against the stored record inside the
        transaction), and returns the stored record and whether this call changed it.
        To make an effect happen once ("the outcome is recorded by one worker"), act
        only when this returns True.

        Raises:
            NotFound: no such run.
            Conflict: by the rules (nothing changed), or too many concurrent writers.
        """

        def mutate(current: RunRecord) -> RunRecord | None:
            return transitioned(
                current,
                to_state,
                datetime.now(UTC),
                message=message,
                snapshot=snapshot,
                job=job,
                expect=expect,
            )

        return self._update(run_id, mutate)
