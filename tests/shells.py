"""What the tests of the executors' scripts share: an executor whose scripts run under
one of the shells a target may have, dash (`sh`) and `busybox sh`, through
`ScriptExecutor(LocalTransport(shell=...))`, with real detached processes (the `sh`
fixture), and hostile names. The `sh` fixture is registered by
tests/integration/workers/executors/conftest.py (these tests start real shells: they
are integration tests)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from schemas import JobCommand, JobId, JobStatus
from workers.executors import CommandError, LocalTransport, ScriptExecutor
from workers.executors.transport import error_line


def run_script(executor: ScriptExecutor, script: str) -> bytes:
    """The standard output of the test's own `script` run on `executor`'s target
    through its transport (no executor operation ships a script a caller wrote).

    Raises:
        CommandError: (action `probe`) when it exits non-zero.
    """
    result = executor.transport.run(script, action="probe")
    if result.exit_code != 0:
        raise CommandError("probe", error_line(result.stderr, result.exit_code))
    return result.stdout


SHELLS = [("sh",), ("busybox", "sh")]
EXPECTED_BINARY = {("sh",): "dash", ("busybox", "sh"): "busybox"}
DEAD_PID = 4_194_305
"""Above Linux's PID_MAX_LIMIT (4194304): never a process, so never a live group."""
HOSTILE_DIR = "r $(touch PWNED) 'q' \"d\" `touch PWNED` ;&|<>*?\n\tend"
HOSTILE_NAMES = [
    "sp ace",
    "quo'te",
    'dq"uote',
    "new\nline",
    "$(touch PWNED)",
    "`touch PWNED`",
    "-leading",
    "back\\slash",
    "semi;colon&amp|pipe",
    "star*glob?",
    "ünïcödé",
    "tab\there",
    "cr\rhere",
    " lead and trail ",
]


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def no_pwned(*roots: Path) -> bool:
    return not any(list(root.rglob("PWNED")) for root in roots) and not Path("PWNED").exists()


class Shell:
    """An executor whose scripts run under one shell, and the jobs it started."""

    def __init__(self, shell: tuple[str, ...], workdir: Path) -> None:
        self.shell = shell
        self.workdir = workdir
        self.executor = ScriptExecutor(LocalTransport(shell=shell), str(workdir))
        self.jobs: list[JobId] = []

    def fresh(self) -> ScriptExecutor:
        """Another executor on the same target, as another process would build it."""
        return ScriptExecutor(LocalTransport(shell=self.shell), str(self.workdir))

    def run_dir(self, name: str = "run") -> str:
        return str(self.workdir / name)

    def spawn(self, script: str, name: str = "run") -> JobId:
        job = self.executor.spawn(JobCommand(dir=self.run_dir(name), script=script))
        self.jobs.append(job)
        return job

    def finished(self, job: JobId) -> JobStatus | None:
        status = self.executor.status(job)
        return status if status.is_finished else None

    def cleanup(self) -> None:
        for job in self.jobs:
            if group_alive(job.pid) and Path(job.dir).is_dir():
                self.executor.cancel(job)
        self.executor.close()


@pytest.fixture(params=SHELLS, ids=" ".join)
def sh(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Shell]:
    workdir = tmp_path / "work"
    workdir.mkdir()
    shell = Shell(request.param, workdir)
    yield shell
    shell.cleanup()


def crafted(sh: Shell, name: str, files: dict[str, str] | None = None) -> JobId:
    """A run directory holding `files` (protocol name -> content), for a job whose group
    is gone."""
    run = sh.workdir / name
    run.mkdir(parents=True)
    for file, content in (files or {}).items():
        (run / file).write_text(content)
    return JobId(dir=str(run), pid=DEAD_PID)
