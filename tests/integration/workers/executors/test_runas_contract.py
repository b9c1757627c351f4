"""The executor contract (test_contract.py) run again against a target whose jobs run
as another user (`RunAsExecutor`, this process root: scripts through `setpriv`).

The workdir is the job user's (the deployment docs/security.md gives for a worker
that is not root), in a directory others may enter: the contract's tests spawn without a
claim, so the launcher creates each run directory as the user. The toy trainer and
the job side are copied there, and run by a Python the user can run.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from bench.harness.users import JOB_USER, ensure_user, job_python, shared_dir
from schemas import JobCommand, JobStatus
from schemas.protocol import CANCEL_FILE, CANCELLING_FILE, EXIT_FILE, PID_FILE
from workers.executors import RunAsExecutor, quote

from ....conftest import JOBSIDE, TOY_TRAINER, Target
from . import test_contract
from .test_contract import *  # noqa: F403 - the contract's tests, collected here again


def user_toy(base: Path, python: str) -> Callable[..., str]:
    """The contract's `toy_command` for a job user: the toy trainer and the job side
    copied into `base` (a `shared_dir`), run by `python` (one the user can run)."""
    shutil.copytree(JOBSIDE, base / "jobside", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(TOY_TRAINER, base / "toy_trainer.py")

    def toy_command(*args: str) -> str:
        words = " ".join(quote(a) for a in args)
        return (
            f"PYTHONPATH={quote(str(base / 'jobside'))} exec {quote(python)} -u "
            f"{quote(str(base / 'toy_trainer.py'))} {words}"
        )

    return toy_command


@pytest.fixture
def target(monkeypatch: pytest.MonkeyPatch) -> Iterator[Target]:
    entry = ensure_user(JOB_USER)
    python = job_python()
    with shared_dir() as base:
        monkeypatch.setattr(test_contract, "toy_command", user_toy(base, python))
        workdir = base / "work"
        workdir.mkdir()
        os.chown(workdir, entry.pw_uid, entry.pw_gid)
        spawner = (
            "from workers.executors import RunAsExecutor\n"
            f"executor = RunAsExecutor(sys.argv[1], {JOB_USER!r})\n"
        )

        def make() -> RunAsExecutor:
            return RunAsExecutor(workdir, JOB_USER)

        executor = make()
        yield Target("runas", executor, workdir, make, spawner)
        executor.close()


def test_spawn_clears_stale_markers(target: Target) -> None:
    """The contract's test, but the run directory is the user's (as a claim leaves
    it): the markers are still root's, and the user's launcher removes them."""
    run = target.workdir / "run"
    run.mkdir()
    entry = ensure_user(JOB_USER)
    os.chown(run, entry.pw_uid, entry.pw_gid)
    for name in (EXIT_FILE, CANCELLING_FILE, CANCEL_FILE, PID_FILE):
        (run / name).write_text("7\n")
    (run / "snapshot.request").write_text("requested")
    (run / "snapshot.json").write_text('{"checkpoint": "output/checkpoint-1", "step": 1}')
    job = target.executor.spawn(JobCommand(dir=str(run), script="sleep 30"))
    assert target.executor.status(job) == JobStatus.RUNNING
    for name in (EXIT_FILE, CANCELLING_FILE, CANCEL_FILE, "snapshot.request", "snapshot.json"):
        assert not (run / name).exists(), name
    target.executor.cancel(job)
