"""The service stays bounded, end to end (real redis-server, Celery worker and beat,
bench/harness/pipeline.py): a retrieval that would eat into the artifact store's disk reserve
fails with the reason and leaves nothing while a stop on another run still
completes; a run that writes far more log than its budget keeps at most its budget
in Redis, and an ended run's follow data expires after the retention while its
record stays."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from bench.harness.pipeline import Pipeline, running_pipeline, toy
from schemas import ArtifactsPhase, RunState
from schemas.events import LaunchSpec
from store.streams import ENTRY_OVERHEAD_BYTES
from workers.executors import quote
from workers.retrieval.quota import free_bytes

from ...conftest import ROOT, wait_for

pytestmark = pytest.mark.slow


@pytest.fixture
def reserved(tmp_path: Path) -> Iterator[Pipeline]:
    """A pipeline whose artifact store must keep 1 TiB more free than there is."""
    reserve = free_bytes(tmp_path) + 1024**4
    env = {"RUNWARDEN_ARTIFACT_RESERVE_BYTES": str(reserve)}
    with running_pipeline(tmp_path, extra_env=env) as started:
        yield started


def test_a_retrieval_past_the_reserve_fails_and_a_stop_still_completes(
    reserved: Pipeline,
) -> None:
    pipeline = reserved
    short = pipeline.api.launch(
        LaunchSpec(target="local", command=toy("--steps", "5", "--step-time", "0.02")), wait_s=60
    )
    long = pipeline.api.launch(
        LaunchSpec(target="local", command=toy("--steps", "100000", "--step-time", "0.05")),
        wait_s=60,
    )
    ended = pipeline.wait_state(short.id)
    assert ended.state is RunState.SUCCEEDED, ended

    deadline = time.monotonic() + 60
    while True:
        artifacts = pipeline.api.get_run(short.id).artifacts
        if artifacts is not None and artifacts.phase is ArtifactsPhase.FAILED:
            break
        assert time.monotonic() < deadline, f"{artifacts}\n{pipeline.logs()}"
        time.sleep(0.2)
    assert artifacts.error is not None
    assert "RUNWARDEN_ARTIFACT_RESERVE_BYTES" in artifacts.error
    assert f"runwarden retrieve {short.id}" in artifacts.error
    store = pipeline.api.settings.artifacts_root
    assert not store.exists() or list(store.iterdir()) == []  # nothing left, no partial copy
    run_dir = Path(ended.remote_dir)
    assert (run_dir / "output" / "checkpoint-5" / "weights.bin").stat().st_size > 0
    assert "training done" in (run_dir / "job.log").read_text()  # the target's copy is kept

    # A stop on another run still completes, with its checkpoint.
    pipeline.wait_step(long.id, 3)
    pipeline.api.stop(long.id, asked_by="test")
    stopped = pipeline.wait_state(long.id)
    assert stopped.state is RunState.STOPPED, stopped
    assert stopped.snapshot is not None
    assert (Path(stopped.remote_dir) / stopped.snapshot.checkpoint).is_dir()

    # `runwarden show` says why the artifacts are not home, and warns when Redis is
    # above 80 % of its maxmemory.
    shown = show(pipeline, short.id)
    assert "RUNWARDEN_ARTIFACT_RESERVE_BYTES" in shown
    assert "Redis memory is high" not in shown
    client = pipeline.redis.client()
    used = pipeline.api.store.health.memory().used
    client.config_set("maxmemory", int(used / 0.85))
    try:
        shown = show(pipeline, short.id)
    finally:
        client.config_set("maxmemory", 0)
    assert "Redis memory is high" in shown
    assert "RUNWARDEN_REDIS_MAXMEMORY" in shown


def show(pipeline: Pipeline, run_id: str) -> str:
    """`runwarden show RUN`'s output, wide enough that no line wraps."""
    done = subprocess.run(
        [sys.executable, "-m", "producers.cli", "show", run_id],
        env={**pipeline.env, "COLUMNS": "400"}, cwd=ROOT, stdin=subprocess.DEVNULL,
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    return " ".join(done.stdout.split())


# --- Redis: the log budget and the retention ------------------------------------

LOG_BUDGET = 64 * 1024
LINE_CAP = 1000
RETENTION_S = 4.0

CHATTY_JOB = (
    "import sys, time\n"
    "for i in range(4000):\n"
    "    print(f'line {i:05d} ' + 'x' * 190)\n"
    "print('y' * 50000)\n"
    "print('last line', flush=True)\n"
    "time.sleep(4)\n"
)
"""About 850 KB of log, a line of 50 KB among it, then time for the follow to read it."""


@pytest.fixture(scope="module")
def bounded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pipeline]:
    env = {
        "RUNWARDEN_LOG_BYTES_PER_RUN": "64kib",
        "RUNWARDEN_LOG_LINE_BYTES": str(LINE_CAP),
        "RUNWARDEN_RETENTION_DAYS": str(RETENTION_S / 86400),
    }
    with running_pipeline(tmp_path_factory.mktemp("bounded"), extra_env=env) as started:
        yield started


