"""`workers.executors.runas`: the command a run-as target puts in front of `sh`, and
the environment its jobs start from (no script runs here: the integration tests run
them as real users)."""

from __future__ import annotations

import os
import pwd
from pathlib import Path

import pytest

from bench.harness.users import sudoers_lines
from workers.executors import InvalidArgument, runas
from workers.executors.runas import (
    RUN_AS_PATH,
    JobUser,
    RunAsTransport,
    job_user,
    run_as_environment,
)

USER = JobUser(name="rwjob", uid=4242, gid=4343, home="/home/rw job")


def test_the_environment_is_the_users_plus_the_locale_only() -> None:
    worker = {
        "PATH": "/root/.venv/bin:/usr/bin",
        "HOME": "/root",
        "USER": "root",
        "RUNWARDEN_SECRET_HF_TOKEN": "secret",
        "RUNWARDEN_REDIS_URL": "redis://:password@host/0",
        "AWS_SECRET_ACCESS_KEY": "credential",
        "VIRTUAL_ENV": "/root/.venv",
        "SSH_AUTH_SOCK": "/tmp/agent",
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
        "LC_TIME": "C",
        "TZ": "Europe/Paris",
    }
    assert run_as_environment(USER, worker) == {
        "PATH": RUN_AS_PATH,
        "HOME": "/home/rw job",
        "USER": "rwjob",
        "LOGNAME": "rwjob",
        "SHELL": "/bin/sh",
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
        "LC_TIME": "C",
        "TZ": "Europe/Paris",
    }


def test_a_root_worker_changes_user_with_setpriv() -> None:
    transport = RunAsTransport(USER, worker_is_root=True, worker_env={"LANG": "C"})
    assert transport.how == "setpriv"
    command = transport.command
    assert command[1:6] == ["--reuid=4242", "--regid=4343", "--init-groups", "--", command[5]]
    assert os.path.basename(command[0]) == "setpriv"
    assert os.path.basename(command[5]) == "env"
    assert command[6:] == [
        "-i",
        f"PATH={RUN_AS_PATH}",
        "HOME=/home/rw job",
        "USER=rwjob",
        "LOGNAME=rwjob",
        "SHELL=/bin/sh",
        "LANG=C",
        command[-1],
    ]
    assert os.path.basename(command[-1]) == "sh"


def test_a_root_worker_without_setpriv_uses_runuser(monkeypatch: pytest.MonkeyPatch) -> None:
    real = runas._program
    monkeypatch.setattr(runas, "_program", lambda name: None if name == "setpriv" else real(name))
    transport = RunAsTransport(USER, worker_is_root=True, worker_env={})
    assert transport.how == "runuser"
    assert transport.command[1:4] == ["-u", "rwjob", "--"]
    assert os.path.basename(transport.command[0]) == "runuser"


def test_a_root_worker_with_neither_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    real = runas._program
    monkeypatch.setattr(
        runas, "_program", lambda name: None if name in ("setpriv", "runuser") else real(name)
    )
    with pytest.raises(InvalidArgument, match="neither setpriv nor runuser"):
        RunAsTransport(USER, worker_is_root=True, worker_env={})


def test_a_worker_that_is_not_root_uses_sudo_without_a_password() -> None:
    transport = RunAsTransport(USER, worker_is_root=False, worker_env={})
    assert transport.how == "sudo"
    assert transport.command[:5] == ["sudo", "-n", "-u", "rwjob", "--"]
    assert os.path.basename(transport.command[5]) == "env"
    custom = RunAsTransport(USER, worker_is_root=False, sudo=["/opt/sudo"], worker_env={})
    assert custom.command[:2] == ["/opt/sudo", "-n"]


def test_a_worker_that_is_the_user_changes_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(runas.os, "geteuid", lambda: USER.uid)
    transport = RunAsTransport(USER, worker_is_root=False, worker_env={})
    assert transport.how == "self"
    assert os.path.basename(transport.command[0]) == "env"


def test_job_user_reads_the_user_database() -> None:
    nobody = pwd.getpwnam("nobody")
    assert job_user("nobody") == JobUser("nobody", nobody.pw_uid, nobody.pw_gid, nobody.pw_dir)


@pytest.mark.parametrize(
    ("name", "needle"),
    [
        ("rw-no-such-user", "no user 'rw-no-such-user' on this machine"),
        ("root", "run_as root protects nothing"),
        ("-n", "not a user name"),
        ("$(id)", "not a user name"),
        ("a\nb", "not a user name"),
    ],
)
def test_job_user_refuses(name: str, needle: str) -> None:
    with pytest.raises(InvalidArgument, match=needle):
        job_user(name)


def test_the_security_guide_gives_the_sudoers_lines_the_tests_use() -> None:
    """The integration tests install `bench.harness.users.sudoers_lines` for their users;
    docs/security.md must give the same lines for its own."""
    readme = (Path(__file__).resolve().parents[4] / "docs" / "security.md").read_text()
    expected = "".join(f"  {line}\n" for line in sudoers_lines("runwarden", "rwjob").splitlines())
    assert f"  ```\n{expected}  ```\n" in readme
