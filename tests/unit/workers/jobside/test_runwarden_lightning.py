"""`runwarden_lightning`: importing it imports neither Lightning nor torch; the
callback's logic (its hooks, with a stand-in for the Trainer, on one process) at the
contract's edges; `resume_checkpoint`. A real fit on one and two ranks:
tests/integration/workers/jobside/test_runwarden_lightning.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from workers import jobside
from workers.jobside import runwarden_job as job
from workers.jobside import runwarden_lightning as lightning
from workers.jobside import runwarden_preempt as preempt

from .conftest import JOBSIDE, read_jsonl


@pytest.fixture
def run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A run directory, named by the environment as launch would."""
    monkeypatch.setenv(job.REQUEST_ENV, str(tmp_path / job.SNAPSHOT_REQUEST))
    monkeypatch.setenv(job.METRICS_ENV, str(tmp_path / job.METRICS_FILE))
    return tmp_path


class Trainer:
    """What the callback reads and calls of a Lightning Trainer, on one process."""

    def __init__(self, run_dir: Path, last_step: int | float = 10) -> None:
        self.run_dir = run_dir
        self.global_step = 0
        self.estimated_stepping_batches = last_step
        self.is_global_zero = True
        self.should_stop = False
        self.saved: list[str] = []

    def save_checkpoint(self, path: str) -> None:
        # Saved before any proof exists.
        assert not (self.run_dir / job.SNAPSHOT_FILE).exists()
        os.makedirs(os.path.dirname(path), exist_ok=True)
        Path(path).write_bytes(b"weights")
        self.saved.append(path)


def batch_end(callback: Any, trainer: Trainer, loss: float = 0.5) -> None:
    callback.on_train_batch_end(trainer, None, {"loss": loss}, None, 0)


def test_importing_it_imports_neither_torch_nor_lightning() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RUNWARDEN_")}
    out = subprocess.run(
        [sys.executable, "-c",
         "import sys, runwarden_lightning\n"
         "print(sorted({'torch', 'lightning', 'pytorch_lightning', 'numpy'} & set(sys.modules)),"
         " runwarden_lightning.resume_checkpoint())\n"],
        env={**env, "PYTHONPATH": str(JOBSIDE)}, capture_output=True, text=True, check=True,
        timeout=60,
    ).stdout  # fmt: skip
    assert out.split() == ["[]", "None"]
    assert "runwarden_lightning.py" in jobside.JOBSIDE_FILES
    assert "RunwardenCallback" not in lightning.__all__


def test_a_request_saves_then_proves_then_stops_at_a_step_end(run: Path) -> None:
    trainer, callback = Trainer(run), lightning._RunwardenLogic("")
    callback.on_train_start(trainer, None)
    trainer.global_step = 1
    batch_end(callback, trainer)
    (run / job.SNAPSHOT_REQUEST).write_text("cost")
    # Accumulating gradients: the batch ended no step, so nothing is decided.
    batch_end(callback, trainer)
    assert not trainer.saved
    assert not trainer.should_stop
    trainer.global_step = 2
    batch_end(callback, trainer, loss=0.25)
    checkpoint = run / "output" / "checkpoint-2"
    assert trainer.saved == [str(checkpoint / lightning.CHECKPOINT_FILE)]
    assert trainer.should_stop
    assert (callback.reason, callback.stop_step) == ("cost", 2)
    assert callback.proof_path == str(run / job.SNAPSHOT_FILE)
    proof = json.loads((run / job.SNAPSHOT_FILE).read_text())
    assert (proof["checkpoint"], proof["step"], proof["reason"]) == (
        "output/checkpoint-2",
        2,
        "cost",
    )
    callback.on_train_end(trainer, None)
    lines = read_jsonl(run / job.METRICS_FILE)
    assert [line["event"] for line in lines] == ["begin", "log", "log", "save", "end"]
    assert (lines[0]["max_steps"], lines[0]["first_step"]) == (10, 1)
    assert [line["loss"] for line in lines[1:3]] == [0.5, 0.25]
    assert lines[3]["step"] == 2
    assert lines[3]["step_seconds"] >= 0
    assert lines[4] == {**lines[4], "step": 2, "reason": "cost"}


def test_a_request_at_the_last_step_changes_nothing(run: Path) -> None:
    trainer, callback = Trainer(run, last_step=3), lightning._RunwardenLogic("")
    trainer.global_step = 2  # a resumed fit
    callback.on_train_start(trainer, None)
    (run / job.SNAPSHOT_REQUEST).write_text("requested")
    trainer.global_step = 3
    batch_end(callback, trainer)
    assert not trainer.saved
    assert not trainer.should_stop
    callback.on_train_end(trainer, None)
    lines = read_jsonl(run / job.METRICS_FILE)
    assert lines[0]["first_step"] == 3
    assert "reason" not in lines[-1]
    assert not (run / job.SNAPSHOT_FILE).exists()


def test_endless_training_writes_no_begin_and_still_stops(run: Path) -> None:
    trainer, callback = Trainer(run, last_step=float("inf")), lightning._RunwardenLogic("")
    callback.on_train_start(trainer, None)
    (run / job.SNAPSHOT_REQUEST).write_text("requested")
    trainer.global_step = 1
    batch_end(callback, trainer)
    assert trainer.should_stop
    callback.on_train_end(trainer, None)
    assert read_jsonl(run / job.METRICS_FILE)[0]["event"] == "log"


def test_the_signals_are_installed_at_train_start_and_restored(run: Path) -> None:
    trainer, callback = Trainer(run), lightning._RunwardenLogic("USR2")
    callback.on_train_start(trainer, None)
    assert preempt.installed_signals()
    callback.on_train_end(trainer, None)
    assert not preempt.installed_signals()
    callback.on_train_start(trainer, None)
    assert preempt.installed_signals()
    callback.on_exception(trainer, None, RuntimeError("boom"))
    assert not preempt.installed_signals()


def test_resume_checkpoint(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert lightning.resume_checkpoint() is None
    monkeypatch.setenv(job.RESUME_ENV, str(tmp_path))
    with pytest.raises(FileNotFoundError, match="no single Lightning checkpoint"):
        lightning.resume_checkpoint()
    (tmp_path / "epoch=0-step=12.ckpt").write_bytes(b"x")
    assert lightning.resume_checkpoint() == str(tmp_path / "epoch=0-step=12.ckpt")
    (tmp_path / lightning.CHECKPOINT_FILE).write_bytes(b"x")
    assert lightning.resume_checkpoint() == str(tmp_path / lightning.CHECKPOINT_FILE)
    monkeypatch.setenv(job.RESUME_ENV, str(tmp_path / "missing"))
    with pytest.raises(FileNotFoundError):
        lightning.resume_checkpoint()
