"""`producers.api.Runwarden.resume_spec`: a resumed run keeps what its source was
launched with, its own stop timeouts included."""

from __future__ import annotations

from datetime import UTC, datetime

import fakeredis

from producers.api import Runwarden
from schemas import Artifacts, ArtifactsPhase, RunLimits, RunState, Settings, Snapshot
from schemas.budget import StopTimeouts
from store import RunStore

from ..conftest import record


def test_a_resume_keeps_the_runs_own_timeouts() -> None:
    api = Runwarden(Settings())
    api._store = RunStore(fakeredis.FakeRedis(server=fakeredis.FakeServer()))
    own = StopTimeouts(proof_timeout_s=45, end_timeout_s=20)
    source = record(
        id="s1",
        state=RunState.STOPPED,
        snapshot=Snapshot(checkpoint="output/checkpoint-4", step=4, reason="requested"),  # type: ignore[arg-type]
        artifacts=Artifacts(phase=ArtifactsPhase.DONE, retrieved=datetime.now(UTC)),
        limits=RunLimits(max_hours=2),
        timeouts=own,
    )
    assert api.store.runs.create(source)
    spec = api.resume_spec("s1")
    assert (spec.resume_from, spec.timeouts, spec.limits) == ("s1", own, source.limits)
