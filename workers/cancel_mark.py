"""The once-marker a cancel holds while it is under way (`workers.cancels`): its key,
how long it lasts, and whether one is held. The end of a run (`workers.finish`) and
the follow (`workers.watch`) leave to such a cancel what it records itself."""

from __future__ import annotations

from typing import Final

from .context import Context

__all__ = ["CANCEL_RETRY_MAX_S", "CANCEL_RETRY_S", "cancel_key", "cancelling_now"]

CANCEL_RETRY_S: Final = 60.0
"""When a cancel failed (the group survived, the target was unreachable, its script
was cut at its deadline), how long until `reconcile` tries it again, in seconds;
doubled after each failed try, up to [`CANCEL_RETRY_MAX_S`]. Also how long a
worker that died while cancelling keeps another task from signalling the job
again."""
CANCEL_RETRY_MAX_S: Final = 3600.0


def cancel_key(run_id: str) -> str:
    """The once-marker held while a cancel of the run is under way (`_cancel_once`),
    for `CANCEL_RETRY_S` from its start."""
    return f"cancel:{run_id}"


def cancelling_now(ctx: Context, run_id: str) -> bool:
    """Whether a cancel of the run is under way (or began less than `CANCEL_RETRY_S`
    ago): its task records the run's end itself."""
    return ctx.store.locks.marked(cancel_key(run_id))
