"""Users for the tests of jobs run as another user (`TargetConfig.run_as`).

The tests run as root. They create, idempotently, and leave behind:

- [`JOB_USER`], the unprivileged user jobs run as;
- [`WORKER_USER`], an unprivileged user playing a worker that is not root (the tests
  put `setpriv` to it in front of `sudo`, so sudo sees that user ask);
- [`SUDOERS_FILE`], holding exactly the sudoers lines docs/security.md gives, for
  [`WORKER_USER`] and [`JOB_USER`];
- [`WORKER_USER`] a member of [`JOB_USER`]'s group, when an SSH test logs it in to a
  delegated cgroup ([`ensure_group_member`], the setup docs/security.md gives a login
  that is not root).

Everything a job run as [`JOB_USER`] must reach (its workdir, the files it runs) lives
under a [`shared_dir`]: pytest's own temporary directories are the root's alone
(mode 0700), and a job that cannot even reach them would prove nothing.
"""

from __future__ import annotations

import contextlib
import grp
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Final

__all__ = [
    "JOB_USER",
    "SUDOERS_FILE",
    "WORKER_USER",
    "as_user",
    "ensure_group_member",
    "ensure_login_user",
    "ensure_sudo_rule",
    "ensure_user",
    "job_python",
    "shared_dir",
    "sudoers_lines",
]

JOB_USER: Final = "rwtestjob"
WORKER_USER: Final = "rwtestworker"
SUDOERS_FILE: Final = Path("/etc/sudoers.d/runwarden-tests")


def as_the_worker() -> dict[str, str]:
    """The fields of a local target whose jobs run as the worker's own user: `run_as:
    root` said explicitly when this process is root (a worker that is root refuses a
    local target that does not say it), none otherwise."""
    return {"run_as": "root"} if os.geteuid() == 0 else {}


def as_the_worker_args() -> list[str]:
    """[`as_the_worker`] as the options of `runwarden targets add`."""
    return ["--run-as", "root"] if os.geteuid() == 0 else []


def ensure_user(name: str) -> pwd.struct_passwd:
    """The user `name`, created when missing (`useradd`: a home, a group of its own,
    `/bin/sh`). Two test processes creating it at once both succeed."""
    with contextlib.suppress(KeyError):
        return pwd.getpwnam(name)
    result = subprocess.run(
        ["useradd", "--create-home", "--user-group", "--shell", "/bin/sh", name],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    # 9: the name is taken (created meanwhile by another test process).
    if result.returncode not in (0, 9):
        raise RuntimeError(f"useradd {name} failed ({result.returncode}): {result.stderr}")
    return pwd.getpwnam(name)


def ensure_login_user(name: str) -> pwd.struct_passwd:
    """[`ensure_user`], with its account unlocked for key logins (`usermod -p '*'`:
    no password works, and sshd without PAM refuses a locked account): the control
    user an SSH target logs in as."""
    entry = ensure_user(name)
    with open("/etc/shadow", encoding="utf-8") as shadow:
        locked = any(line.startswith(f"{name}:!") for line in shadow)
    if locked:  # once: a test process beside it may be running sudo as this user
        subprocess.run(["usermod", "-p", "*", name], check=True, capture_output=True, timeout=60)
    return entry


def ensure_group_member(user: str, group: str) -> None:
    """Makes `user` a member of `group` (`usermod -a -G`) when it is not yet: the login
    of an SSH target whose jobs run as another user, in the jobs' user's own group, as
    docs/security.md asks of a login that is not root (it gives the user its run's
    cgroup files by `chgrp`). Takes effect at the user's next login."""
    if user in grp.getgrnam(group).gr_mem:
        return
    subprocess.run(
        ["usermod", "-a", "-G", group, user], check=True, capture_output=True, timeout=60
    )


def sudoers_lines(worker: str, job: str) -> str:
    """The sudoers lines docs/security.md gives: `worker` may run anything as `job` (and
    only as `job`) without a password; its sudo calls are kept out of syslog."""
    return f"{worker} ALL=({job}) NOPASSWD: ALL\nDefaults:{worker} !syslog\n"


def ensure_sudo_rule(worker: str = WORKER_USER, job: str = JOB_USER) -> None:
    """Writes [`sudoers_lines`] to [`SUDOERS_FILE`] (mode 0440, checked by `visudo -c`
    first) when it does not hold them yet."""
    text = sudoers_lines(worker, job)
    with contextlib.suppress(FileNotFoundError):
        if SUDOERS_FILE.read_text() == text:
            return
    temp = SUDOERS_FILE.with_name(f".{SUDOERS_FILE.name}.{os.getpid()}")
    temp.write_text(text)
    try:
        temp.chmod(0o440)
        subprocess.run(["visudo", "-c", "-q", "-f", str(temp)], check=True, timeout=30)
        os.replace(temp, SUDOERS_FILE)
    finally:
        temp.unlink(missing_ok=True)


def as_user(name: str) -> list[str]:
    """The command words that run what follows them as user `name` (from root)."""
    entry = ensure_user(name)
    return [
        "setpriv",
        f"--reuid={entry.pw_uid}",
        f"--regid={entry.pw_gid}",
        "--init-groups",
        "--",
    ]


@contextlib.contextmanager
def shared_dir(prefix: str = "rw-runas-") -> Iterator[Path]:
    """A new directory under the system temp dir, mode 0755 (others may enter it),
    removed with all it holds on exit."""
    path = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        path.chmod(0o755)
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def job_python(user: str = JOB_USER) -> str:
    """A Python 3 that `user` can run: this interpreter when it can (a venv under a
    private home cannot), else `python3` from the system's directories."""
    candidates = [sys.executable, shutil.which("python3", path="/usr/local/bin:/usr/bin:/bin")]
    for candidate in candidates:
        if candidate is None:
            continue
        # Through `sh`, as a job starts it (an `exec` straight from setpriv is not
        # the same test on every kernel).
        probe = subprocess.run(
            [*as_user(user), "/bin/sh", "-c", 'exec "$0" -c "import json, hashlib"', candidate],
            capture_output=True,
            check=False,
            cwd="/",
            timeout=60,
        )
        if probe.returncode == 0:
            return candidate
    raise RuntimeError(f"no Python that {user} can run: {candidates}")
