"""`runwarden status` against the whole service (bench/harness/pipeline.py: a real
redis-server, Celery worker and beat, shortened clocks): it exits 1 within 5 s of a
worker or beat killed with SIGKILL and 0 again once they are back; it reads the
queues each worker really consumes; a worker that shuts down cleanly leaves no
trace; a priority message is counted in its sub-list; a Redis that is down or hangs
gives exit 1 and a clear line within bounded time.

How fast a kill is seen is measured with the command run in this process (typer's
runner over the same `app` as the `runwarden` script, every 0.1 s): a subprocess
adds the interpreter's start-up, seconds on a loaded machine, which no heartbeat can
shorten. Every check is also made once with the real `runwarden` subprocess."""

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
from typer.testing import CliRunner

from bench.harness.pipeline import Pipeline, running_pipeline
from producers.cli import app
from schemas.events import TASK_RECONCILE

from ...conftest import ROOT

pytestmark = pytest.mark.slow

DETECT_S = 5.0
"""The promise: `runwarden status` exits 1 at most this long after a SIGKILL."""
BACK_S = 90.0
"""Longest wait for a restarted worker or beat to be seen up (a worker starts in
seconds; on a loaded machine, in tens of them)."""


@pytest.fixture
def pipeline(tmp_path: Path) -> Iterator[Pipeline]:
    with running_pipeline(tmp_path) as started:
        yield started


def status(pipeline: Pipeline, *args: str) -> tuple[int, dict[str, Any]]:
    """`runwarden status --json ARGS` run in this process: its exit code and report."""
    result = CliRunner().invoke(app, ["status", "--json", *args], env=pipeline.env)
    assert result.exit_code in (0, 1), result.output
    report: dict[str, Any] = json.loads(result.output)
    return result.exit_code, report


def status_process(
    pipeline: Pipeline, *args: str, timeout: float = 120.0
) -> subprocess.CompletedProcess[str]:
    """The real `runwarden status ARGS`, as a health check runs it."""
    return subprocess.run(
        [sys.executable, "-m", "producers.cli", "status", *args],
        cwd=ROOT, env=pipeline.env, capture_output=True, text=True, timeout=timeout, check=False,
    )  # fmt: skip


def wait_every_periodic_run(pipeline: Pipeline) -> dict[str, Any]:
    """The report once every periodic task has run: beat sends each first one period
    after it starts (1 s for reconcile here), while status is up sooner."""
    deadline = time.monotonic() + BACK_S
    _, report = status(pipeline)
    while any(task["last_run_age_s"] is None for task in report["periodic"]):
        assert time.monotonic() < deadline, report["periodic"]
        time.sleep(0.2)
        _, report = status(pipeline)
    return report


def wait_status(
    pipeline: Pipeline, code: int, timeout_s: float, *args: str
) -> tuple[float, dict[str, Any]]:
    """Runs the command every 0.1 s until it exits `code`; returns when (monotonic)
    and its report. Fails after `timeout_s` with the last report and the logs."""
    deadline = time.monotonic() + timeout_s
    while True:
        got, report = status(pipeline, *args)
        if got == code:
            return time.monotonic(), report
        if time.monotonic() > deadline:
            raise AssertionError(
                f"status never exited {code} in {timeout_s} s: {report}\n{pipeline.logs()}"
            )
        time.sleep(0.1)


def test_a_killed_worker_is_down_within_5_s_and_up_again_when_restarted(
    pipeline: Pipeline,
) -> None:
    _, report = wait_status(pipeline, 0, BACK_S)
    (worker,) = report["workers"]
    assert worker["alive"]
    assert worker["name"].startswith("w1@")
    assert worker["pid"] == _main_pid(pipeline.workers["w1"].pid)
    assert worker["queues"] == ["celery", "runwarden", "runwarden.retrieve", "runwarden.watch"]
    # The periodic tasks record their runs, each within about its period.
    report = wait_every_periodic_run(pipeline)
    for task in report["periodic"]:
        assert task["last_run_age_s"] < task["period_s"] + 5, task
    assert status_process(pipeline).returncode == 0

    killed = time.monotonic()
    pipeline.kill_worker("w1")
    seen, report = wait_status(pipeline, 1, DETECT_S + 5)
    assert seen - killed <= DETECT_S, f"seen down {seen - killed:.2f} s after the kill"
    assert report["problems"][:3] == [
        "workers: no live worker consumes the queue 'runwarden'",
        "workers: no live worker consumes the queue 'runwarden.retrieve'",
        "workers: no live worker consumes the queue 'runwarden.watch'",
    ]
    (worker,) = report["workers"]
    assert not worker["alive"]
    # A message waiting in a priority sub-list of the broker is counted there.
    pipeline.api.app.send_task(TASK_RECONCILE, priority=6)
    _, report = status(pipeline)
    runwarden = next(q for q in report["queues"] if q["name"] == "runwarden")
    assert runwarden["by_priority"].get("6", 0) >= 1, runwarden
    assert runwarden["depth"] >= sum(runwarden["by_priority"].values())
    done = status_process(pipeline)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "problem: workers: no live worker consumes the queue 'runwarden'" in done.stdout

    pipeline.start_worker("w1")
    wait_status(pipeline, 0, BACK_S)
    assert status_process(pipeline).returncode == 0


