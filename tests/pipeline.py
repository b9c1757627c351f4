"""The whole service for integration tests: a real redis-server (AOF), real Celery
worker and beat processes (each under a reaper, as `runwarden serve` runs them),
shortened clocks, and the producers' API in the test process."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from producers.api import Runwarden
from schemas import RunRecord, Settings, TargetConfig
from workers.executors import quote

from .conftest import ROOT, TOY_TRAINER
from .redis_server import RedisServer

CLOCKS = {
    "RUNWARDEN_PROOF_TIMEOUT_S": "6",
    "RUNWARDEN_END_TIMEOUT_S": "4",
    "RUNWARDEN_REQUEST_POLL_S": "2",
    "RUNWARDEN_FOLLOW_POLL_S": "0.5",
    "RUNWARDEN_RECONCILE_S": "1",
    "RUNWARDEN_DEADLINE_LEASE_S": "10",
}


def toy(*args: str) -> str:
    """The job command running the toy trainer (its job side comes from launch)."""
    words = " ".join(quote(a) for a in args)
    return f"exec {quote(sys.executable)} -u {quote(str(TOY_TRAINER))} {words}"


@dataclass
class Pipeline:
    tmp: Path
    redis: RedisServer
    env: dict[str, str]
    api: Runwarden
    workdir: Path
    workers: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    beat: subprocess.Popen[bytes] | None = None

    def start_worker(self, name: str = "w1", concurrency: int = 2) -> subprocess.Popen[bytes]:
        log = (self.tmp / f"worker-{name}.log").open("ab")
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "workers.reaper",
                "--",
                sys.executable,
                "-m",
                "celery",
                "-A",
                "workers.app",
                "worker",
                "-n",
                f"{name}@%h",
                "-c",
                str(concurrency),
                "-E",
                "--loglevel",
                "INFO",
                "--without-gossip",
                "--without-mingle",
            ],
            cwd=ROOT,
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.workers[name] = proc
        return proc

    def start_beat(self) -> None:
        log = (self.tmp / "beat.log").open("ab")
        self.beat = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "celery",
                "-A",
                "workers.app",
                "beat",
                "-s",
                str(self.tmp / "beat-schedule"),
                "--loglevel",
                "INFO",
            ],
            cwd=ROOT,
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def kill_worker(self, name: str = "w1") -> None:
        """SIGKILLs the worker and its pool processes (its whole session)."""
        proc = self.workers.pop(name)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()

    def wait_ready(self, timeout_s: float = 30.0) -> None:
        """Waits until a worker answers a ping."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            replies = self.api.app.control.ping(timeout=0.5)
            if replies:
                return
        raise AssertionError("no worker answered: " + self.logs())

    def wait_state(self, run_id: str, timeout_s: float = 60.0) -> RunRecord:
        """Waits until the run ends; returns its record."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            run = self.api.get_run(run_id)
            if run.state.is_terminal:
                return run
            time.sleep(0.1)
        raise AssertionError(f"run {run_id} did not end: {self.api.get_run(run_id)}\n{self.logs()}")

    def wait_step(self, run_id: str, step: int, timeout_s: float = 30.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            progress = self.api.store.last_metrics(run_id)
            if progress is not None and (progress.step or 0) >= step:
                return
            time.sleep(0.1)
        raise AssertionError(f"run {run_id} never reached step {step}\n{self.logs()}")

    def logs(self) -> str:
        text = []
        for path in sorted(self.tmp.glob("*.log")):
            text.append(f"--- {path.name}\n" + path.read_text(errors="replace")[-3000:])
        return "\n".join(text)

    def stop(self) -> None:
        for proc in [*self.workers.values(), *([self.beat] if self.beat else [])]:
            try:
                os.killpg(proc.pid, signal.SIGTERM)
                proc.wait(timeout=15)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        self.workers.clear()
        self.beat = None


@contextmanager
def running_pipeline(tmp: Path, workers: int = 1, beat: bool = True) -> Iterator[Pipeline]:
    redis = RedisServer(tmp / "redis")
    redis.start()
    env = {k: v for k, v in os.environ.items() if not k.startswith("RUNWARDEN_")}
    env.update(CLOCKS)
    env["RUNWARDEN_REDIS_URL"] = redis.url
    env["RUNWARDEN_STATE_DIR"] = str(tmp / "state")
    env["PYTHONPATH"] = str(ROOT)
    settings = Settings(
        **{
            k.removeprefix("RUNWARDEN_").lower(): v
            for k, v in env.items()
            if k.startswith("RUNWARDEN_")
        }
    )  # type: ignore[arg-type]
    api = Runwarden(settings)
    workdir = tmp / "work"
    workdir.mkdir()
    api.add_target(TargetConfig(name="local", kind="local", workdir=str(workdir)))
    pipeline = Pipeline(tmp, redis, env, api, workdir)
    try:
        for i in range(workers):
            pipeline.start_worker(f"w{i + 1}")
        if beat:
            pipeline.start_beat()
        pipeline.wait_ready()
        yield pipeline
    finally:
        pipeline.stop()
        redis.stop()
