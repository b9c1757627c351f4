"""The job side: `workers/jobside/runwarden_job.py`, which any training loop uses to
see requests, write proofs and metrics. (The toy trainer that uses it:
tests/integration/examples/test_toy_trainer.py.)"""

from __future__ import annotations

import ast
import json
import math
import os
import subprocess
import sys
import threading
import time
from datetime import UTC, datetime
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from schemas import protocol
from schemas.budget import save_samples
from schemas.snapshot import ProofNone, ProofSaved, SnapshotReason, expected_checkpoint, parse_proof
from workers import jobside
from workers.jobside import runwarden_job as job

from .conftest import JOBSIDE, job_env, read_jsonl

REASONS = [reason.value for reason in SnapshotReason]


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


# --- the module itself ---------------------------------------------------------------


def test_constants_match_the_protocol() -> None:
    assert job.SNAPSHOT_REQUEST == protocol.SNAPSHOT_REQUEST
    assert job.SNAPSHOT_FILE == protocol.SNAPSHOT_FILE
    assert job.OUTPUT_DIR == protocol.OUTPUT_DIR
    assert job.METRICS_FILE == protocol.METRICS_FILE
    assert job.REQUEST_ENV == "RUNWARDEN_SNAPSHOT_REQUEST"
    assert job.METRICS_ENV == "RUNWARDEN_METRICS"
    assert job.RESUME_ENV == "RUNWARDEN_RESUME_FROM"
    assert job.REASONS == ("requested", "deadline", "cost", "disk", "preempted")
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
        # 100 replacements under a reader that never pauses: a writer that truncates
        # and writes in place is caught within the first few.
        for index in range(100):
            job.write_proof(steps[index % len(steps)], REASONS[index % len(REASONS)])
    finally:
        stop.set()
        thread.join()
    assert len(seen) > 10
    # The reader takes thousands of snapshots, mostly alike: each distinct one parsed.
    for content in set(seen):
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


def test_save_lines_say_how_long_a_save_took(run: Path) -> None:
    with job.Metrics() as metrics:
        metrics.save(5, 6.5, step_seconds=0.25, path="output/checkpoint-5")
        metrics.save(10, 2)
        with metrics.saving(15, step_seconds=0.1):
            time.sleep(0.2)
        with pytest.raises(RuntimeError), metrics.saving(20):
            raise RuntimeError("the save failed")  # no line for a save that failed
    lines = read_jsonl(run / job.METRICS_FILE)
    assert [line["event"] for line in lines] == ["save", "save", "save"]
    assert lines[0] == {"event": "save", "time": lines[0]["time"], "step": 5, "seconds": 6.5,
                        "step_seconds": 0.25, "path": "output/checkpoint-5"}  # fmt: skip
    assert "step_seconds" not in lines[1]
    assert lines[1]["seconds"] == 2.0
    assert isinstance(lines[1]["seconds"], float)
    assert (lines[2]["step"], lines[2]["step_seconds"]) == (15, 0.1)
    assert 0.2 <= lines[2]["seconds"] < 5
    # What the follower makes of them (schemas.budget): one sample each.
    found = save_samples(lines, datetime.now(UTC))
    assert [s.seconds for s in found] == [6.75, 2.0, pytest.approx(lines[2]["seconds"] + 0.1)]


@pytest.mark.parametrize("bad", [-1, math.nan, math.inf, "2", True, None])
def test_save_lines_refuse_bad_seconds(tmp_path: Path, bad: Any) -> None:
    with job.Metrics(str(tmp_path / "m.jsonl")) as metrics:
        with pytest.raises(ValueError, match="seconds"):
            metrics.save(1, bad)
        with pytest.raises(ValueError, match="step_seconds"):
            metrics.save(1, 1.0, step_seconds=bad if bad is not None else -1)
        with pytest.raises(ValueError, match="reserved"):
            metrics.save(1, 1.0, event="x")
    assert (tmp_path / "m.jsonl").read_bytes() == b""


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


def test_a_rank_reports_its_stop_only_when_check_trainer_asks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`report_stop` writes `rank-<rank>.json` in `$RUNWARDEN_RANK_REPORT` (the rank
    from `$RANK` by default), nothing without it, and never raises for a directory it
    cannot write in."""
    monkeypatch.delenv(job.RANK_REPORT_ENV, raising=False)
    assert job.report_stop(3, "requested") is None
    monkeypatch.setenv(job.RANK_REPORT_ENV, str(tmp_path))
    monkeypatch.setenv("RANK", "1")
    path = job.report_stop(3, "preempted")
    assert path == str(tmp_path / "rank-1.json")
    report = json.loads(Path(path).read_text())
    assert {k: report[k] for k in ("rank", "step", "reason")} == {
        "rank": 1, "step": 3, "reason": "preempted",
    }  # fmt: skip
    assert job.report_stop(4, "requested", rank=0) == str(tmp_path / "rank-0.json")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rank-0.json", "rank-1.json"]
    monkeypatch.setenv(job.RANK_REPORT_ENV, str(tmp_path / "missing"))
    assert job.report_stop(3, "requested") is None
    with pytest.raises(ValueError, match="step"):
        job.report_stop(-1, "requested")
    with pytest.raises(ValueError, match="rank"):
        job.report_stop(1, "requested", rank=-2)
