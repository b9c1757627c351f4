"""The toy trainer (`examples/toy_trainer.py`), which uses the job side
(`workers/jobside/runwarden_job.py`).

The trainer runs as a real subprocess, as launch would start it: the run directory
as its current directory, `workers/jobside` on `PYTHONPATH`, and
`RUNWARDEN_SNAPSHOT_REQUEST` / `RUNWARDEN_METRICS` set.
"""

from __future__ import annotations

import contextlib
import hashlib
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

from schemas.snapshot import ProofSaved, parse_proof
from workers.jobside import runwarden_job as job

from ...conftest import ROOT
from ...unit.workers.jobside.conftest import job_env, put, read_jsonl

TOY = ROOT / "examples" / "toy_trainer.py"


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in (job.REQUEST_ENV, job.METRICS_ENV, job.RESUME_ENV):
        monkeypatch.delenv(name, raising=False)


def start_trainer(run_dir: Path, *args: str, **env: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, str(TOY), *args],
        cwd=run_dir,
        env=job_env(run_dir, **env),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def run_trainer(run_dir: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """Runs the trainer to its end. Its output is decoded without newline translation,
    so `\r` stays `\r`."""
    result = subprocess.run(
        [sys.executable, str(TOY), *args],
        cwd=run_dir,
        env=job_env(run_dir, **env),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        timeout=20,
        check=False,
    )
    return subprocess.CompletedProcess(
        result.args, result.returncode, result.stdout.decode(), result.stderr.decode()
    )


def wait_for(predicate: Any, timeout: float = 8.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def logged_steps(run_dir: Path) -> list[int]:
    path = run_dir / job.METRICS_FILE
    if not path.exists():
        return []
    lines = path.read_text(encoding="ascii").split("\n")[:-1]
    return [json.loads(line)["step"] for line in lines if '"event":"log"' in line]


@pytest.fixture
def trainer_run(tmp_path: Path) -> Path:
    run_dir = tmp_path / "trainer-run"
    run_dir.mkdir()
    return run_dir


@pytest.fixture
def processes() -> Iterator[list[subprocess.Popen[str]]]:
    """Trainers started by a test, killed with their process group at its end."""
    started: list[subprocess.Popen[str]] = []
    yield started
    for process in started:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=10)
        for stream in (process.stdout, process.stderr):
            if stream is not None:
                stream.close()


def test_trainer_runs_to_completion(trainer_run: Path) -> None:
    result = run_trainer(trainer_run, "--steps", "25", "--step-time", "0.01", "--save-every", "10")
    assert result.returncode == 0, result.stderr
    for step in (10, 20, 25):
        state = json.loads(
            (trainer_run / "output" / f"checkpoint-{step}" / "state.json").read_text()
        )
        assert state["step"] == step
        assert (trainer_run / "output" / f"checkpoint-{step}" / "weights.bin").stat().st_size > 1024
    assert not any(p.name.startswith(".tmp") for p in (trainer_run / "output").iterdir())
    assert not (trainer_run / job.SNAPSHOT_FILE).exists()
    lines = read_jsonl(trainer_run / job.METRICS_FILE)
    assert lines[0]["event"] == "begin"
    assert lines[0]["max_steps"] == 25
    assert [line["step"] for line in lines if line["event"] == "log"] == list(range(1, 26))
    assert lines[-1]["event"] == "end"
    assert lines[-1]["step"] == 25
    losses = [line["loss"] for line in lines if line["event"] == "log"]
    assert losses == sorted(losses, reverse=True)
    # Progress bars end with `\r`, and a `\n` line comes every 10 steps.
    assert result.stdout.count("\r") == 25
    lines_ended_by_newline = [part.rsplit("\r", 1)[-1] for part in result.stdout.split("\n")]
    assert lines_ended_by_newline[0].startswith("step 10/25 loss ")
    assert lines_ended_by_newline[1].startswith("step 20/25 loss ")


def test_trainer_stops_at_a_request(trainer_run: Path, processes: list[Any]) -> None:
    steps = 300
    process = start_trainer(trainer_run, "--steps", str(steps), "--step-time", "0.02")
    processes.append(process)
    wait_for(lambda: len(logged_steps(trainer_run)) >= 3)
    put(trainer_run / job.SNAPSHOT_REQUEST, "cost\n")
    assert process.wait(timeout=10) == 0
    proof = parse_proof((trainer_run / job.SNAPSHOT_FILE).read_bytes())
    assert isinstance(proof, ProofSaved)
    step = proof.snapshot.step
    assert proof.snapshot.reason == "cost"
    assert 3 <= step < steps
    checkpoint = trainer_run / proof.snapshot.checkpoint
    assert json.loads((checkpoint / "state.json").read_text())["step"] == step
    assert (checkpoint / "weights.bin").is_file()
    lines = read_jsonl(trainer_run / job.METRICS_FILE)
    assert lines[-1]["event"] == "end"
    assert (lines[-1]["step"], lines[-1]["reason"]) == (step, "cost")
    assert logged_steps(trainer_run)[-1] == step
    stdout = process.stdout.read() if process.stdout else ""
    assert f"snapshot saved at step {step} (cost)" in stdout


def test_trainer_reports_its_periodic_saves_and_their_time(trainer_run: Path) -> None:
    result = run_trainer(trainer_run, "--steps", "9", "--step-time", "0.05", "--save-every", "3",
                         "--save-time", "0.4")  # fmt: skip
    assert result.returncode == 0, result.stderr
    lines = read_jsonl(trainer_run / job.METRICS_FILE)
    saves = [line for line in lines if line["event"] == "save"]
    # One line a periodic save; the final save (of step 9, already there) writes none.
    assert [line["step"] for line in saves] == [3, 6, 9]
    for line in saves:
        assert 0.4 <= line["seconds"] < 5, line
        assert 0.05 <= line["step_seconds"] < 5, line
    assert [line["event"] for line in lines][-1] == "end"


def test_a_requested_save_takes_the_save_time_and_is_no_save_line(
    trainer_run: Path, processes: list[Any]
) -> None:
    process = start_trainer(trainer_run, "--steps", "300", "--step-time", "0.02",
                            "--save-time", "1.5")  # fmt: skip
    processes.append(process)
    wait_for(lambda: len(logged_steps(trainer_run)) >= 3)
    asked = time.monotonic()
    put(trainer_run / job.SNAPSHOT_REQUEST, "cost\n")
    wait_for((trainer_run / job.SNAPSHOT_FILE).exists)
    assert time.monotonic() - asked >= 1.5
    assert process.wait(timeout=10) == 0
    events = [line["event"] for line in read_jsonl(trainer_run / job.METRICS_FILE)]
    assert "save" not in events


def test_trainer_refuses_a_negative_save_time(trainer_run: Path) -> None:
    result = run_trainer(trainer_run, "--save-time", "-1")
    assert result.returncode == 2
    assert "--save-time" in result.stderr


def test_trainer_ignoring_requests_runs_all_steps(trainer_run: Path) -> None:
    put(trainer_run / job.SNAPSHOT_REQUEST, "deadline")
    result = run_trainer(trainer_run, "--steps", "8", "--step-time", "0.01", "--ignore-requests")
    assert result.returncode == 0, result.stderr
    assert not (trainer_run / job.SNAPSHOT_FILE).exists()
    assert (trainer_run / "output" / "checkpoint-8").is_dir()
    assert logged_steps(trainer_run) == list(range(1, 9))


def test_trainer_stops_at_the_first_step_of_an_open_request(trainer_run: Path) -> None:
    put(trainer_run / job.SNAPSHOT_REQUEST, "gibberish")
    result = run_trainer(trainer_run, "--steps", "8", "--step-time", "0.01")
    assert result.returncode == 0, result.stderr
    proof = parse_proof((trainer_run / job.SNAPSHOT_FILE).read_bytes())
    assert isinstance(proof, ProofSaved)
    assert (proof.snapshot.step, proof.snapshot.reason) == (1, "requested")


def test_trainer_fails_at_a_step(trainer_run: Path) -> None:
    result = run_trainer(
        trainer_run, "--steps", "20", "--step-time", "0.01", "--fail-at", "4", "--exit-code", "7"
    )
    assert result.returncode == 7
    assert logged_steps(trainer_run) == [1, 2, 3, 4]
    assert not (trainer_run / "output").exists()


@pytest.mark.parametrize("via_env", [False, True])
def test_trainer_resumes(trainer_run: Path, via_env: bool) -> None:
    first = run_trainer(
        trainer_run, "--steps", "10", "--step-time", "0.01", "--save-every", "5", "--fail-at", "7"
    )
    assert first.returncode == 1
    assert (trainer_run / "output" / "checkpoint-5").is_dir()
    (trainer_run / job.METRICS_FILE).unlink()
    resume = "output/checkpoint-5"
    args = ["--steps", "10", "--step-time", "0.01"]
    if via_env:
        second = run_trainer(trainer_run, *args, **{job.RESUME_ENV: resume})
    else:
        second = run_trainer(trainer_run, *args, "--resume-from", resume)
    assert second.returncode == 0, second.stderr
    assert logged_steps(trainer_run) == [6, 7, 8, 9, 10]
    lines = read_jsonl(trainer_run / job.METRICS_FILE)
    assert (lines[0]["event"], lines[0]["first_step"]) == ("begin", 6)
    assert (lines[-1]["event"], lines[-1]["step"]) == ("end", 10)
    state = json.loads((trainer_run / "output" / "checkpoint-10" / "state.json").read_text())
    assert state["step"] == 10


def test_trainer_prints_env_hashes_never_values(trainer_run: Path) -> None:
    secret = "hunter2-s3cr3t-value"
    result = run_trainer(
        trainer_run,
        "--steps",
        "1",
        "--step-time",
        "0",
        "--print-env",
        "MY_SECRET",
        "NOT_SET_ANYWHERE",
        MY_SECRET=secret,
    )
    assert result.returncode == 0, result.stderr
    digest = hashlib.sha256(secret.encode()).hexdigest()
    assert f"env MY_SECRET: set sha256={digest}" in result.stdout
    assert "env NOT_SET_ANYWHERE: unset" in result.stdout
    assert secret not in result.stdout + result.stderr
    for path in trainer_run.rglob("*"):
        if path.is_file():
            assert secret.encode() not in path.read_bytes()


def test_trainer_hangs_after_its_proof(trainer_run: Path, processes: list[Any]) -> None:
    put(trainer_run / job.SNAPSHOT_REQUEST, "disk")
    process = start_trainer(
        trainer_run, "--steps", "50", "--step-time", "0.01", "--hang-after-proof"
    )
    processes.append(process)
    wait_for((trainer_run / job.SNAPSHOT_FILE).exists)
    proof = parse_proof((trainer_run / job.SNAPSHOT_FILE).read_bytes())
    assert isinstance(proof, ProofSaved)
    assert proof.snapshot.reason == "disk"
    time.sleep(0.3)
    assert process.poll() is None


def test_trainer_ignores_sigterm(trainer_run: Path, processes: list[Any]) -> None:
    process = start_trainer(
        trainer_run, "--steps", "500", "--step-time", "0.02", "--ignore-sigterm"
    )
    processes.append(process)
    wait_for(lambda: len(logged_steps(trainer_run)) >= 1)
    process.send_signal(signal.SIGTERM)
    time.sleep(0.3)
    assert process.poll() is None
    os.killpg(process.pid, signal.SIGKILL)
    assert process.wait(timeout=10) == -signal.SIGKILL


def test_trainer_spawns_a_stubborn_child(trainer_run: Path, processes: list[Any]) -> None:
    # No preemption signals: SIGTERM must end the leader here (see test_preemption.py).
    process = start_trainer(
        trainer_run,
        "--steps",
        "500",
        "--step-time",
        "0.02",
        "--spawn-child",
        RUNWARDEN_PREEMPT_SIGNALS="",
    )
    processes.append(process)
    wait_for((trainer_run / "child.pid").exists)
    child = int((trainer_run / "child.pid").read_text())
    try:
        assert os.getpgid(child) == process.pid
        os.killpg(process.pid, signal.SIGTERM)
        assert process.wait(timeout=10) == -signal.SIGTERM
        time.sleep(0.2)
        os.kill(child, 0)  # still there: it ignores SIGTERM and outlived its leader
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
