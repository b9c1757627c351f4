"""The Hugging Face callback and preemption signals, with stand-ins for the Trainer's
objects and for `torch.distributed` (transformers is not imported): handlers
installed at train begin and restored at train end on every rank, and the decision
at a step end reached from rank 0's file request and every rank's signal.

The real Trainer, on one and on two ranks, is in tests/integration/test_preemption.py.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from schemas.snapshot import ProofSaved, SnapshotReason, parse_proof
from workers.jobside import runwarden_hf as hf
from workers.jobside import runwarden_job as job
from workers.jobside import runwarden_preempt as preempt


@pytest.fixture(autouse=True)
def dispositions(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """No inherited job variables, and every disposition and notice put back."""
    for name in (job.REQUEST_ENV, job.METRICS_ENV, job.RESUME_ENV, preempt.PREEMPT_SIGNALS_ENV):
        monkeypatch.delenv(name, raising=False)
    numbers = [getattr(signal, f"SIG{name}") for name in preempt.ALLOWED_SIGNALS]
    saved = {number: signal.getsignal(number) for number in numbers}
    yield
    preempt.restore_preemption_signals()
    preempt.clear_preemption()
    for number, handler in saved.items():
        signal.signal(number, handler if handler is not None else signal.SIG_DFL)


@pytest.fixture
def run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A run directory, named by the environment as launch would, and the current one."""
    monkeypatch.setenv(job.REQUEST_ENV, str(tmp_path / job.SNAPSHOT_REQUEST))
    monkeypatch.chdir(tmp_path)
    return tmp_path


def trainer_objects(step: int, max_steps: int = 10, zero: bool = True) -> tuple[Any, Any, Any]:
    args = SimpleNamespace(output_dir="output")
    state = SimpleNamespace(global_step=step, max_steps=max_steps, is_world_process_zero=zero)
    control = SimpleNamespace(should_save=False, should_training_stop=False)
    return args, state, control


def deliver(signum: int) -> None:
    """Sends `signum` to this process and lets its Python handler run."""
    os.kill(os.getpid(), signum)
    deadline = time.monotonic() + 5
    while preempt.preemption_notice() is None and time.monotonic() < deadline:
        time.sleep(0.001)


class FakeDist:
    """`torch.distributed` for one rank of `world`: `all_gather_object` fills in what
    the other ranks contribute (`others`, by rank) and records what this one did."""

    def __init__(self, rank: int, others: dict[int, object], world: int = 2) -> None:
        self.rank, self.others, self.world = rank, others, world
        self.gathered: list[object] = []
        self.barriers = 0

    def get_rank(self) -> int:
        return self.rank

    def get_world_size(self) -> int:
        return self.world

    def all_gather_object(self, output: list[object], mine: object) -> None:
        assert len(output) == self.world
        for rank in range(self.world):
            output[rank] = mine if rank == self.rank else self.others.get(rank)
        self.gathered.append(mine)

    def barrier(self) -> None:
        self.barriers += 1


def test_handlers_are_installed_at_train_begin_and_restored_at_train_end(run: Path) -> None:
    for zero in (True, False):
        logic = hf._RunwardenLogic()
        args, state, control = trainer_objects(step=0, zero=zero)
        logic.on_train_begin(args, state, control)
        assert logic.installed == (signal.SIGTERM, signal.SIGUSR1)
        assert signal.getsignal(signal.SIGTERM) is preempt._handle
        logic.on_train_end(args, state, control)
        assert logic.installed == ()
        assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
        assert signal.getsignal(signal.SIGUSR1) is signal.SIG_DFL


@pytest.mark.parametrize(
    ("argument", "configured", "expected"),
    [
        (None, "USR2", (signal.SIGUSR2,)),
        (None, "", ()),
        ("HUP", "USR2", (signal.SIGHUP,)),
        ((), None, ()),
        ("", None, ()),
    ],
)
def test_the_signals_are_configurable(
    run: Path,
    monkeypatch: pytest.MonkeyPatch,
    argument: Any,
    configured: str | None,
    expected: tuple[signal.Signals, ...],
) -> None:
    if configured is not None:
        monkeypatch.setenv(preempt.PREEMPT_SIGNALS_ENV, configured)
    logic = hf._RunwardenLogic(argument)
    logic.on_train_begin(*trainer_objects(step=0))
    assert logic.installed == expected
    assert preempt.installed_signals() == expected


def test_a_bad_signal_name_fails_at_train_begin(run: Path) -> None:
    logic = hf._RunwardenLogic("TERM,KILL")
    with pytest.raises(ValueError, match="SIGKILL cannot be a preemption notice"):
        logic.on_train_begin(*trainer_objects(step=0))
    assert preempt.installed_signals() == ()


