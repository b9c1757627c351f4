"""The executor contract (test_contract.py) run again against an SSH target whose jobs
run as a user of their own (`SshExecutor` with `run_as`): an `sshd` on loopback whose
only login is the control user, every script but the control ones through `sudo -n -u
USER` there (the sudoers line docs/security.md gives), streams (upload, download, the
launcher's secrets) included.

As in test_runas_contract.py, the workdir is the jobs' user's, in a directory others
may enter, and the toy trainer and the job side are copied there."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from bench.harness.processes import kill_processes_in
from bench.harness.sshd import SshServer, running_sshd
from bench.harness.users import (
    JOB_USER,
    WORKER_USER,
    ensure_login_user,
    ensure_sudo_rule,
    ensure_user,
    job_python,
    shared_dir,
)
from workers.executors import SshExecutor

from ....conftest import Target
from . import test_contract
from .test_contract import *  # noqa: F403 - the contract's tests, collected here again
from .test_runas_contract import (
    test_spawn_clears_stale_markers,  # noqa: F401 - the user's run dir
    user_toy,
)


@pytest.fixture(scope="module")
def server() -> Iterator[tuple[SshServer, str]]:
    """One server for the module (login: the control user), and a Python the jobs'
    user can run."""
    ensure_login_user(WORKER_USER)
    ensure_user(JOB_USER)
    ensure_sudo_rule(WORKER_USER, JOB_USER)
    with shared_dir("rw-ssh-runas-sshd-") as base, running_sshd(base, login=WORKER_USER) as sshd:
        yield sshd, job_python()


@pytest.fixture
def target(server: tuple[SshServer, str], monkeypatch: pytest.MonkeyPatch) -> Iterator[Target]:
    sshd, python = server
    entry = ensure_user(JOB_USER)
    with shared_dir() as base:
        monkeypatch.setattr(test_contract, "toy_command", user_toy(base, python))
        workdir = base / "work"
        workdir.mkdir()
        os.chown(workdir, entry.pw_uid, entry.pw_gid)
        spawner = (
            "from pathlib import Path\n"
            "from workers.executors.ssh import SshExecutor\n"
            f"executor = SshExecutor.connect({sshd.destination!r}, sys.argv[1], "
            f"identity=Path({str(sshd.client_key)!r}), "
            f"known_hosts=Path({str(sshd.known_hosts)!r}), run_as={JOB_USER!r})\n"
        )

        def make() -> SshExecutor:
            return SshExecutor.connect(
                sshd.destination, str(workdir), identity=sshd.client_key,
                known_hosts=sshd.known_hosts, run_as=JOB_USER,
            )  # fmt: skip

        executor = make()
        yield Target("ssh-runas", executor, workdir, make, spawner)
        executor.close()
        # Only this test's: other tests run as the same user meanwhile.
        kill_processes_in(base)
