"""`runwarden_loop.StopPoint` on one process (no `torch.distributed`): the contract's
edges. Under torchrun, with a real loop: tests/integration/workers/jobside/."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from workers.jobside import runwarden_job as job
from workers.jobside import runwarden_loop as loop
from workers.jobside import runwarden_preempt as preempt


@pytest.fixture
def run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv(job.REQUEST_ENV, str(tmp_path / job.SNAPSHOT_REQUEST))
    return tmp_path


def test_a_request_stops_once_and_is_proved_after_the_checkpoint(run: Path) -> None:
    with loop.StopPoint("") as stop:
        assert stop.reached(1, last_step=10) is None
        (run / job.SNAPSHOT_REQUEST).write_text("cost")
        assert stop.reached(2, last_step=10) == "cost"
        assert stop.reached(3, last_step=10) == "cost"  # the same answer again
        assert stop.stop_step == 2
        with pytest.raises(RuntimeError, match="step 3"):
            stop.prove(3)  # not the step it stopped at
        with pytest.raises(FileNotFoundError, match="not saved"):
            stop.prove(2)  # no checkpoint yet: no proof
        assert not (run / job.SNAPSHOT_FILE).exists()
        assert stop.checkpoint(2) == str(run / "output" / "checkpoint-2")
        Path(stop.checkpoint(2)).mkdir(parents=True)
        (Path(stop.checkpoint(2)) / "model.pt").write_bytes(b"weights")
        assert stop.prove(2) == str(run / job.SNAPSHOT_FILE)
    proof = json.loads((run / job.SNAPSHOT_FILE).read_text())
    assert (proof["checkpoint"], proof["step"], proof["reason"]) == (
        "output/checkpoint-2",
        2,
        "cost",
    )


def test_a_request_at_the_last_step_changes_nothing(run: Path) -> None:
    (run / job.SNAPSHOT_REQUEST).write_text("requested")
    with loop.StopPoint("") as stop:
        assert stop.reached(10, last_step=10) is None
        assert stop.reached(9, last_step=10) == "requested"


def test_the_signals_are_installed_and_restored(run: Path) -> None:
    with loop.StopPoint("USR2") as stop:
        assert preempt.installed_signals()
        assert stop.reached(1) is None
    assert not preempt.installed_signals()
