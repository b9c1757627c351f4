"""Preemption signals end to end: SIGTERM or SIGUSR1 sent from outside to the toy
trainer, to the tiny Hugging Face trainer (one rank, and one of two ranks under
torchrun), and to a job run by the whole service (bench/harness/pipeline.py). Each saves a
checkpoint at its next step end, proves it with reason `preempted` and exits 0;
runwarden's own cancel still ends a job with the handlers installed at once.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from bench.harness.pipeline import Pipeline, running_pipeline, toy
from schemas import RunState, SnapshotReason
from schemas.events import LaunchSpec
from schemas.snapshot import ProofSaved, parse_proof
from workers.executors.scripts import CANCEL_TERM_WAIT_S
from workers.jobside import runwarden_job as job

from ....conftest import TOY_TRAINER, wait_for
from .test_runwarden_hf import RUN_STEPS, START_TIMEOUT_S, STEP_DELAY_S, finish, loss_steps, metrics
from .test_runwarden_hf import start_trainer as start_hf_trainer

pytestmark = pytest.mark.slow

JOBSIDE = Path(job.__file__).resolve().parent


def proof_of(run_dir: Path) -> ProofSaved:
    proof = parse_proof((run_dir / job.SNAPSHOT_FILE).read_bytes())
    assert isinstance(proof, ProofSaved), proof
    return proof


def proc_stat(pid: int) -> list[str]:
    """The fields of `/proc/<pid>/stat` after the command: state, ppid, pgrp, ..."""
    with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as handle:
        return handle.read().rsplit(")", 1)[1].split()


def processes_where(test: Any) -> list[int]:
    """The pids of the live processes for which `test(pid)` is true."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            if proc_stat(int(entry))[0] not in ("Z", "X") and test(int(entry)):
                found.append(int(entry))
        except (OSError, ValueError, IndexError):
            continue
    return found


def read_proc(pid: int, name: str) -> bytes:
    with open(f"/proc/{pid}/{name}", "rb") as handle:
        return handle.read()


# --- the toy trainer ------------------------------------------------------------------


