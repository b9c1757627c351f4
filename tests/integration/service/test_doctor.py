"""`runwarden doctor TARGET` end to end: the CLI as a subprocess, a real redis-server
and Celery worker (bench/harness/pipeline.py), the signed `runwarden.doctor` task the worker
answers, and targets seen the worker's way: this machine through the worker's own
PATH (which here lacks curl, wget and python3: warnings only, exit 0), a real sshd
(complete: exit 0; a workdir nobody can make: exit 1), a port where nothing listens
(exit 1), an unknown target (exit 2)."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from celery.exceptions import CeleryError

from bench.harness.pipeline import Pipeline, running_pipeline
from bench.harness.sshd import SshServer
from schemas import SshOptions, TargetConfig
from schemas.doctor import DoctorReport
from schemas.events import TASK_DOCTOR
from workers.cgroups import CGROUP_PARENT, hierarchy
from workers.executors.scripts.doctor import UTILITIES

from ...conftest import ROOT

pytestmark = pytest.mark.slow

WORKER_TOOLS = (*UTILITIES, "tar", "sha256sum", "dd", "timeout", "readlink", "mktemp", "setsid")
"""What the worker's PATH holds: all the scripts need, no HTTP client, no python3."""


def worker_path(root: Path) -> str:
    bin_dir = root / "worker-bin"
    bin_dir.mkdir()
    for name in ("sh", *WORKER_TOOLS):
        program = shutil.which("dash" if name == "sh" else name)
        assert program is not None, f"{name} is not installed here (make system-deps)"
        (bin_dir / name).symlink_to(program)
    return str(bin_dir)


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pipeline]:
    root = tmp_path_factory.mktemp("doctor")
    with running_pipeline(root, beat=False, extra_env={"PATH": worker_path(root)}) as started:
        yield started


def rw(pipeline: Pipeline, *args: str) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        [sys.executable, "-m", "producers.cli", *args],
        env={**pipeline.env, "COLUMNS": "250"},
        cwd=ROOT,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=200,
        check=False,
    )
    assert "Traceback" not in result.stdout + result.stderr, show(result)
    return result


def show(result: subprocess.CompletedProcess[str]) -> str:
    return (
        f"$ runwarden {shlex.join(result.args[3:])}\nexit {result.returncode}\n"
        f"--- stdout\n{result.stdout}--- stderr\n{result.stderr}"
    )


def rows(table: str) -> dict[str, list[str]]:
    """The table's rows by check name: the cells of each."""
    found = {}
    for line in table.splitlines():
        if line.startswith("│"):
            cells = [c.strip() for c in line.strip("│").split("│")]
            if cells[0] and cells[0] != "check":
                found[cells[0]] = cells
    return found


def report_of(pipeline: Pipeline, target: str, code: int) -> DoctorReport:
    result = rw(pipeline, "doctor", target, "--json")
    assert result.returncode == code, show(result)
    assert result.stderr == "", show(result)
    return DoctorReport.model_validate(json.loads(result.stdout))


def add_ssh_target(pipeline: Pipeline, server: SshServer, name: str, workdir: str) -> None:
    pipeline.api.add_target(
        TargetConfig(
            name=name,
            kind="ssh",
            workdir=workdir,
            ssh=SshOptions(
                destination=server.destination,
                identity=str(server.client_key),
                known_hosts=str(server.known_hosts),
            ),
        )
    )