def test_a_killed_beat_is_down_within_5_s_and_up_again_when_restarted(
    pipeline: Pipeline,
) -> None:
    _, report = wait_status(pipeline, 0, BACK_S)
    wait_every_periodic_run(pipeline)  # a task never run is never late
    (beat,) = report["beats"]
    assert beat["alive"]
    assert pipeline.beat is not None
    assert beat["pid"] == pipeline.beat.pid

    killed = time.monotonic()
    pipeline.kill_beat()
    seen, report = wait_status(pipeline, 1, DETECT_S + 5)
    assert seen - killed <= DETECT_S, f"seen down {seen - killed:.2f} s after the kill"
    assert report["problems"] == ["beat: no live beat (periodic tasks are not sent)"]
    done = status_process(pipeline)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "problem: beat: no live beat" in done.stdout
    # Without beat the ticks stop: past the threshold each periodic task is late.
    _, report = wait_status(pipeline, 1, 10, "--late-after", "2")
    late = set()
    deadline = time.monotonic() + 15
    while len(late) < len(report["periodic"]) and time.monotonic() < deadline:
        _, report = status(pipeline, "--late-after", "2")
        late = {t["task"] for t in report["periodic"] if t["late"]}
        time.sleep(0.2)
    assert late == {t["task"] for t in report["periodic"]}, report
    assert all(f"periodic: {task} late by" in " ".join(report["problems"]) for task in late)

    pipeline.start_beat()
    wait_status(pipeline, 0, BACK_S)
    assert status_process(pipeline).returncode == 0


def test_status_reads_the_queues_each_worker_consumes(pipeline: Pipeline) -> None:
    wait_status(pipeline, 0, BACK_S)
    pipeline.start_worker("main", queues="runwarden,celery")
    pipeline.kill_worker("w1")
    pipeline.wait_worker("main")
    _, report = wait_status(pipeline, 1, BACK_S)
    deadline = time.monotonic() + BACK_S
    missing = [
        "workers: no live worker consumes the queue 'runwarden.retrieve'",
        "workers: no live worker consumes the queue 'runwarden.watch'",
    ]
    while report["problems"] != missing:
        assert time.monotonic() < deadline, report
        time.sleep(0.2)
        _, report = status(pipeline)
    pipeline.start_worker("fetch", queues="runwarden.retrieve")
    pipeline.start_worker("watch", queues="runwarden.watch")
    _, report = wait_status(pipeline, 0, BACK_S)
    live = {w["name"].split("@")[0]: w["queues"] for w in report["workers"] if w["alive"]}
    assert live == {
        "main": ["celery", "runwarden"],
        "fetch": ["runwarden.retrieve"],
        "watch": ["runwarden.watch"],
    }


def test_a_worker_that_shuts_down_cleanly_leaves_no_trace(pipeline: Pipeline) -> None:
    pipeline.start_worker("w2")
    pipeline.wait_worker("w2")
    wait_status(pipeline, 0, BACK_S)
    proc = pipeline.workers.pop("w2")
    os.killpg(proc.pid, signal.SIGTERM)
    proc.wait(timeout=60)
    _, report = status(pipeline)
    assert [w["name"].split("@")[0] for w in report["workers"]] == ["w1"]
    assert report["warnings"] == []
    assert report["ok"]


def test_status_is_quick_with_exit_1_and_a_clear_line_when_redis_is_down_or_hangs(
    pipeline: Pipeline,
) -> None:
    wait_status(pipeline, 0, BACK_S)
    pid = pipeline.redis.pid
    assert pid is not None
    os.kill(pid, signal.SIGSTOP)  # hangs: accepts connections, answers nothing
    try:
        started = time.monotonic()
        code, report = status(pipeline, "--timeout", "1")
        took = time.monotonic() - started
        assert code == 1
        assert took < 2 * 1 + 1.0, f"took {took:.2f} s"
        assert report["redis"]["reachable"] is False
        assert "did not answer in time" in report["redis"]["error"]
        done = status_process(pipeline, "--timeout", "1", timeout=60)
        assert done.returncode == 1
        assert "problem: redis: unreachable at unix://" in done.stdout
        assert "did not answer in time" in done.stdout
    finally:
        os.kill(pid, signal.SIGCONT)

    pipeline.redis.kill()  # down: nothing listens
    started = time.monotonic()
    code, report = status(pipeline)
    took = time.monotonic() - started
    assert code == 1
    assert took < 2.0, f"took {took:.2f} s"
    assert report["problems"] == [
        f"redis: unreachable at {report['redis']['address']}: {report['redis']['error']}"
    ]
    assert report["redis"]["error"].startswith("cannot reach Redis: ")
    done = status_process(pipeline, timeout=60)
    assert done.returncode == 1
    lines = done.stdout.splitlines()
    assert lines[0] == "runwarden: DOWN (1 problem(s))"
    assert lines[-1].startswith("problem: redis: unreachable at unix://")
    assert done.stderr == ""
    pipeline.redis.start()
    wait_status(pipeline, 0, BACK_S)


def _main_pid(reaper_pid: int) -> int:
    """The pid of the worker's main process: the reaper's child (bench/harness/pipeline.py)."""
    children = Path(f"/proc/{reaper_pid}/task/{reaper_pid}/children").read_text().split()
    (child,) = children
    return int(child)