def start_toy(run_dir: Path, *args: str) -> subprocess.Popen[str]:
    """The toy trainer as launch starts it (ours without `RUNWARDEN_*`, the job's own)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RUNWARDEN_")}
    env.update(
        {
            "PYTHONPATH": str(JOBSIDE),
            job.REQUEST_ENV: str(run_dir / job.SNAPSHOT_REQUEST),
            job.METRICS_ENV: str(run_dir / job.METRICS_FILE),
        }
    )
    return subprocess.Popen(
        [sys.executable, "-u", str(TOY_TRAINER), *args],
        cwd=run_dir,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


@pytest.fixture
def toys() -> Iterator[list[subprocess.Popen[str]]]:
    started: list[subprocess.Popen[str]] = []
    yield started
    for process in started:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
        process.communicate(timeout=10)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGUSR1])
def test_the_toy_trainer_saves_at_its_next_step(
    tmp_path: Path, toys: list[Any], signum: signal.Signals
) -> None:
    steps = 500
    process = start_toy(tmp_path, "--steps", str(steps), "--step-time", "0.05")
    toys.append(process)
    wait_for(lambda: len(loss_steps(tmp_path)) >= 3)
    process.send_signal(signum)
    logged_then = len(loss_steps(tmp_path))
    out, err = process.communicate(timeout=10)
    assert process.returncode == 0, err
    proof = proof_of(tmp_path)
    step = proof.snapshot.step
    assert proof.snapshot.reason is SnapshotReason.PREEMPTED
    # The step in progress when the signal came, or the one after: never later.
    assert logged_then <= step <= logged_then + 1
    state = json.loads((tmp_path / proof.snapshot.checkpoint / "state.json").read_text())
    assert state["step"] == step
    assert (tmp_path / job.SNAPSHOT_REQUEST).read_text() == "preempted"
    end = metrics(tmp_path)[-1]
    assert (end["event"], end["step"], end["reason"]) == ("end", step, "preempted")
    assert loss_steps(tmp_path) == list(range(1, step + 1))
    assert f"snapshot saved at step {step} (preempted)" in out


def test_the_toy_trainer_ignoring_requests_ends_on_sigterm(tmp_path: Path, toys: list[Any]) -> None:
    process = start_toy(tmp_path, "--steps", "500", "--step-time", "0.05", "--ignore-requests")
    toys.append(process)
    wait_for(lambda: len(loss_steps(tmp_path)) >= 1)
    process.send_signal(signal.SIGTERM)
    process.communicate(timeout=10)
    assert process.returncode == -signal.SIGTERM
    assert not (tmp_path / job.SNAPSHOT_FILE).exists()


# --- the Hugging Face trainer ---------------------------------------------------------


@pytest.fixture
def trainers() -> Iterator[list[subprocess.Popen[bytes]]]:
    """HF trainers started by a test, killed with their process group at its end."""
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for process in started:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=10)


def test_the_hf_trainer_saves_at_its_next_step(
    tmp_path: Path, trainers: list[subprocess.Popen[bytes]]
) -> None:
    # SIGTERM here; SIGUSR1 reaches a Trainer in the test of the ranks below (each
    # signal of the bridge, on the toy trainer, above).
    process = start_hf_trainer(tmp_path, "--steps", str(RUN_STEPS), "--step-delay", STEP_DELAY_S)
    trainers.append(process)
    wait_for(lambda: len(loss_steps(tmp_path)) >= 3 or process.poll() is not None, START_TIMEOUT_S)
    process.send_signal(signal.SIGTERM)
    logged_then = len(loss_steps(tmp_path))
    finish(process, tmp_path)
    proof = proof_of(tmp_path)
    step = proof.snapshot.step
    assert proof.snapshot.reason is SnapshotReason.PREEMPTED
    assert 3 <= logged_then <= step <= logged_then + 2 < RUN_STEPS
    checkpoint = tmp_path / proof.snapshot.checkpoint
    assert json.loads((checkpoint / "trainer_state.json").read_text())["global_step"] == step
    for name in ("model.safetensors", "optimizer.pt", "scheduler.pt"):
        assert (checkpoint / name).is_file(), name
    assert [p.name for p in (tmp_path / "output").iterdir()] == [f"checkpoint-{step}"]
    assert (tmp_path / job.SNAPSHOT_REQUEST).read_text() == "preempted"
    end = metrics(tmp_path)[-1]
    assert (end["event"], end["step"], end["reason"]) == ("end", step, "preempted")
    log = (tmp_path / "job.log").read_text(errors="replace")
    assert f"runwarden: snapshot requested (preempted) at step {step}" in log


def rank_pid(agent: int, rank: int) -> int | None:
    """The pid of torchrun's worker `rank` under the agent `agent`, once it exists."""

    def is_rank(pid: int) -> bool:
        if int(proc_stat(pid)[1]) != agent:
            return False
        return f"RANK={rank}".encode() in read_proc(pid, "environ").split(b"\0")

    found = processes_where(is_rank)
    return found[0] if len(found) == 1 else None


def test_a_signal_on_one_rank_stops_every_rank_at_the_same_step(
    tmp_path: Path, trainers: list[subprocess.Popen[bytes]]
) -> None:
    # The suite's one run of several ranks (each imports torch and the Trainer: about
    # 10 s of CPU). Rank 0's own request (a file or a signal) becomes the same agreed
    # decision as another rank's signal (test_runwarden_hf_preemption.py, in process).
    process = start_hf_trainer(
        tmp_path, "--steps", str(RUN_STEPS), "--step-delay", STEP_DELAY_S, ranks=2
    )
    trainers.append(process)
    wait_for(lambda: len(loss_steps(tmp_path)) >= 3 or process.poll() is not None, START_TIMEOUT_S)
    ranks = [rank_pid(process.pid, 0), rank_pid(process.pid, 1)]
    assert None not in ranks, ranks
    assert ranks[0] != ranks[1]
    # Rank 1 alone: rank 0, which reads and writes the files, never got a signal.
    os.kill(ranks[1], signal.SIGUSR1)  # type: ignore[arg-type]
    finish(process, tmp_path)
    proof = proof_of(tmp_path)
    step = proof.snapshot.step
    assert (proof.snapshot.reason, 3 <= step < RUN_STEPS) == (SnapshotReason.PREEMPTED, True)
    log = (tmp_path / "job.log").read_text(errors="replace")
    assert log.count(f"training ended at step {step}\n") == 2, log[-4000:]
    assert log.count("training ended at step") == 2
    assert log.count("proof written to") == 1
    # Both ranks ended at the proof's step, and both had saved before the proof.
    for name in ("model.safetensors", "rng_state_0.pth", "rng_state_1.pth"):
        assert (tmp_path / proof.snapshot.checkpoint / name).is_file(), name
    assert (tmp_path / job.SNAPSHOT_REQUEST).read_text() == "preempted"
    # Rank 0 alone writes metrics.
    events = [r["event"] for r in metrics(tmp_path)]
    assert (events.count("begin"), events.count("end")) == (1, 1)
    assert loss_steps(tmp_path) == list(range(1, step + 1))


