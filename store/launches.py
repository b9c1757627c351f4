"""Launches in the run store: the map from a launch's idempotency key to the run it
started, the index of the runs still `preparing` (their launch at work, or its worker
dead), and the start of a run: `running` with its job and followed, in one step.

The key's map and the index are written by the script that creates the record
(`Runs.create`) and the index is left in the transaction that moves the run
on, so no reader sees a run without its key, or a preparing run missing from the
index."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from schemas import JobId, NotFound, RunRecord, RunState, validate_run_id
from schemas.run import transitioned

from .base import StoreBase, StorePart, aware, load_model, score, text, translated
from .follow import Follow
from .runs import index_preparing

__all__ = ["Launches"]


class Launches(StorePart):
    """Launches (`RunStore.launches`): launch keys, the preparing runs, and the start
    of a run (which follows it: the `follow` part)."""

    def __init__(self, shared: StoreBase, follow: Follow) -> None:
        super().__init__(shared)
        self._follow = follow

    @translated
    def launch(self, key: str) -> str | None:
        """The id of the run the launch with idempotency key `key` started, or None
        when no launch with that key created a run yet.

        Raises:
            ValueError: an invalid key (`schemas.idempotency`).
        """
        raw = self._r.get(self.keys.launch(key))
        return None if raw is None else text(raw)

    @translated
    def preparing(self, created_before: datetime, limit: int = 100) -> list[tuple[str, str | None]]:
        """The runs in `preparing` created at or before `created_before`, oldest
        first, at most `limit`, each with its launch key (None for a run created
        without one)."""
        if limit < 1:
            raise ValueError("limit must be at least 1")
        ids = [
            text(i)
            for i in self._r.zrangebyscore(
                self.keys.preparing, "-inf", score(aware(created_before)), start=0, num=limit
            )
        ]
        if not ids:
            return []
        found = self._r.hmget(self.keys.preparing_keys, ids)
        return [
            (run_id, None if key is None else text(key))
            for run_id, key in zip(ids, found, strict=True)
        ]

    @translated
    def forget(self, run_id: str) -> bool:
        """Takes run `run_id` out of the index of preparing runs when its record is not
        `preparing` (or is gone): a repair, for an entry left by a writer that
        bypassed the store's transactions. Whether it removed it."""
        key = self.keys.run(run_id)

        def step(pipe: Any) -> bool:
            raw = pipe.get(key)
            if raw is not None:
                record = load_model(RunRecord, raw, f"record of run {run_id!r}")
                if record.state is RunState.PREPARING:
                    pipe.unwatch()
                    return False
            pipe.multi()
            pipe.zrem(self.keys.preparing, run_id)
            pipe.hdel(self.keys.preparing_keys, run_id)
            return True

        queued, replies = self._compare_and_set(
            [key], step, f"run {run_id!r} is being changed by too many writers at once", run_id
        )
        return queued and bool(replies[0])

    @translated
    def start(self, run_id: str, job: JobId) -> tuple[RunRecord, bool]:
        """Moves the `preparing` run `run_id` to `running` with `job` and follows it,
        in one transaction: no crash leaves it running and unfollowed. Returns the
        stored record and whether this call changed it. A run already running with
        this very job changes nothing but is followed (again).

        Raises:
            NotFound: no such run.
            Conflict: the run ended, or runs another job (nothing changed), or too
                many concurrent writers.
        """
        key = self.keys.run(validate_run_id(run_id))

        def step(pipe: Any) -> tuple[RunRecord, bool]:
            raw = pipe.get(key)
            if raw is None:
                raise NotFound(run_id)
            current = load_model(RunRecord, raw, f"record of run {run_id!r}")
            new: RunRecord | None = None
            if not (current.state is RunState.RUNNING and current.job == job):
                new = transitioned(
                    current,
                    RunState.RUNNING,
                    datetime.now(UTC),
                    job=job,
                    expect={RunState.PREPARING},
                )
            pipe.multi()
            if new is not None:
                new = RunRecord.model_validate_json(new.model_dump_json())
                pipe.set(key, new.model_dump_json())
                index_preparing(self.keys, pipe, current, new)
            self._follow.queue_add(pipe, run_id, current.target)
            return (current, False) if new is None else (new, True)

        started, _ = self._compare_and_set(
            [key],
            step,
            f"run {run_id!r} is being changed by too many writers at once; try again",
            run_id,
        )
        return started
