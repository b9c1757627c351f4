"""What comes home when a run ends: the entries of its run directory to retrieve, by
its final state."""

from __future__ import annotations

from typing import Final

from schemas import RunState, Snapshot
from schemas.protocol import JOB_LOG, OUTPUT_DIR, SNAPSHOT_FILE

__all__ = ["CHECKPOINT_EXCLUDE", "retrieval_plan"]

CHECKPOINT_EXCLUDE: Final = "checkpoint-*"
"""What a succeeded run's `output/` is retrieved without: intermediate checkpoints."""


def retrieval_plan(state: RunState, snapshot: Snapshot | None) -> tuple[list[str], list[str]]:
    """The `(entries, exclude)` to retrieve for a run that ended in `state`: `job.log`
    always; stopped: also `snapshot.json` and the snapshot's checkpoint; succeeded:
    also `output` without any `checkpoint-*` name; failed or cancelled: `job.log`
    alone.

    Raises:
        ValueError: for a run that has not ended (`preparing`, `running`), or a
            stopped run without its snapshot.
    """
    if state is RunState.STOPPED:
        if snapshot is None:
            raise ValueError("a stopped run has a snapshot: none given")
        return [JOB_LOG, SNAPSHOT_FILE, snapshot.checkpoint], []
    if state is RunState.SUCCEEDED:
        return [JOB_LOG, OUTPUT_DIR], [CHECKPOINT_EXCLUDE]
    if state in (RunState.FAILED, RunState.CANCELLED):
        return [JOB_LOG], []
    raise ValueError(f"a {state.value} run has not ended: nothing to retrieve yet")
