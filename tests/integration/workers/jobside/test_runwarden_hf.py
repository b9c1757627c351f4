"""The Hugging Face side: `workers/jobside/runwarden_hf.py` and the tiny real trainer.

The trainer (`examples/hf_tiny_trainer.py`: a 1-layer GPT-2 on random tokens, on the
CPU, no download) runs as a subprocess, as launch would start it: the run directory
as its current directory, only `workers/jobside` on `PYTHONPATH`, the `RUNWARDEN_*`
variables of the worker removed and `RUNWARDEN_SNAPSHOT_REQUEST` / `RUNWARDEN_METRICS`
set. transformers is never imported into the test process: the checks that need it
run in subprocesses too. The callback's decisions are also tested in-process with
stand-ins for the Trainer's objects (no transformers needed).

Needs the `hf` extra (torch, transformers, accelerate).
"""

from __future__ import annotations

import inspect
import json
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from schemas.budget import save_samples
from schemas.snapshot import ProofSaved, parse_proof
from workers import jobside
from workers.jobside import runwarden_hf as hf
from workers.jobside import runwarden_job as job

from ....conftest import ROOT

pytestmark = pytest.mark.slow

JOBSIDE = ROOT / "workers" / "jobside"
HF_TRAINER = ROOT / "examples" / "hf_tiny_trainer.py"
# Generous: importing torch and transformers takes seconds, more on a loaded machine.
START_TIMEOUT_S = 120.0
STEP_DELAY_S = "0.05"
RUN_STEPS = 200


def job_env(run_dir: Path, **extra: str) -> dict[str, str]:
    """The environment launch gives a job (`workers.launch.launch`): this
    process's minus the `RUNWARDEN_`, `OVERBRAINER_` and `VAULT_` variables, then the
    job's own."""
    env = {
        name: value
        for name, value in os.environ.items()
        if not name.startswith(("RUNWARDEN_", "OVERBRAINER_", "VAULT_"))
    }
    env.update(
        {
            "PYTHONPATH": str(JOBSIDE),
            job.REQUEST_ENV: str(run_dir / job.SNAPSHOT_REQUEST),
            job.METRICS_ENV: str(run_dir / job.METRICS_FILE),
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
        }
    )
    env.update(extra)
    return env


