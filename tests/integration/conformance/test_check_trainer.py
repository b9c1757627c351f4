"""`runwarden check-trainer` against real jobs through the whole service: an honest
loop passes every check; each broken loop (tests/integration/conformance/loop.py)
fails, with the check named that its flaw breaks; the command itself, with its
private service, passes a real two-rank DDP loop (examples/ddp_loop.py) and prints
its JSON report."""

from __future__ import annotations

import contextlib
import json
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench.harness.pipeline import Pipeline, running_pipeline
from producers.conformance import CHECKS, Report, TrainerCheck, run_check

from ...conftest import ROOT, wait_for

pytestmark = pytest.mark.slow

LOOP = Path(__file__).with_name("loop.py")


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pipeline]:
    with running_pipeline(tmp_path_factory.mktemp("check")) as started:
        try:
            yield started
        finally:
            started.kill_jobs()


def checked(pipeline: Pipeline, tmp_path: Path, *args: str, ranks: int = 1) -> Report:
    words = (sys.executable, str(LOOP), "--step-time", "0.1", *args)
    check = TrainerCheck(words, ranks=ranks, proof_timeout_s=5, end_timeout_s=4, start_timeout_s=60)
    return run_check(pipeline.api, "local", check, tmp_path)


def failed(report: Report) -> list[str]:
    assert [c.name for c in report.checks] == list(CHECKS)
    return [c.name for c in report.checks if not c.passed]


def detail(report: Report, name: str) -> str:
    return next(c.detail for c in report.checks if c.name == name)


def test_an_honest_loop_passes_every_check(pipeline: Pipeline, tmp_path: Path) -> None:
    report = checked(pipeline, tmp_path)
    assert report.passed, [(c.name, c.value, c.detail) for c in report.checks if not c.passed]
    assert report.resumed_id is not None
    assert pipeline.api.get_run(report.resumed_id).state.is_terminal  # cancelled after


def test_a_proof_written_before_the_save_fails_the_checkpoint_check(
    pipeline: Pipeline, tmp_path: Path
) -> None:
    report = checked(pipeline, tmp_path, "--broken", "proof-before-save")
    assert failed(report) == ["checkpoint"]
    assert "written after the proof: state.json" in detail(report, "checkpoint")


def test_a_loop_that_ignores_the_request_fails_the_proof_check(
    pipeline: Pipeline, tmp_path: Path
) -> None:
    report = checked(pipeline, tmp_path, "--broken", "ignores-request")
    assert failed(report)[0] == "proof"
    assert "no proof within the proof timeout (5 s); the run ended cancelled" in detail(
        report, "proof"
    )


def test_a_loop_where_only_rank_0_stops_fails_the_ranks_check(
    pipeline: Pipeline, tmp_path: Path
) -> None:
    report = checked(pipeline, tmp_path, "--broken", "only-rank-0", ranks=2)
    assert failed(report) == ["ranks", "end"], report.checks
    assert detail(report, "ranks") == "no stop reported by rank 1"
    assert detail(report, "end").startswith("cancelled by runwarden")


def test_a_resume_that_restarts_its_step_count_fails_the_resume_check(
    pipeline: Pipeline, tmp_path: Path
) -> None:
    report = checked(pipeline, tmp_path, "--broken", "restarts-steps")
    assert failed(report) == ["resume"]
    assert "does not continue" in detail(report, "resume") or "first step is 1" in detail(
        report, "resume"
    )


def test_a_loop_that_stops_five_steps_late_fails_the_lag_check(
    pipeline: Pipeline, tmp_path: Path
) -> None:
    report = checked(pipeline, tmp_path, "--broken", "late-by-5")
    assert failed(report) == ["lag"], report.checks
    assert "more than 2 (--max-lag)" in detail(report, "lag")


def test_the_command_passes_a_two_rank_ddp_loop_and_prints_its_json_report() -> None:
    """The whole command: its own private service, `--ranks 2` under torchrun, the
    examples' DDP loop; exit 0 and a JSON report of every check passed."""
    command = [
        sys.executable, "-m", "producers.cli", "check-trainer", "--ranks", "2", "--json",
        "--proof-timeout", "60", "--end-timeout", "30", "--",
        sys.executable, "examples/ddp_loop.py", "--steps", "100000", "--step-time", "0.1",
    ]  # fmt: skip
    done = subprocess.run(command, cwd=ROOT, capture_output=True, timeout=240, check=False)
    assert done.returncode == 0, (done.stdout[-3000:], done.stderr[-3000:])
    report = json.loads(done.stdout)
    assert report["passed"] is True
    assert [c["name"] for c in report["checks"]] == list(CHECKS)
    assert all(c["passed"] for c in report["checks"])
    assert report["ranks"] == 2
    assert "--nproc-per-node=2" in report["command"]
    assert "examples/ddp_loop.py -> " in report["notes"][0]


def _processes_naming(word: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                if word.encode() in (entry / "cmdline").read_bytes():
                    found.append(int(entry.name))
    return found


def test_a_check_killed_politely_leaves_no_job_and_no_service(tmp_path: Path) -> None:
    """SIGTERM to the command mid-check: it cancels its run and stops its service
    (Redis, worker, beat) before it exits; nothing of either is left."""
    marker = "--steps=987654"  # names this test's job among the machine's processes
    log = (tmp_path / "err").open("wb")
    command = [sys.executable, "-m", "producers.cli", "check-trainer", "--warmup-steps", "1000",
               "--", sys.executable, str(LOOP), marker, "--step-time", "0.1"]  # fmt: skip
    checker = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=log)
    try:
        wait_for(lambda: _processes_naming(marker + "\0") and b"warming up" in
                 (tmp_path / "err").read_bytes(), timeout_s=60)  # fmt: skip
        state_dir = (tmp_path / "err").read_text().split("service in ")[1].split()[0]
        checker.send_signal(signal.SIGTERM)
        assert checker.wait(timeout=120) != 0
        assert _processes_naming(marker + "\0") == []
        assert _processes_naming(state_dir) == []  # its Redis server names its socket
    finally:
        if checker.poll() is None:
            checker.kill()
