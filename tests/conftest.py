"""Fixtures shared by every test: the executors under test, the toy trainer, and the
reaping this machine needs.

This process becomes a child subreaper at start: jobs whose spawner died (a test
does that on purpose) and job processes that outlive their leader are re-parented
here, and the executors reap them by process group. Without it they would go to
init, which on some machines (this one) never reaps, and a zombie counts as a live
group member.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from workers.executors import LocalExecutor, LocalTransport, ScriptExecutor
from workers.executors.base import Executor
from workers.reaper import become_subreaper

ROOT = Path(__file__).resolve().parent.parent
JOBSIDE = ROOT / "workers" / "jobside"
TOY_TRAINER = ROOT / "examples" / "toy_trainer.py"

become_subreaper()


def wait_for(
    condition: Callable[[], object], timeout_s: float = 10.0, interval_s: float = 0.05
) -> object:
    """Polls `condition` until it returns something truthy, which is returned; fails
    the test after `timeout_s` seconds."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"condition not met within {timeout_s} s")
        time.sleep(interval_s)


def toy_command(*args: str) -> str:
    """A job script running the toy trainer with `args`, the job side on its path."""
    from workers.executors import quote

    words = " ".join(quote(a) for a in args)
    return (
        f"PYTHONPATH={quote(str(JOBSIDE))} exec {quote(sys.executable)} -u "
        f"{quote(str(TOY_TRAINER))} {words}"
    )


def toy_env(run_dir: str) -> dict[str, str]:
    """The job-side variables launch sets for a job in `run_dir`."""
    return {
        "RUNWARDEN_SNAPSHOT_REQUEST": f"{run_dir}/snapshot.request",
        "RUNWARDEN_METRICS": f"{run_dir}/metrics.jsonl",
    }


@dataclass
class Target:
    """An executor under test and the directory its run directories live in."""

    kind: str
    executor: Executor
    workdir: Path
    make: Callable[[], Executor]
    """A fresh executor of the same kind on the same target (another process would
    build the same)."""
    spawner: str
    """Python source that builds an executor of this kind from `sys.argv[1]` (the
    workdir) and binds it to `executor`."""

    def run_dir(self, name: str = "run") -> str:
        return str(self.workdir / name)


def _local(workdir: Path) -> Executor:
    return LocalExecutor(workdir)


def _shell(workdir: Path) -> Executor:
    return ScriptExecutor(LocalTransport(), str(workdir))


_SPAWNERS = {
    "local": "from workers.executors import LocalExecutor\n"
    "executor = LocalExecutor(sys.argv[1])\n",
    "shell": "from workers.executors import ScriptExecutor, LocalTransport\n"
    "executor = ScriptExecutor(LocalTransport(), sys.argv[1])\n",
}
_FACTORIES = {"local": _local, "shell": _shell}


@pytest.fixture(params=["local", "shell"])
def target(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Target]:
    """Each executor of the contract: `local` (LocalExecutor, native file access) and
    `shell` (every operation through the shared scripts, as over SSH)."""
    kind: str = request.param
    workdir = tmp_path / "work"
    workdir.mkdir()
    factory = _FACTORIES[kind]
    executor = factory(workdir)
    yield Target(kind, executor, workdir, lambda: factory(workdir), _SPAWNERS[kind])
    executor.close()


@pytest.fixture
def env_without_runwarden(monkeypatch: pytest.MonkeyPatch) -> None:
    """Removes the service's own variables from this process, as a clean worker."""
    for name in list(os.environ):
        if name.startswith(("RUNWARDEN_", "OVERBRAINER_", "VAULT_")):
            monkeypatch.delenv(name)
