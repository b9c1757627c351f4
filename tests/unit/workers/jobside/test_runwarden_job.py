"""The job side: `workers/jobside/runwarden_job.py` and the toy trainer that uses it.

The trainer runs as a real subprocess, as launch would start it: the run directory
as its current directory, `workers/jobside` on `PYTHONPATH`, and
`RUNWARDEN_SNAPSHOT_REQUEST` / `RUNWARDEN_METRICS` set.
"""

from __future__ import annotations

import ast
import contextlib
import hashlib
import json
import math
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from schemas import protocol
from schemas.snapshot import (
    ProofNone,
    ProofSaved,
    SnapshotReason,
    expected_checkpoint,
    parse_proof,
)
from workers import jobside
from workers.jobside import runwarden_job as job

from ....conftest import ROOT

JOBSIDE = ROOT / "workers" / "jobside"
TOY = ROOT / "examples" / "toy_trainer.py"
REASONS = [reason.value for reason in SnapshotReason]


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in (job.REQUEST_ENV, job.METRICS_ENV, job.RESUME_ENV):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A run directory, named by the environment as launch would."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    monkeypatch.setenv(job.REQUEST_ENV, str(run_dir / job.SNAPSHOT_REQUEST))
    monkeypatch.setenv(job.METRICS_ENV, str(run_dir / job.METRICS_FILE))
    return run_dir


def make_checkpoint(run_dir: Path, step: int) -> Path:
    path = run_dir / job.OUTPUT_DIR / f"checkpoint-{step}"
    path.mkdir(parents=True, exist_ok=True)
    return path


def put(path: Path, content: str) -> None:
    """Writes `content` the way the protocol's writers do: a temp file and a rename."""
    temp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    temp.write_text(content, encoding="utf-8")
    temp.replace(path)


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    data = path.read_bytes()
    assert data.endswith(b"\n")
    return [json.loads(line) for line in data.decode("ascii").split("\n")[:-1]]


# --- the module itself ---------------------------------------------------------------


def test_constants_match_the_protocol() -> None:
    assert job.SNAPSHOT_REQUEST == protocol.SNAPSHOT_REQUEST
    assert job.SNAPSHOT_FILE == protocol.SNAPSHOT_FILE
    assert job.OUTPUT_DIR == protocol.OUTPUT_DIR
    assert job.METRICS_FILE == protocol.METRICS_FILE
    assert job.REQUEST_ENV == "RUNWARDEN_SNAPSHOT_REQUEST"
    assert job.METRICS_ENV == "RUNWARDEN_METRICS"
    assert job.RESUME_ENV == "RUNWARDEN_RESUME_FROM"
    assert job.REASONS == ("requested", "deadline", "cost", "disk")
    assert set(job.REASONS) == set(REASONS)
    assert job.REASONS[0] == SnapshotReason.REQUESTED.value


def test_jobside_files_are_shipped_and_stdlib_only() -> None:
    files = jobside.jobside_files()
    assert [path.name for path in files] == list(jobside.JOBSIDE_FILES)
    assert jobside.jobside_dir() == JOBSIDE.resolve()
    for path in files:
        assert path.is_file()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                assert node.level == 0, f"{path.name}: relative import"
                names = [node.module or ""]
            else:
                continue
            for name in names:
                top = name.split(".")[0]
                assert top == "__future__" or top in sys.stdlib_module_names, (
                    f"{path.name} imports {name}"
                )


def test_all_is_deliberate() -> None:
    assert set(job.__all__) <= set(dir(job))
    assert {"snapshot_requested", "write_proof", "Metrics", "run_dir"} <= set(job.__all__)


def test_checkpoint_path_is_the_expected_checkpoint() -> None:
    for step in (0, 1, 120, 2**64 - 1):
        assert job.checkpoint_path(step) == expected_checkpoint(step)
    for bad in (-1, True, 2**64):
        with pytest.raises(ValueError, match="step"):
            job.checkpoint_path(bad)


def test_run_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert job.run_dir() == str(tmp_path)
    assert job.request_path() == str(tmp_path / job.SNAPSHOT_REQUEST)
    monkeypatch.setenv(job.REQUEST_ENV, "/somewhere/run-1/snapshot.request")
    assert job.run_dir() == "/somewhere/run-1"
    monkeypatch.setenv(job.REQUEST_ENV, "")
    assert job.run_dir() == str(tmp_path)


