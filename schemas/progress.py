"""How far a run got: its progress from the metrics lines its job wrote (`begin`,
`log`, `end`), and the pure rule that folds metrics records into it. The store keeps
the folded fields beside the capped metrics stream, so `max_steps` of the `begin` line
survives the trimming."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["Progress", "finite", "progress_fields"]


class Progress(BaseModel):
    """How far a run got, from the metrics lines its job wrote (`begin`, `log`, `end`)
    as the follower recorded them. Every field is None until a line carried it."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    max_steps: Annotated[int, Field(ge=0)] | None = None
    """From the `begin` line."""
    step: Annotated[int, Field(ge=0)] | None = None
    """The step of the newest `log` (or `end`) line."""
    loss: float | None = None
    """The newest finite `loss` of a `log` line."""
    loss_step: Annotated[int, Field(ge=0)] | None = None
    """The step that `loss` was logged at."""
    time: float | None = None
    """Unix seconds of the newest line that had a numeric `time`."""
    ended: bool = False
    """Whether an `end` line was seen."""


def _is_step(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**63


def _is_number(value: Any) -> bool:
    """A finite number that fits a float (an integer of 400 digits does not)."""
    if not isinstance(value, int | float) or isinstance(value, bool):
        return False
    try:
        return math.isfinite(float(value))
    except OverflowError:
        return False


def progress_fields(records: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The [`Progress`] fields that `records` (metrics records, in order) set, later
    records winning: `max_steps` from a `begin` line, `step` from a `log` or `end`
    line, `loss` and `loss_step` from a `log` line with a finite loss, `time` from any
    line with a finite numeric time, `ended` from an `end` line. Values of the wrong
    type or range are ignored, never an error: the records come from the job."""
    fields: dict[str, Any] = {}
    for record in records:
        event, step = record.get("event"), record.get("step")
        if _is_number(record.get("time")):
            fields["time"] = float(record["time"])
        if event == "begin" and _is_step(record.get("max_steps")):
            fields["max_steps"] = record["max_steps"]
        elif event in ("log", "end") and _is_step(step):
            fields["step"] = step
            if event == "log" and _is_number(record.get("loss")):
                fields["loss"], fields["loss_step"] = float(record["loss"]), step
        if event == "end":
            fields["ended"] = True
    return fields


def finite(value: Any) -> Any:
    """`value` with every NaN or infinity replaced by None, at any depth (strict JSON,
    as the job side writes them)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, Mapping):
        return {str(k): finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [finite(v) for v in value]
    return value