def start_trainer(run_dir: Path, *args: str, ranks: int = 0, **env: str) -> subprocess.Popen[bytes]:
    """Starts the trainer in `run_dir`, in its own session, its output to `job.log`;
    with `ranks`, that many processes under torchrun (DDP over gloo)."""
    launcher = [sys.executable, "-u"]
    if ranks:
        launcher += ["-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={ranks}"]
    with open(run_dir / "job.log", "wb") as log:
        return subprocess.Popen(
            [*launcher, str(HF_TRAINER), *args],
            cwd=run_dir,
            env=job_env(run_dir, **env),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def finish(process: subprocess.Popen[bytes], run_dir: Path) -> None:
    """Waits for the trainer and asserts it exited 0, showing its log otherwise."""
    code = process.wait(timeout=START_TIMEOUT_S)
    assert code == 0, (run_dir / "job.log").read_text(errors="replace")[-4000:]


def python(code: str, **env: str) -> str:
    """Runs `code` in a fresh interpreter with the job side on its path; its stdout."""
    result = subprocess.run(
        [sys.executable, "-c", code],
        env={**os.environ, "PYTHONPATH": str(JOBSIDE), "HF_HUB_OFFLINE": "1", **env},
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=START_TIMEOUT_S,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    return result.stdout


def wait_for(condition: Callable[[], object], timeout_s: float = START_TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"condition not met within {timeout_s} s"
        time.sleep(0.05)


def put(path: Path, content: str) -> None:
    """Writes `content` as the protocol's writers do: a temp file and a rename."""
    temp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    temp.write_text(content, encoding="utf-8")
    temp.replace(path)


def metrics(run_dir: Path) -> list[dict[str, Any]]:
    """The complete lines of `metrics.jsonl`, parsed."""
    path = run_dir / job.METRICS_FILE
    if not path.exists():
        return []
    lines = path.read_text(encoding="ascii").split("\n")[:-1]
    return [json.loads(line) for line in lines]


def loss_steps(run_dir: Path) -> list[int]:
    """The steps of the per-step `log` lines (the final summary has no `loss`)."""
    return [r["step"] for r in metrics(run_dir) if r["event"] == "log" and "loss" in r]


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in (job.REQUEST_ENV, job.METRICS_ENV, job.RESUME_ENV):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture(scope="module")
def processes() -> Iterator[list[subprocess.Popen[bytes]]]:
    """Trainers started by the tests, killed with their process group at the end."""
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for process in started:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=10)


@pytest.fixture(scope="module")
def stopped_run(
    tmp_path_factory: pytest.TempPathFactory, processes: list[subprocess.Popen[bytes]]
) -> tuple[Path, int]:
    """A run of 200 steps stopped by a request after a few steps: its directory and
    the step of its proof."""
    run_dir = tmp_path_factory.mktemp("hf") / "run-stopped"
    run_dir.mkdir()
    process = start_trainer(run_dir, "--steps", str(RUN_STEPS), "--step-delay", STEP_DELAY_S)
    processes.append(process)
    wait_for(lambda: len(loss_steps(run_dir)) >= 3 or process.poll() is not None)
    put(run_dir / job.SNAPSHOT_REQUEST, "requested\n")
    finish(process, run_dir)
    proof = parse_proof((run_dir / job.SNAPSHOT_FILE).read_bytes())
    assert isinstance(proof, ProofSaved), proof
    return run_dir, proof.snapshot.step


# --- the real Trainer -------------------------------------------------------------


def test_a_request_stops_the_trainer_with_a_real_checkpoint(stopped_run: tuple[Path, int]) -> None:
    run_dir, step = stopped_run
    proof = parse_proof((run_dir / job.SNAPSHOT_FILE).read_bytes())
    assert isinstance(proof, ProofSaved)
    assert proof.snapshot.checkpoint == f"output/checkpoint-{step}"
    assert proof.snapshot.reason == "requested"
    assert 3 <= step < RUN_STEPS
    # The only checkpoint is the snapshot's (save_strategy "no"), a complete HF one.
    assert [p.name for p in (run_dir / "output").iterdir()] == [f"checkpoint-{step}"]
    checkpoint = run_dir / proof.snapshot.checkpoint
    state = json.loads((checkpoint / "trainer_state.json").read_text())
    assert state["global_step"] == step
    assert state["max_steps"] == RUN_STEPS
    for name in ("model.safetensors", "config.json", "optimizer.pt", "scheduler.pt"):
        assert (checkpoint / name).is_file(), name
    # Metrics: begin, one log per step up to the snapshot's, end with the reason.
    lines = metrics(run_dir)
    assert lines[0]["event"] == "begin"
    assert (lines[0]["max_steps"], lines[0]["first_step"]) == (RUN_STEPS, 1)
    assert loss_steps(run_dir) == list(range(1, step + 1))
    assert all(isinstance(r["loss"], float) for r in lines if r["event"] == "log" and "loss" in r)
    assert lines[-1] == {**lines[-1], "event": "end", "step": step, "reason": "requested"}
    assert [r["event"] for r in lines].count("end") == 1
    log = (run_dir / "job.log").read_text(errors="replace")
    assert f"runwarden: snapshot requested (requested) at step {step}" in log
    assert "no snapshot proof can be written" not in log


def test_the_checkpoint_loads_with_from_pretrained(stopped_run: tuple[Path, int]) -> None:
    run_dir, step = stopped_run
    checkpoint = run_dir / "output" / f"checkpoint-{step}"
    # One interpreter for everything that needs transformers (importing it is slow):
    # the checkpoint loads completely and runs; the callback is a TrainerCallback.
    out = python(
        "import json, torch, transformers, runwarden_hf\n"
        "model, info = transformers.AutoModelForCausalLM.from_pretrained(\n"
        f"    {str(checkpoint)!r}, output_loading_info=True)\n"
        "logits = model(torch.tensor([[1, 2, 3]])).logits\n"
        "cls = runwarden_hf.RunwardenCallback\n"
        "print(json.dumps({\n"
        "    'model': type(model).__name__, 'layers': model.config.n_layer,\n"
        "    'missing': list(info['missing_keys']), 'unexpected': list(info['unexpected_keys']),\n"
        "    'shape': list(logits.shape), 'finite': bool(torch.isfinite(logits).all()),\n"
        "    'callback': issubclass(cls, transformers.TrainerCallback)\n"
        "        and type(runwarden_hf.callback()) is cls and cls.__module__ == 'runwarden_hf',\n"
        "}))\n"
    )
    assert json.loads(out) == {
        "model": "GPT2LMHeadModel",
        "layers": 1,
        "missing": [],
        "unexpected": [],
        "shape": [1, 3, 128],
        "finite": True,
        "callback": True,
    }


LOSS_STEPS = 16
LOSS_TOLERANCE = 1e-6
"""Absolute, on the losses and gradient norms the Trainer logs: the resumed run
restores the model, the optimizer, the scheduler, the RNG states and the data
position, so only floating-point noise may differ (none was seen)."""


def logged(run_dir: Path) -> dict[int, tuple[float, float]]:
    """Step -> (loss, grad_norm) of the per-step `log` lines."""
    return {
        r["step"]: (r["loss"], r["grad_norm"])
        for r in metrics(run_dir)
        if r["event"] == "log" and "loss" in r
    }


@pytest.mark.parametrize("ranks", [0, 2], ids=["1-rank", "2-ranks"])
def test_a_stopped_and_resumed_run_trains_as_an_uninterrupted_one(
    tmp_path: Path, processes: list[subprocess.Popen[bytes]], ranks: int
) -> None:
    """Stopped by a request after a few steps and resumed from its checkpoint, a run
    logs the losses (and gradient norms) of a run of the same steps left alone, at
    every step, within `LOSS_TOLERANCE`; on one process and on two ranks under DDP.
    The uninterrupted run and the stopped one run side by side."""
    whole, first, second = (tmp_path / name for name in ("whole", "first", "second"))
    for directory in (whole, first, second):
        directory.mkdir()
    steps = ("--steps", str(LOSS_STEPS))
    alone = start_trainer(whole, *steps, ranks=ranks)
    stopped = start_trainer(first, *steps, "--step-delay", "0.2", ranks=ranks)
    processes += [alone, stopped]
    wait_for(lambda: len(loss_steps(first)) >= 3 or stopped.poll() is not None)
    put(first / job.SNAPSHOT_REQUEST, "requested\n")
    finish(stopped, first)
    proof = parse_proof((first / job.SNAPSHOT_FILE).read_bytes())
    assert isinstance(proof, ProofSaved), proof
    step = proof.snapshot.step
    assert 3 <= step < LOSS_STEPS
    checkpoint = str(first / proof.snapshot.checkpoint)
    resumed = start_trainer(
        second, *steps, "--save-every", "1000", ranks=ranks, **{job.RESUME_ENV: checkpoint}
    )
    processes.append(resumed)
    finish(alone, whole)
    finish(resumed, second)
    expected = logged(whole)
    assert sorted(expected) == list(range(1, LOSS_STEPS + 1))
    got = logged(first)
    assert sorted(got) == list(range(1, step + 1))
    got.update(logged(second))
    assert sorted(got) == sorted(expected)
    for at in expected:
        assert got[at] == pytest.approx(expected[at], abs=LOSS_TOLERANCE, rel=0), at
    # The resumed run went on from the checkpoint's global step and ended normally:
    # its final save is its only checkpoint, and no proof.
    lines = metrics(second)
    begin = (lines[0]["event"], lines[0]["max_steps"], lines[0]["first_step"])
    assert begin == ("begin", LOSS_STEPS, step + 1)
    assert (lines[-1]["event"], lines[-1]["step"]) == ("end", LOSS_STEPS)
    assert "reason" not in lines[-1]
    final = second / "output" / f"checkpoint-{LOSS_STEPS}"
    assert [p.name for p in (second / "output").iterdir()] == [final.name]
    assert json.loads((final / "trainer_state.json").read_text())["global_step"] == LOSS_STEPS
    assert not (second / job.SNAPSHOT_FILE).exists()
    assert f"resuming from {checkpoint}" in (second / "job.log").read_text(errors="replace")


def test_without_a_request_the_run_ends_normally_and_its_saves_say_how_long_they_took(
    tmp_path: Path, processes: list[subprocess.Popen[bytes]]
) -> None:
    steps = 6
    process = start_trainer(tmp_path, "--steps", str(steps), "--save-every", "2",
                            "--step-delay", STEP_DELAY_S)  # fmt: skip
    processes.append(process)
    finish(process, tmp_path)
    # Nothing asked: no proof, and the callback saved nothing of its own (the only
    # checkpoints are the Trainer's periodic ones); the run's end has no reason.
    assert not (tmp_path / job.SNAPSHOT_FILE).exists()
    assert loss_steps(tmp_path) == list(range(1, steps + 1))
    every = metrics(tmp_path)
    assert (every[0]["event"], every[0]["max_steps"]) == ("begin", steps)
    assert every[-1]["event"] == "end"
    assert (every[-1]["step"], "reason" in every[-1]) == (steps, False)
    saved = sorted(int(p.name.removeprefix("checkpoint-")) for p in (tmp_path / "output").iterdir())
    lines = [r for r in every if r["event"] == "save"]
    assert [r["step"] for r in lines] == saved == [2, 4, 6]
    for line in lines:
        # From the step's end to `on_save`: the save (and the other callbacks' work).
        assert 0 <= line["seconds"] < 60, line
        assert float(STEP_DELAY_S) <= line["step_seconds"] < 60, line
    # The follower learns one sample a save, each the save plus a step.
    found = save_samples(lines, datetime.now(UTC))
    assert [s.seconds for s in found] == [
        pytest.approx(r["seconds"] + r["step_seconds"]) for r in lines
    ]


def test_importing_it_imports_neither_torch_nor_transformers() -> None:
    out = python(
        "import sys, runwarden_hf\n"
        "print(sorted({'torch', 'transformers', 'numpy'} & set(sys.modules)),"
        " runwarden_hf.resume_checkpoint())\n"
    )
    assert out.split() == ["[]", "None"]
    assert "runwarden_hf.py" in jobside.JOBSIDE_FILES
    assert JOBSIDE / "runwarden_hf.py" in jobside.jobside_files()


# --- the callback's decisions, with stand-ins for the Trainer's objects --------------


@pytest.fixture
def run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A run directory, named by the environment as launch would, and the current one."""
    monkeypatch.setenv(job.REQUEST_ENV, str(tmp_path / job.SNAPSHOT_REQUEST))
    monkeypatch.setenv(job.METRICS_ENV, str(tmp_path / job.METRICS_FILE))
    monkeypatch.chdir(tmp_path)
    return tmp_path


def trainer_objects(
    step: int, max_steps: int = 10, output_dir: str = "output"
) -> tuple[Any, Any, Any]:
    args = SimpleNamespace(output_dir=output_dir)
    state = SimpleNamespace(global_step=step, max_steps=max_steps, is_world_process_zero=True)
    control = SimpleNamespace(should_save=False, should_training_stop=False)
    return args, state, control


def save(args: Any, state: Any) -> None:
    """What the Trainer does before `on_save`."""
    (Path(args.output_dir) / f"checkpoint-{state.global_step}").mkdir(parents=True)


def test_a_request_at_the_last_step_changes_nothing(run: Path) -> None:
    put(run / job.SNAPSHOT_REQUEST, "deadline")
    logic = hf._RunwardenLogic()
    args, state, control = trainer_objects(step=0, max_steps=3)
    logic.on_train_begin(args, state, control)
    state.global_step = 3
    logic.on_step_end(args, state, control)
    assert (control.should_save, control.should_training_stop, logic.reason) == (False, False, None)
    logic.on_train_end(args, state, control)
    assert not (run / job.SNAPSHOT_FILE).exists()
    assert metrics(run)[-1] == {**metrics(run)[-1], "event": "end", "step": 3}
    assert "reason" not in metrics(run)[-1]


def test_a_request_saves_stops_and_proves_once(run: Path) -> None:
    logic = hf._RunwardenLogic()
    args, state, control = trainer_objects(step=0)
    logic.on_train_begin(args, state, control)
    state.global_step = 1
    logic.on_step_end(args, state, control)
    assert (control.should_save, control.should_training_stop) == (False, False)
    logic.on_log(args, state, control, logs={"loss": 2.5, "epoch": 0.1, "note": "x", "step": 9})
    put(run / job.SNAPSHOT_REQUEST, "disk")
    state.global_step = 2
    logic.on_step_end(args, state, control)
    assert (control.should_save, control.should_training_stop) == (True, True)
    assert (logic.reason, logic.stop_step) == ("disk", 2)
    save(args, state)
    logic.on_save(args, state, control)
    proof = parse_proof((run / job.SNAPSHOT_FILE).read_bytes())
    assert isinstance(proof, ProofSaved)
    assert (proof.snapshot.checkpoint, proof.snapshot.reason) == ("output/checkpoint-2", "disk")
    # An epoch-end save of the same step would rewrite the proven checkpoint: cancelled.
    control.should_save = True
    logic.on_epoch_end(args, state, control)
    assert control.should_save is False
    logic.on_train_end(args, state, control)
    lines = metrics(run)
    assert [r["event"] for r in lines] == ["begin", "log", "save", "end"]
    assert (lines[2]["step"], lines[2]["step_seconds"] >= 0) == (2, True)
    assert {k: lines[1][k] for k in ("step", "loss", "epoch")} == {
        "step": 1,
        "loss": 2.5,
        "epoch": 0.1,
    }
    assert "note" not in lines[1]
    assert (lines[3]["step"], lines[3]["reason"]) == (2, "disk")


def test_a_skipped_save_is_asked_again_at_the_epoch_end(run: Path) -> None:
    put(run / job.SNAPSHOT_REQUEST, "cost")
    logic = hf._RunwardenLogic()
    args, state, control = trainer_objects(step=4)
    logic.on_step_end(args, state, control)
    control.should_save = False  # e.g. save_strategy="best" overrode it
    logic.on_epoch_end(args, state, control)
    assert control.should_save is True


def test_no_proof_outside_the_run_output(
    run: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    put(run / job.SNAPSHOT_REQUEST, "requested")
    logic = hf._RunwardenLogic()
    args, state, control = trainer_objects(step=0, output_dir=str(run / "elsewhere"))
    with caplog.at_level(logging.WARNING, logger="runwarden_hf"):
        logic.on_train_begin(args, state, control)
        state.global_step = 1
        logic.on_step_end(args, state, control)
        assert (control.should_save, control.should_training_stop) == (True, True)
        save(args, state)
        logic.on_save(args, state, control)
        logic.on_train_end(args, state, control)
    assert not (run / job.SNAPSHOT_FILE).exists()
    messages = [r.getMessage() for r in caplog.records]
    assert sum("no snapshot proof can be written" in m for m in messages) == 2
    assert any("no proof was written" in m for m in messages)


def test_an_absolute_run_output_gets_a_proof(run: Path) -> None:
    put(run / job.SNAPSHOT_REQUEST, "requested")
    logic = hf._RunwardenLogic()
    args, state, control = trainer_objects(step=5, output_dir=str(run / "output"))
    logic.on_step_end(args, state, control)
    save(args, state)
    logic.on_save(args, state, control)
    assert logic.proof_path == str(run / job.SNAPSHOT_FILE)


def test_other_ranks_neither_read_nor_write(run: Path) -> None:
    put(run / job.SNAPSHOT_REQUEST, "requested")
    logic = hf._RunwardenLogic()
    args, state, control = trainer_objects(step=0)
    state.is_world_process_zero = False
    logic.on_train_begin(args, state, control)
    state.global_step = 1
    logic.on_step_end(args, state, control)
    logic.on_log(args, state, control, logs={"loss": 1.0})
    logic.on_train_end(args, state, control)
    assert (control.should_save, control.should_training_stop) == (False, False)
    assert not (run / job.METRICS_FILE).exists()


def test_resume_checkpoint(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert hf.resume_checkpoint() is None
    monkeypatch.setenv(job.RESUME_ENV, "")
    assert hf.resume_checkpoint() is None
    (tmp_path / "ckpt").mkdir()
    monkeypatch.setenv(job.RESUME_ENV, "ckpt")
    assert hf.resume_checkpoint() == str(tmp_path / "ckpt")
    monkeypatch.setenv(job.RESUME_ENV, "missing")
    with pytest.raises(FileNotFoundError, match="RUNWARDEN_RESUME_FROM"):
        hf.resume_checkpoint()


def test_the_declared_job_api_matches_runwarden_job() -> None:
    def params(function: Any) -> list[tuple[str, Any, Any, Any]]:
        signature = inspect.signature(function)
        return [
            (p.name, p.kind, p.default, p.annotation)
            for p in signature.parameters.values()
            if p.name != "self"
        ]

    api = hf._JobApi
    functions = (
        "run_dir",
        "snapshot_requested",
        "request_snapshot",
        "preemption_pending",
        "install_preemption_signals",
        "restore_preemption_signals",
        "write_proof",
    )
    for name in functions:
        assert params(getattr(api, name)) == params(getattr(job, name)), name
        assert inspect.signature(getattr(api, name)).return_annotation == (
            inspect.signature(getattr(job, name)).return_annotation
        ), name
    assert params(api.Metrics) == params(job.Metrics)
    for name in ("begin", "log", "save", "end", "close"):
        assert params(getattr(hf._MetricsApi, name)) == params(getattr(job.Metrics, name)), name
    for name in ("OUTPUT_DIR", "RESUME_ENV", "REQUEST_ENV", "REASONS", "PREEMPTED"):
        assert hasattr(job, name), name