@given(st.one_of(st.none(), st.text(), st.binary(), st.sampled_from(REASONS)))
def test_parse_reason_agrees_with_the_schema(text: str | bytes | None) -> None:
    assert job.parse_reason(text) == SnapshotReason.parse(text).value


def test_parse_reason() -> None:
    assert job.parse_reason(" cost\n") == "cost"
    assert job.parse_reason(b"disk") == "disk"
    assert job.parse_reason("COST") == "requested"
    assert job.parse_reason(b"\xff\xfe") == "requested"
    assert job.parse_reason(None) == "requested"


# --- snapshot_requested --------------------------------------------------------------


def test_no_request_when_missing_or_empty(run: Path) -> None:
    assert job.snapshot_requested() is None
    (run / job.SNAPSHOT_REQUEST).write_bytes(b"")
    assert job.snapshot_requested() is None


@pytest.mark.parametrize("reason", REASONS)
@pytest.mark.parametrize("form", ["{}", "{}\n", "  {}\r\n\t"])
def test_request_reasons(run: Path, reason: str, form: str) -> None:
    (run / job.SNAPSHOT_REQUEST).write_text(form.format(reason), encoding="utf-8")
    assert job.snapshot_requested() == reason


@pytest.mark.parametrize(
    "content",
    [b"please stop", b" \n", b"\n", b"\xff\xfe\x00", b"Cost", b"cost disk", b"x" * 10_000],
)
def test_any_other_request_is_requested(run: Path, content: bytes) -> None:
    (run / job.SNAPSHOT_REQUEST).write_bytes(content)
    assert job.snapshot_requested() == "requested"


def test_request_reads_at_most_4_kib(run: Path) -> None:
    # The reason is read from the first 4 KiB only; the rest is never looked at.
    (run / job.SNAPSHOT_REQUEST).write_bytes(b"disk" + b" " * 4092 + b"garbage")
    assert job.snapshot_requested() == "disk"