def test_a_chatty_run_keeps_its_log_budget_and_its_follow_data_expires(
    bounded: Pipeline,
) -> None:
    pipeline = bounded
    command = f"exec {quote(sys.executable)} -u -c {quote(CHATTY_JOB)}"
    run = pipeline.api.launch(LaunchSpec(target="local", command=command), wait_s=60)
    ended = pipeline.wait_state(run.id, timeout_s=90)
    assert ended.state is RunState.SUCCEEDED, ended
    store = pipeline.api.store
    client: Any = store.client

    lines = [entry.line for entry in store.follow.read_log(run.id, count=100_000)]
    assert lines[-1] == "last line"
    assert lines[-2].startswith("y" * 100)
    assert lines[-2].endswith("[runwarden: line cut, 50000 bytes]")
    assert all(len(line.encode()) <= LINE_CAP for line in lines)
    held = sum(len(line.encode()) + ENTRY_OVERHEAD_BYTES for line in lines)
    assert held <= LOG_BUDGET
    assert len(lines) < 4000  # most were dropped, oldest first
    # Written faster than a tick reads: the follow went on from the log's last budget's
    # worth, saying how many bytes it skipped; from there every line, in order.
    skip = max(i for i, line in enumerate(lines) if line.startswith("runwarden: "))
    assert " bytes of job.log skipped: " in lines[skip], lines[skip]
    first = int(lines[skip + 1].split()[1])
    assert [line.split()[1] for line in lines[skip + 1 : -2]] == [
        f"{i:05d}" for i in range(first, 4000)
    ]
    assert (Path(ended.remote_dir) / "job.log").stat().st_size > 800_000  # all of it there

    data = store.keys.follow_data(run.id)
    assert 0 < int(client.pttl(store.keys.log(run.id))) <= RETENTION_S * 1000
    deadline = time.monotonic() + 30
    while any(client.exists(key) for key in data):
        assert time.monotonic() < deadline, [k for k in data if client.exists(k)]
        time.sleep(0.2)
    assert store.follow.read_log(run.id) == []
    assert pipeline.api.get_run(run.id).state is RunState.SUCCEEDED  # the record stays


FAST_JOB = (
    "import sys, time\n"
    "line, i, start = 'x' * 100, 0, time.monotonic()\n"
    "while time.monotonic() - start < 5:\n"
    "    began = time.monotonic()\n"
    "    sys.stdout.write(''.join(f'{i + k:07d} {line}\\n' for k in range(2000)))\n"
    "    sys.stdout.flush()\n"
    "    i += 2000\n"
    "    time.sleep(max(0.0, 0.1 - (time.monotonic() - began)))\n"
    "print('last line', flush=True)\n"
    "time.sleep(60)\n"
)
"""About 2.2 MB/s of log for 5 s (2,000 lines of 109 bytes every 0.1 s), then quiet."""


def test_the_follow_keeps_up_with_a_job_writing_megabytes_a_second(bounded: Pipeline) -> None:
    """A tick reads at most the run's log budget (64 KiB here: 128 KiB/s at a 0.5 s
    period), yet the recorded log is never more than about a tick behind: a tick
    further behind skips to the log's last budget's worth, which the store would
    keep of it anyway. It once read on from where it was, ever later."""
    pipeline = bounded
    command = f"exec {quote(sys.executable)} -u -c {quote(FAST_JOB)}"
    run = pipeline.api.launch(LaunchSpec(target="local", command=command), wait_s=60)
    log = Path(run.remote_dir) / "job.log"
    store = pipeline.api.store

    def newest() -> str:
        entries = store.follow.read_log_newest(run.id, count=1)
        return entries[0].line if entries else ""

    def written_last() -> bool:
        with log.open("rb") as file:
            file.seek(max(0, log.stat().st_size - 64))
            return file.read().endswith(b"last line\n")

    behind: list[int] = []

    def sample() -> bool:
        behind.append(log.stat().st_size - store.follow.offsets(run.id).log if log.exists() else 0)
        return written_last()

    wait_for(sample, timeout_s=30)
    written = time.monotonic()
    wait_for(lambda: newest() == "last line", timeout_s=10)
    lag = time.monotonic() - written
    assert lag < 3.0, f"the follow caught up {lag:.1f} s after the job's last line"
    # While the job wrote: never much more than the budget and a tick's writing behind
    # (a second's, for a loaded machine).
    assert max(behind) < 64 * 1024 + 2_200_000, max(behind)
    lines = [entry.line for entry in store.follow.read_log(run.id, count=100_000)]
    held = sum(len(line.encode()) + ENTRY_OVERHEAD_BYTES for line in lines)
    assert held <= LOG_BUDGET
    assert log.stat().st_size > 10_000_000  # all of it on the target
    pipeline.api.cancel(run.id)