# --- through the whole service --------------------------------------------------------


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pipeline]:
    with running_pipeline(tmp_path_factory.mktemp("preemption")) as started:
        try:
            yield started
        finally:
            started.kill_jobs()


def launch(pipeline: Pipeline, *args: str) -> str:
    spec = LaunchSpec(
        target="local", command=toy("--steps", "100000", "--step-time", "0.05", *args)
    )
    return pipeline.api.launch(spec, wait_s=60).id


def trainer_pid(pipeline: Pipeline, run_id: str) -> int:
    """The pid of the toy trainer in the run's process group (the group's leader is
    the wrapper shell)."""
    run_dir = Path(pipeline.api.get_run(run_id).remote_dir)
    pgid = int((run_dir / "job.pid").read_text())

    def is_trainer(pid: int) -> bool:
        if int(proc_stat(pid)[2]) != pgid:
            return False
        return str(TOY_TRAINER).encode() in read_proc(pid, "cmdline").split(b"\0")

    found = processes_where(is_trainer)
    assert len(found) == 1, found
    return found[0]


def test_a_job_preempted_from_outside_ends_stopped_preempted(pipeline: Pipeline) -> None:
    run_id = launch(pipeline)
    pipeline.wait_step(run_id, 3)
    os.kill(trainer_pid(pipeline, run_id), signal.SIGTERM)
    run = pipeline.wait_state(run_id)
    assert run.state is RunState.STOPPED, run
    assert run.snapshot is not None
    assert run.snapshot.reason is SnapshotReason.PREEMPTED
    run_dir = Path(run.remote_dir)
    assert (run_dir / run.snapshot.checkpoint / "state.json").is_file()
    assert (run_dir / "exit_code").read_text().strip() == "0"
    assert (run_dir / job.SNAPSHOT_REQUEST).read_text() == "preempted"


def test_a_preempted_job_that_hangs_is_seen_and_cancelled(pipeline: Pipeline) -> None:
    # It proves, then hangs: only a stop the service opened from the `preempted`
    # request it found can end it (its end timeout cancels the job, and the pending
    # notice does not shield the job from that cancel).
    run_id = launch(pipeline, "--hang-after-proof")
    pipeline.wait_step(run_id, 3)
    os.kill(trainer_pid(pipeline, run_id), signal.SIGTERM)
    run = pipeline.wait_state(run_id, timeout_s=60)
    assert run.state is RunState.STOPPED, run  # the proof wins over the cancel
    assert run.snapshot is not None
    assert run.snapshot.reason is SnapshotReason.PREEMPTED
    history = pipeline.api.store.stops.history(run_id)
    assert [stop.reason for stop in history] == [SnapshotReason.PREEMPTED], history
    # The cancel's own marker comes once the group is gone, maybe after the record.
    wait_for((Path(run.remote_dir) / "cancelled").exists)


def test_runwardens_cancel_still_ends_a_job_with_handlers_promptly(pipeline: Pipeline) -> None:
    run_id = launch(pipeline)
    pipeline.wait_step(run_id, 3)
    status = read_proc(trainer_pid(pipeline, run_id), "status").decode()
    caught = next(line.split()[1] for line in status.splitlines() if line.startswith("SigCgt:"))
    assert int(caught, 16) & (1 << (signal.SIGTERM - 1)), "the trainer has no SIGTERM handler"
    started = time.monotonic()
    record = pipeline.api.cancel(run_id)
    elapsed = time.monotonic() - started
    assert record.state is RunState.CANCELLED, record
    assert elapsed < CANCEL_TERM_WAIT_S / 2, elapsed  # SIGTERM did it, not the SIGKILL
    print(f"cancel of a job with preemption handlers took {elapsed:.2f} s")
    run_dir = Path(record.remote_dir)
    assert not (run_dir / job.SNAPSHOT_FILE).exists()
    assert not (run_dir / job.SNAPSHOT_REQUEST).exists()
