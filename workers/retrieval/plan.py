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
    always; with a snapshot (a stopped run, or a failed one whose job proved one
    before it failed) also `snapshot.json` and the snapshot's checkpoint; succeeded:
    also `output` without any `checkpoint-*` name.

    Raises:
        ValueError: for a run that has not ended (`preparing`, `running`), or a
            stopped run without its snapshot.
    """
    if not state.is_terminal:
        raise ValueError(f"a {state.value} run has not ended: nothing to retrieve yet")
    if state is RunState.STOPPED and snapshot is None:
        raise ValueError("a stopped run has a snapshot: none given")
    if state is RunState.SUCCEEDED:
        return [JOB_LOG, OUTPUT_DIR], [CHECKPOINT_EXCLUDE]
    if snapshot is not None:
        return [JOB_LOG, SNAPSHOT_FILE, snapshot.checkpoint], []
    return [JOB_LOG], []