def test_a_trainer_in_another_thread_runs_without_handlers(
    run: Path, caplog: pytest.LogCaptureFixture
) -> None:
    logic = hf._RunwardenLogic()
    objects = trainer_objects(step=0)
    with caplog.at_level(logging.WARNING, logger="runwarden_hf"):
        thread = threading.Thread(target=logic.on_train_begin, args=objects)
        thread.start()
        thread.join()
    assert logic.installed == ()
    assert preempt.installed_signals() == ()
    assert any("preemption signals not installed" in r.getMessage() for r in caplog.records)


def test_a_signal_saves_stops_and_proves_preempted(run: Path) -> None:
    logic = hf._RunwardenLogic()
    args, state, control = trainer_objects(step=0)
    logic.on_train_begin(args, state, control)
    state.global_step = 1
    logic.on_step_end(args, state, control)
    assert (control.should_save, control.should_training_stop) == (False, False)
    deliver(signal.SIGUSR1)
    state.global_step = 2
    logic.on_step_end(args, state, control)
    assert (control.should_save, control.should_training_stop) == (True, True)
    assert (logic.reason, logic.stop_step) == ("preempted", 2)
    assert (run / job.SNAPSHOT_REQUEST).read_text() == "preempted"
    (run / "output" / "checkpoint-2").mkdir(parents=True)
    logic.on_save(args, state, control)
    proof = parse_proof((run / job.SNAPSHOT_FILE).read_bytes())
    assert isinstance(proof, ProofSaved)
    assert (proof.snapshot.step, proof.snapshot.reason) == (2, SnapshotReason.PREEMPTED)
    logic.on_train_end(args, state, control)
    assert preempt.installed_signals() == ()


def test_a_signal_at_the_last_step_changes_nothing(run: Path) -> None:
    logic = hf._RunwardenLogic()
    args, state, control = trainer_objects(step=0, max_steps=3)
    logic.on_train_begin(args, state, control)
    deliver(signal.SIGTERM)
    state.global_step = 3
    logic.on_step_end(args, state, control)
    assert (control.should_save, control.should_training_stop, logic.reason) == (False, False, None)
    assert not (run / job.SNAPSHOT_REQUEST).exists()


@pytest.mark.parametrize(
    ("gathered", "decision"),
    [
        ([None, None, None], None),
        ([None, None, "preempted"], "preempted"),
        (["cost", "preempted", None], "cost"),
        (["preempted", None], "preempted"),
        (["disk", None], "disk"),
        ([None, "cost"], None),  # only rank 0 reads the file: another rank's is noise
        (["bogus", "preempted"], "preempted"),
        ([], None),
    ],
)
def test_the_agreed_decision(gathered: list[object], decision: str | None) -> None:
    assert hf._agreed(gathered) == decision


def test_rank_0_stops_for_a_signal_on_another_rank(
    run: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    dist = FakeDist(rank=0, others={1: "preempted"})
    monkeypatch.setattr(hf, "_distributed", lambda: dist)
    logic = hf._RunwardenLogic()
    args, state, control = trainer_objects(step=4)
    logic.on_step_end(args, state, control)
    assert dist.gathered == [None]
    assert (logic.reason, control.should_training_stop) == ("preempted", True)
    # Rank 0 owns the run directory's files: it makes the request visible.
    assert (run / job.SNAPSHOT_REQUEST).read_text() == "preempted"


def test_rank_0s_file_request_wins_over_another_ranks_signal(
    run: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (run / job.SNAPSHOT_REQUEST).write_text("deadline")
    dist = FakeDist(rank=0, others={1: "preempted", 2: None}, world=3)
    monkeypatch.setattr(hf, "_distributed", lambda: dist)
    logic = hf._RunwardenLogic()
    args, state, control = trainer_objects(step=4)
    logic.on_step_end(args, state, control)
    assert dist.gathered == ["deadline"]
    assert logic.reason == "deadline"
    assert (run / job.SNAPSHOT_REQUEST).read_text() == "deadline"


def test_another_rank_contributes_its_signal_and_never_writes(
    run: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    dist = FakeDist(rank=1, others={0: None})
    monkeypatch.setattr(hf, "_distributed", lambda: dist)
    logic = hf._RunwardenLogic()
    args, state, control = trainer_objects(step=0, zero=False)
    logic.on_train_begin(args, state, control)
    state.global_step = 1
    logic.on_step_end(args, state, control)
    assert (dist.gathered, logic.reason) == ([None], None)
    deliver(signal.SIGTERM)
    state.global_step = 2
    logic.on_step_end(args, state, control)
    assert (dist.gathered, logic.reason) == ([None, "preempted"], "preempted")
    assert (control.should_save, control.should_training_stop) == (True, True)
    # Rank 1 neither reads nor writes the run directory's files.
    assert not (run / job.SNAPSHOT_REQUEST).exists()
    # Once decided, no more collectives in this train(): every rank decided the same.
    logic.on_step_end(args, state, control)
    assert len(dist.gathered) == 2