def test_request_in_the_current_directory_without_env(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    assert job.snapshot_requested() is None
    (tmp_path / job.SNAPSHOT_REQUEST).write_text("deadline", encoding="utf-8")
    assert job.snapshot_requested() == "deadline"


def test_request_explicit_path(tmp_path: Path) -> None:
    path = tmp_path / "elsewhere"
    assert job.snapshot_requested(path=str(path)) is None
    path.write_text("cost", encoding="utf-8")
    assert job.snapshot_requested(path=str(path)) == "cost"


def test_unreadable_requests_are_no_requests(run: Path) -> None:
    request = run / job.SNAPSHOT_REQUEST
    request.mkdir()
    assert job.snapshot_requested() is None
    request.rmdir()
    # A FIFO must not block the training step.
    os.mkfifo(request)
    started = time.monotonic()
    assert job.snapshot_requested() is None
    assert time.monotonic() - started < 1.0
    request.unlink()
    request.symlink_to(run / "dangling")
    assert job.snapshot_requested() is None


# --- write_proof ---------------------------------------------------------------------


@pytest.mark.parametrize("reason", REASONS)
def test_write_proof_parses(run: Path, reason: str) -> None:
    make_checkpoint(run, 120)
    before = time.time()
    path = job.write_proof(120, reason)
    assert path == str(run / job.SNAPSHOT_FILE)
    content = Path(path).read_bytes()
    proof = parse_proof(content)
    assert isinstance(proof, ProofSaved)
    assert proof.snapshot.step == 120
    assert proof.snapshot.reason == reason
    assert proof.snapshot.checkpoint == "output/checkpoint-120"
    written = json.loads(content)
    assert set(written) == {"checkpoint", "step", "time", "reason"}
    assert isinstance(written["time"], float)
    assert before - 1 <= written["time"] <= time.time() + 1
    # No temp file is left behind.
    assert sorted(p.name for p in run.iterdir()) == [job.OUTPUT_DIR, job.SNAPSHOT_FILE]


def test_write_proof_in_an_explicit_directory(tmp_path: Path) -> None:
    make_checkpoint(tmp_path, 0)
    path = job.write_proof(0, "disk", directory=str(tmp_path))
    assert path == str(tmp_path / job.SNAPSHOT_FILE)
    proof = parse_proof(Path(path).read_bytes())
    assert isinstance(proof, ProofSaved)
    assert (proof.snapshot.step, proof.snapshot.reason) == (0, "disk")


def test_write_proof_replaces_an_older_proof(run: Path) -> None:
    make_checkpoint(run, 5)
    make_checkpoint(run, 9)
    job.write_proof(5, "cost")
    job.write_proof(9, "deadline")
    proof = parse_proof((run / job.SNAPSHOT_FILE).read_bytes())
    assert isinstance(proof, ProofSaved)
    assert (proof.snapshot.step, proof.snapshot.reason) == (9, "deadline")
    assert [p.name for p in run.iterdir() if p.name.endswith(".tmp")] == []


def test_write_proof_refuses_a_missing_checkpoint(run: Path) -> None:
    with pytest.raises(FileNotFoundError, match="save the checkpoint before"):
        job.write_proof(7, "cost")
    # A file is not a checkpoint directory either.
    (run / job.OUTPUT_DIR).mkdir()
    (run / job.OUTPUT_DIR / "checkpoint-7").write_text("", encoding="utf-8")
    with pytest.raises(FileNotFoundError):
        job.write_proof(7, "cost")
    # Another step's checkpoint does not count.
    make_checkpoint(run, 6)
    with pytest.raises(FileNotFoundError):
        job.write_proof(7, "cost")
    assert not (run / job.SNAPSHOT_FILE).exists()


@pytest.mark.parametrize("reason", ["", "COST", " cost", "stop", None, 1])
def test_write_proof_refuses_a_bad_reason(run: Path, reason: Any) -> None:
    make_checkpoint(run, 1)
    with pytest.raises(ValueError, match="reason"):
        job.write_proof(1, reason)
    assert not (run / job.SNAPSHOT_FILE).exists()


@pytest.mark.parametrize("step", [-1, True, False, 1.0, "1", None, 2**64])
def test_write_proof_refuses_a_bad_step(run: Path, step: Any) -> None:
    make_checkpoint(run, 1)
    make_checkpoint(run, 0)
    with pytest.raises(ValueError, match="step"):
        job.write_proof(step, "cost")
    assert not (run / job.SNAPSHOT_FILE).exists()


def test_a_failed_proof_leaves_the_old_one(run: Path) -> None:
    make_checkpoint(run, 3)
    job.write_proof(3, "cost")
    old = (run / job.SNAPSHOT_FILE).read_bytes()
    with pytest.raises(FileNotFoundError):
        job.write_proof(4, "cost")
    assert (run / job.SNAPSHOT_FILE).read_bytes() == old


def test_the_proof_is_never_seen_partially(run: Path) -> None:
    steps = range(1, 6)
    for step in steps:
        make_checkpoint(run, step)
    proof_file = run / job.SNAPSHOT_FILE
    stop = threading.Event()
    seen: list[bytes] = []

    def reader() -> None:
        while not stop.is_set():
            try:
                seen.append(proof_file.read_bytes())
            except FileNotFoundError:
                seen.append(b"")

    thread = threading.Thread(target=reader)
    thread.start()
    try:
        for index in range(300):
            job.write_proof(steps[index % len(steps)], REASONS[index % len(REASONS)])
    finally:
        stop.set()
        thread.join()
    assert len(seen) > 10
    for content in seen:
        proof = parse_proof(content)
        assert isinstance(proof, ProofNone | ProofSaved), (content, proof)
        if content:
            assert isinstance(proof, ProofSaved)
    assert [p.name for p in run.iterdir() if p.name.endswith(".tmp")] == []


# --- Metrics -------------------------------------------------------------------------


def test_metrics_lines(run: Path) -> None:
    with job.Metrics() as metrics:
        assert metrics.enabled
        assert metrics.path == str(run / job.METRICS_FILE)
        metrics.begin(3, model="toy")
        metrics.log(1, loss=1.5, learning_rate=1e-3, note="a\nb", ok=True, none=None)
        metrics.log(2, loss=math.nan, grad=math.inf, low=-math.inf, fraction=Fraction(1, 4))
        metrics.end(2, reason="cost")
    assert not metrics.enabled
    metrics.log(3, loss=1.0)  # ignored after close
    metrics.close()  # idempotent
    data = (run / job.METRICS_FILE).read_bytes()
    assert data.count(b"\n") == 4
    lines = read_jsonl(run / job.METRICS_FILE)
    assert [line["event"] for line in lines] == ["begin", "log", "log", "end"]
    for line in lines:
        assert isinstance(line["time"], float)
    assert lines[0]["max_steps"] == 3
    assert lines[0]["model"] == "toy"
    assert lines[1] == {
        "event": "log",
        "time": lines[1]["time"],
        "step": 1,
        "loss": 1.5,
        "learning_rate": 1e-3,
        "note": "a\nb",
        "ok": True,
        "none": None,
    }
    assert lines[2]["loss"] is None
    assert lines[2]["grad"] is None
    assert lines[2]["low"] is None
    assert lines[2]["fraction"] == 0.25
    assert lines[3]["step"] == 2
    assert lines[3]["reason"] == "cost"


def test_metrics_append_to_an_existing_file(tmp_path: Path) -> None:
    path = tmp_path / "m.jsonl"
    path.write_bytes(b'{"event":"begin","time":1.0,"max_steps":1}\n')
    with job.Metrics(str(path)) as metrics:
        metrics.end(1)
    assert [line["event"] for line in read_jsonl(path)] == ["begin", "end"]


def test_metrics_without_a_file_do_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    metrics = job.Metrics()
    assert not metrics.enabled
    assert metrics.path is None
    metrics.begin(10)
    metrics.log(1, loss=2.0)
    metrics.end(1)
    metrics.close()
    assert list(tmp_path.iterdir()) == []
    # Mistakes are reported even then.
    with pytest.raises(TypeError, match="loss"):
        metrics.log(1, loss=[1.0])


def test_metrics_refuse_bad_input(tmp_path: Path) -> None:
    with job.Metrics(str(tmp_path / "m.jsonl")) as metrics:
        with pytest.raises(TypeError, match="values"):
            metrics.log(1, values={"a": 1})
        with pytest.raises(ValueError, match="reserved"):
            metrics.log(1, event="x")
        with pytest.raises(ValueError, match="reserved"):
            metrics.end(1, time=3.0)
        with pytest.raises(ValueError, match="step"):
            metrics.log(-1, loss=1.0)
        with pytest.raises(ValueError, match="max_steps"):
            metrics.begin(True)
    assert (tmp_path / "m.jsonl").read_bytes() == b""


def test_metrics_open_failure_raises(tmp_path: Path) -> None:
    with pytest.raises(OSError, match="missing"):
        job.Metrics(str(tmp_path / "missing" / "m.jsonl"))


def test_metrics_on_a_full_disk_drop_lines() -> None:
    with job.Metrics("/dev/full") as metrics:
        metrics.log(1, loss=1.0)
        metrics.log(2, loss=1.0)
    assert metrics.dropped == 2
    assert metrics.last_error is not None


WRITER = """
import sys, runwarden_job
name, count = sys.argv[1], int(sys.argv[2])
with runwarden_job.Metrics() as metrics:
    for i in range(count):
        metrics.log(i + 1, writer=name, seq=i, pad=name * 3000)
"""


def test_concurrent_metrics_writers_do_not_interleave(run: Path) -> None:
    count = 1500
    env = job_env(run)
    writers = [
        subprocess.Popen([sys.executable, "-c", WRITER, name, str(count)], env=env, cwd=run)
        for name in ("a", "b")
    ]
    for writer in writers:
        assert writer.wait(timeout=30) == 0
    lines = read_jsonl(run / job.METRICS_FILE)
    assert len(lines) == 2 * count
    for name in ("a", "b"):
        own = [line for line in lines if line["writer"] == name]
        assert [line["seq"] for line in own] == list(range(count))
        assert all(line["pad"] == name * 3000 for line in own)


# --- the toy trainer -----------------------------------------------------------------


def job_env(run_dir: Path, **extra: str) -> dict[str, str]:
    """The job's environment as launch builds it (§2): ours without `RUNWARDEN_*`,
    then the job's own variables."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RUNWARDEN_")}
    env["PYTHONPATH"] = str(JOBSIDE)
    env[job.REQUEST_ENV] = str(run_dir / job.SNAPSHOT_REQUEST)
    env[job.METRICS_ENV] = str(run_dir / job.METRICS_FILE)
    env.update(extra)
    return env


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
    process = start_trainer(trainer_run, "--steps", "500", "--step-time", "0.02", "--spawn-child")
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
