"""The steps of the run store that span several of its parts, as functions of the
whole store.

`end_run`: the end of a run, its final state, the close of its open stop, the end of
its follow and the expiry of its follow data, in one transaction, so no reader ever
sees a run ended with its stop still open, or a stop closed on a run still running,
and nothing of an ended run's follow stays in Redis past the retention."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from schemas import NotFound, RunRecord, RunState, Snapshot, StopState
from schemas.run import transitioned

from .base import load_model, translated
from .runs import index_continuation, index_preparing, index_retrieval

if TYPE_CHECKING:
    from .runstore import RunStore

__all__ = ["end_run"]


@translated
def end_run(
    store: RunStore,
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

    It waits for the configured replicas (`StoreBase.replicated`): the close of
    the stop removes its deadlines.

    A run already in `to_state` is left as it is (False), but its stop is still
    closed and its follow ended: a second caller finishes what a first one, killed
    half way through an older, non-atomic end, left.

    Raises:
        NotFound: no such run.
        Conflict: the run already ended in another state (nothing changed), or too
            many concurrent writers.
        NotReplicated: too few replicas acknowledged the end in time.
        ValueError: `to_state` is not terminal.
    """
    if not RunState(to_state).is_terminal:
        raise ValueError(f"{to_state} is not the end of a run")
    run_key, stop_key = store.keys.run(run_id), store.keys.stop(run_id)
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
            index_retrieval(store.keys, pipe, new)
            index_continuation(store.keys, pipe, new)
            index_preparing(store.keys, pipe, current, new)
        if stop_raw is not None:
            stop = load_model(StopState, stop_raw, f"stop of run {run_id!r}")
            store.stops.queue_close(pipe, stop, now, note)
        store.follow.queue_remove(pipe, run_id, current.target)
        store.follow.queue_retention(pipe, run_id)
        return new if new is not None and changed else current

    record, _ = store.compare_and_set(
        [run_key, stop_key],
        step,
        f"run {run_id!r} is being changed by too many writers at once; try again",
        run_id,
    )
    store.replicated(f"the end of run {run_id!r}")
    return record, changed