def test_this_machine_through_the_workers_path(pipeline: Pipeline) -> None:
    result = rw(pipeline, "doctor", "local")
    assert result.returncode == 0, show(result)
    assert result.stderr == ""
    table = rows(result.stdout)
    assert table["setsid"][1] == "ok"
    assert table["http-client"][1:3] == ["warn", "neither curl nor wget"]
    assert "notice watcher" in table["http-client"][3]
    assert table["python"][1:3] == ["warn", "no python3 on the job's PATH"]
    assert table["clock"][1] == "ok"
    assert table["cgroup"][1] == "ok"  # root, on this machine's cgroup v2 hierarchy
    assert table["sh"][3] == ""  # what breaks is shown for what is not ok only
    lines = result.stdout.splitlines()
    # The harness's local target says its jobs run as root (this test's user).
    head = f"target local (local, {pipeline.workdir}, jobs as root), checked by worker "
    assert lines[0].startswith(head)
    assert lines[-1] == "usable, with 3 warning(s)"

    report = report_of(pipeline, "local", 0)
    warned = {c.name: c.status for c in report.warnings}
    assert warned == {"http-client": "warn", "python": "warn", "job-user": "warn"}
    assert report.missing == ()
    # The worker answered, not this process: the report names one of its pool processes.
    host, pid = report.worker.rsplit(":", 1)
    assert host == os.uname().nodename
    assert os.getsid(int(pid)) == pipeline.workers["w1"].pid
    assert report.clock is not None
    assert report.clock.worst_s < 1.0


def test_a_complete_ssh_target(pipeline: Pipeline, sshd: SshServer, tmp_path: Path) -> None:
    add_ssh_target(pipeline, sshd, "remote", str(tmp_path / "runs"))
    result = rw(pipeline, "doctor", "remote")
    assert result.returncode == 0, show(result)
    # All there, its runs contained (the login user is root: the launcher makes each
    # run's cgroup there), but their user not a separate one: said plainly.
    assert result.stdout.splitlines()[-1] == "usable, with 1 warning(s)"
    table = rows(result.stdout)
    user = "none: jobs run as the SSH login user, as the worker's scripts there do"
    assert table["job-user"][1:3] == ["warn", user]
    found = f"a cgroup v2 per run under {hierarchy()}/{CGROUP_PARENT}, made by the login user"
    assert table["cgroup"][1:3] == ["ok", found]
    assert table["tar"][2].startswith("GNU tar")
    assert not (tmp_path / "runs").exists()  # the first claim makes it, not the doctor


def test_an_ssh_workdir_nobody_can_make(pipeline: Pipeline, sshd: SshServer) -> None:
    add_ssh_target(pipeline, sshd, "proc", "/proc/runwarden/runs")
    result = rw(pipeline, "doctor", "proc")
    assert result.returncode == 1, show(result)
    table = rows(result.stdout)
    assert table["workdir"][1] == "missing"
    assert "cannot make it in /proc" in table["workdir"][2]
    assert "every launch" in table["workdir"][3]
    # job-user (its runs would be contained: the login user is root)
    assert result.stdout.splitlines()[-1].startswith("1 missing, 1 warning(s)")
    report = report_of(pipeline, "proc", 1)
    assert [c.name for c in report.missing] == ["workdir"]


def test_a_target_nothing_answers_for(pipeline: Pipeline) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    pipeline.api.add_target(
        TargetConfig(
            name="gone", kind="ssh", workdir="/w",
            ssh=SshOptions(destination=f"nobody@127.0.0.1:{port}"),
        )
    )  # fmt: skip
    report = report_of(pipeline, "gone", 1)
    assert [(c.name, c.status) for c in report.checks] == [("access", "missing")]
    assert f"127.0.0.1:{port}" in report.checks[0].found


def test_an_unknown_target_is_bad_input(pipeline: Pipeline) -> None:
    result = rw(pipeline, "doctor", "nowhere")
    assert result.returncode == 2, show(result)
    assert result.stdout == ""
    assert result.stderr.startswith("error: ")
    assert "nowhere" in result.stderr


def test_an_unsigned_doctor_message_is_refused(pipeline: Pipeline) -> None:
    sent = pipeline.api.app.send_task(TASK_DOCTOR, kwargs={"body": {"target": "local"}})
    with pytest.raises(Exception) as refused:  # noqa: PT011 - the worker's own error
        sent.get(timeout=60, propagate=True)
    assert not isinstance(refused.value, CeleryError), refused.value
    assert "not signed" in str(refused.value), refused.value
    signed = pipeline.send(TASK_DOCTOR, {"target": "local"})
    assert DoctorReport.model_validate(signed.get(timeout=120)).target == "local"
