"""The end of a run in the run store: its final state, the close of its open stop, the
end of its follow and the expiry of its follow data, in one transaction, so no reader
ever sees a run ended with its stop still open, or a stop closed on a run still
running, and nothing of an ended run's follow stays in Redis past the retention."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from schemas import NotFound, RunRecord, RunState, Snapshot, StopPhase, StopState
from schemas.run import transitioned

from .base import load_model, replace_model, translated
from .follow import FollowMixin
from .stops import StopsMixin, stop_members

__all__ = ["EndingMixin"]


class EndingMixin(FollowMixin, StopsMixin):
    """`end_run`: a run's end and what it closes, at once."""

    @translated
    def end_run(
        self,
        run_id: str,
        to_state: RunState,
        *,
        message: str | None = None,
        snapshot: Snapshot | None = None,
        note: str | None = None,
    ) -> tuple[RunRecord, bool]:
        """Moves run `run_id` to the terminal `to_state` under the rules of
        `schemas.run.transitioned` (which also queues its retrieval), and in the same
        transaction closes its open stop, if any (phase `done`, `note`, its deadlines
        removed, archived in the run's stop history), stops following it, and sets
        its follow data (offsets, log and metrics streams, their byte counts,
        progress) to expire after the retention; the record and the stop history
        stay. Returns the stored record and whether this call changed the run's
        state.

        A run already in `to_state` is left as it is (False), but its stop is still
        closed and its follow ended: a second caller finishes what a first one, killed
        half way through an older, non-atomic end, left.

        Raises:
            NotFound: no such run.
            Conflict: the run already ended in another state (nothing changed), or too
                many concurrent writers.
            ValueError: `to_state` is not terminal.
        """
        if not RunState(to_state).is_terminal:
            raise ValueError(f"{to_state} is not the end of a run")
        run_key, stop_key = self.keys.run(run_id), self.keys.stop(run_id)
        changed = False

        def step(pipe: Any) -> RunRecord:
            nonlocal changed
            raw = pipe.get(run_key)
            if raw is None:
                raise NotFound(run_id)
            current = load_model(RunRecord, raw, f"record of run {run_id!r}")
            now = datetime.now(UTC)
            new = transitioned(current, to_state, now, message=message, snapshot=snapshot)
            stop_raw = pipe.get(stop_key)
            pipe.multi()
            changed = new is not None and new != current
            if new is not None and changed:
                new = RunRecord.model_validate_json(new.model_dump_json())
                pipe.set(run_key, new.model_dump_json())
                self._index_retrieval(pipe, new)
                self._index_continuation(pipe, new)
                self._index_preparing(pipe, current, new)
            if stop_raw is not None:
                stop = load_model(StopState, stop_raw, f"stop of run {run_id!r}")
                self._queue_close(pipe, stop, now, note)
            self._script(
                "unfollow",
                keys=[self.keys.followed(current.target), self.keys.followed_targets],
                args=[run_id, current.target],
                client=pipe,
            )
            self._queue_retention(pipe, run_id)
            return new if new is not None and changed else current

        record, _ = self._compare_and_set(
            [run_key, stop_key],
            step,
            f"run {run_id!r} is being changed by too many writers at once; try again",
            run_id,
        )
        return record, changed

    def _queue_close(self, pipe: Any, stop: StopState, now: datetime, note: str | None) -> None:
        """Queues on `pipe` what `close_stop` does in its script, for a transaction
        that watches the stop's key."""
        changes: dict[str, Any] = {"phase": StopPhase.DONE, "closed_at": now}
        if note is not None:
            changes["note"] = note
        closed = replace_model(stop, **changes)
        history = self.keys.stop_history(stop.run_id)
        pipe.delete(self.keys.stop(stop.run_id))
        pipe.srem(self.keys.stops, stop.run_id)
        pipe.zrem(self.keys.deadlines, *stop_members(stop))
        pipe.lpush(history, closed.model_dump_json())
        pipe.ltrim(history, 0, self._history_cap - 1)
