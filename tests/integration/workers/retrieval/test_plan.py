"""`workers.retrieval.plan`: what comes home when a run ends, by its final state."""

from __future__ import annotations

import pytest

from schemas import RunState
from workers.retrieval import retrieval_plan

from .conftest import SNAPSHOT


def test_plans() -> None:
    assert retrieval_plan(RunState.STOPPED, SNAPSHOT) == (
        ["job.log", "snapshot.json", "output/checkpoint-6"],
        [],
    )
    assert retrieval_plan(RunState.SUCCEEDED, None) == (["job.log", "output"], ["checkpoint-*"])
    assert retrieval_plan(RunState.FAILED, None) == (["job.log"], [])
    assert retrieval_plan(RunState.CANCELLED, None) == (["job.log"], [])
    # A proof is never thrown away: a job that proved, then failed, brings it home.
    assert retrieval_plan(RunState.FAILED, SNAPSHOT) == (
        ["job.log", "snapshot.json", "output/checkpoint-6"],
        [],
    )
    for state in (RunState.PREPARING, RunState.RUNNING):
        with pytest.raises(ValueError, match="not ended"):
            retrieval_plan(state, None)
    with pytest.raises(ValueError, match="snapshot"):
        retrieval_plan(RunState.STOPPED, None)
