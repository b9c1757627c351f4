"""`Executor.doctor` on real targets: every executor (local, shell, ssh against a real
sshd) on this complete machine; targets where things are missing, run with a PATH
holding only the tools asked for (GNU tools without `setsid`, curl, wget and Python;
busybox alone, with and without `timeout`; a `date` 30 s ahead); jobs run as another
user (root hands the run directories over; sudo needs the workdir to be the user's);
an SSH workdir nobody can make."""

from __future__ import annotations

import os
import pwd
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterable, Iterator
from pathlib import Path

import pytest

from bench.harness.sshd import SshServer
from bench.harness.users import (
    JOB_USER,
    WORKER_USER,
    as_user,
    ensure_sudo_rule,
    ensure_user,
    shared_dir,
)
from schemas.doctor import DoctorCheck
from workers.executors import CommandError, LocalTransport, RunAsExecutor, ScriptExecutor
from workers.executors.doctor import DoctorFindings
from workers.executors.scripts.doctor import SCRATCH_PREFIX, UTILITIES

from ....conftest import Target, ssh_executor

GNU_TOOLS = (*UTILITIES, "tar", "sha256sum", "dd", "timeout", "readlink", "mktemp")
HOSTILE = "w $(touch PWNED) 'q' \"d\" `touch PWNED` ;&|<>*"


def by_name(findings: DoctorFindings) -> dict[str, DoctorCheck]:
    return {c.name: c for c in findings.checks}


def not_ok(findings: DoctorFindings) -> dict[str, str]:
    return {c.name: c.status for c in findings.checks if c.status != "ok"}


def which(name: str) -> str:
    found = shutil.which(name)
    assert found is not None, f"{name} is not installed here (make system-deps installs it)"
    return found


def tool_dir(root: Path, tools: dict[str, str]) -> Path:
    """A directory of links named after `tools` to their programs: a PATH holding only
    those."""
    bin_dir = root / "bin"
    bin_dir.mkdir()
    for name, program in tools.items():
        (bin_dir / name).symlink_to(program)
    return bin_dir


def gnu(names: Iterable[str]) -> dict[str, str]:
    """`sh` (dash) and `names`, this machine's; `python3` is this interpreter (the one
    on the PATH may be a shim needing more than these tools)."""
    tools = {"sh": which("dash"), **{name: which(name) for name in names}}
    if "python3" in tools:
        tools["python3"] = os.path.realpath(sys.executable)
    return tools


def busybox(without: Iterable[str] = ()) -> dict[str, str]:
    applets = subprocess.run(["busybox", "--list"], capture_output=True, text=True, check=True)
    skip = set(without)
    return {a: which("busybox") for a in applets.stdout.split() if a not in skip}


def restricted(root: Path, tools: dict[str, str]) -> ScriptExecutor:
    """A target whose scripts run with only `tools` on their PATH, under its `sh`."""
    bin_dir = tool_dir(root, tools)
    workdir = root / "work"
    workdir.mkdir()
    transport = LocalTransport(env={"PATH": str(bin_dir)}, shell=(str(bin_dir / "sh"),))
    return ScriptExecutor(transport, str(workdir))


# --- a complete target, every executor ---------------------------------------------


def test_every_executor_finds_this_machine_complete(target: Target) -> None:
    listing = sorted(target.workdir.rglob("*"))
    started = time.monotonic()
    found = target.executor.doctor()
    elapsed = time.monotonic() - started
    checks = by_name(found)
    assert not_ok(found) == {}, found
    assert sorted(target.workdir.rglob("*")) == listing
    assert checks["workdir"].found == "exists, writable by the job's user"
    if target.kind == "local":
        assert "not used" in checks["tar"].found
        assert "not used" in checks["mv-t"].found
    else:
        assert checks["tar"].found.startswith("GNU tar")
        assert checks["mv-t"].found == "mv -fT works"
    assert found.clock is not None
    assert found.clock.worst_s < 0.5  # this machine's clock, read through sh or sshd
    assert found.clock.uncertainty_s < 0.25
    assert elapsed < 30, f"the doctor took {elapsed:.1f} s"


def test_a_hostile_workdir_over_ssh(sshd: SshServer, tmp_path: Path) -> None:
    workdir = tmp_path / HOSTILE
    workdir.mkdir()
    with ssh_executor(sshd, workdir) as executor:
        found = executor.doctor()
    assert not_ok(found) == {}
    assert list(workdir.iterdir()) == []
    assert not list(tmp_path.rglob("PWNED"))


def test_an_ssh_workdir_nobody_can_make(sshd: SshServer) -> None:
    with ssh_executor(sshd, "/proc/runwarden-doctor/work") as executor:
        found = executor.doctor()
    assert not_ok(found) == {"workdir": "missing"}
    assert "cannot make it in /proc" in by_name(found)["workdir"].found
    assert not Path("/proc/runwarden-doctor").exists()


# --- targets where things are missing ----------------------------------------------


def test_gnu_tools_without_setsid_curl_wget_nor_python(tmp_path: Path) -> None:
    found = restricted(tmp_path, gnu(GNU_TOOLS)).doctor()
    checks = by_name(found)
    assert not_ok(found) == {"setsid": "missing", "http-client": "warn", "python": "warn"}
    assert "launch" in checks["setsid"].breaks
    assert checks["http-client"].found == "neither curl nor wget"
    assert "cannot run: a cloud's preemption notice is not seen" in checks["http-client"].breaks
    assert checks["python"].found == "no python3 on the job's PATH"


def test_gnu_tools_with_every_piece(tmp_path: Path) -> None:
    tools = gnu([*GNU_TOOLS, "setsid", "curl", "python3"])
    found = restricted(tmp_path, tools).doctor()
    assert not_ok(found) == {}
    checks = by_name(found)
    assert checks["http-client"].found.startswith("curl")
    # Each works with these tools alone (no `true`, `printf` or `echo` programs here).
    assert checks["timeout"].found == str(tmp_path / "bin" / "timeout")
    assert checks["utilities"].found == "all there"
    assert checks["python"].found.startswith("Python 3.")


def test_a_busybox_only_target(tmp_path: Path) -> None:
    found = restricted(tmp_path, busybox()).doctor()
    checks = by_name(found)
    assert not_ok(found) == {
        "tar": "missing",
        "sha256sum": "warn",
        "dd": "warn",
        "http-client": "warn",
        "python": "warn",
    }
    assert checks["sh"].found.startswith("busybox ash")
    assert checks["tar"].found.startswith("busybox tar")
    assert "artifact retrievals" in checks["tar"].breaks
    assert "uploads" not in checks["tar"].breaks  # busybox unpacks an upload fine
    assert "AWS" in checks["http-client"].breaks
    assert checks["timeout"].status == "ok"
    assert checks["mv-t"].found == "mv -fT works"
    # busybox's date has no %N: whole seconds, half a second either way at least.
    assert found.clock is not None
    assert found.clock.uncertainty_s >= 0.5
    assert checks["clock"].status == "ok"


def test_busybox_without_timeout(tmp_path: Path) -> None:
    found = restricted(tmp_path, busybox(without=["timeout"])).doctor()
    checks = by_name(found)
    assert not_ok(found) == {
        "tar": "missing",
        "sha256sum": "warn",
        "dd": "warn",
        "timeout": "warn",
        "http-client": "warn",
        "python": "warn",
    }
    assert "blocks the read" in checks["dd"].breaks
    assert "without timeout" in checks["http-client"].found


def test_busybox_without_setsid_nor_find(tmp_path: Path) -> None:
    found = restricted(tmp_path, busybox(without=["setsid", "find", "xargs"])).doctor()
    checks = by_name(found)
    assert checks["setsid"].status == "missing"
    assert checks["utilities"].status == "missing"
    assert checks["utilities"].found == "absent: find xargs; not working: find-print0 xargs-0"


def test_a_target_clock_30_s_ahead(tmp_path: Path) -> None:
    real = which("date")
    tools = gnu([*GNU_TOOLS, "setsid", "curl", "python3"])
    del tools["date"]
    bin_dir = tool_dir(tmp_path, tools)
    (bin_dir / "date").write_text(
        "#!/bin/sh\n"
        f'if [ "$1" = +%s%N ]; then n=$({real} +%s%N); echo $((n + 30000000000)); '
        f'else exec {real} "$@"; fi\n'
    )
    (bin_dir / "date").chmod(0o755)
    workdir = tmp_path / "work"
    workdir.mkdir()
    transport = LocalTransport(env={"PATH": str(bin_dir)}, shell=(str(bin_dir / "sh"),))
    found = ScriptExecutor(transport, str(workdir)).doctor()
    assert not_ok(found) == {"clock": "warn"}
    assert found.clock is not None
    assert found.clock.skew_s == pytest.approx(30, abs=0.3)
    said = by_name(found)["clock"].found
    # The skew as measured (29.997 s on a loaded machine), said with its uncertainty.
    assert re.match(r"(29\.[7-9]|30\.[0-3])\d* s ± [0-9.]+ s ahead of the worker", said), said


# --- jobs run as another user ------------------------------------------------------


@pytest.fixture(scope="module")
def job_entry() -> pwd.struct_passwd:
    ensure_user(WORKER_USER)
    ensure_sudo_rule()
    return ensure_user(JOB_USER)


@pytest.fixture
def base() -> Iterator[Path]:
    with shared_dir("rw-doctor-") as path:
        yield path


def sudo_executor(workdir: Path) -> RunAsExecutor:
    return RunAsExecutor(
        workdir, JOB_USER, worker_is_root=False, sudo=[*as_user(WORKER_USER), "sudo"]
    )


def test_root_makes_the_run_directories_of_a_user(
    base: Path, job_entry: pwd.struct_passwd
) -> None:
    with RunAsExecutor(base / "work", JOB_USER) as executor:
        found = executor.doctor()
    checks = by_name(found)
    assert not_ok(found) == {}
    assert "the worker (root) makes each run directory" in checks["workdir"].found
    # The job's PATH (/usr/local/bin:/usr/bin:/bin), not this worker's.
    assert checks["python"].found.endswith("(/usr/bin/python3)")
    assert list((base / "work").iterdir()) == []


def test_under_sudo_the_workdir_must_be_the_users(
    base: Path, job_entry: pwd.struct_passwd
) -> None:
    theirs = base / "theirs"
    theirs.mkdir()
    os.chown(theirs, job_entry.pw_uid, job_entry.pw_gid)
    roots = base / "roots"
    roots.mkdir()
    with sudo_executor(theirs) as executor:
        assert not_ok(executor.doctor()) == {}
    with sudo_executor(roots) as executor:
        found = executor.doctor()
    assert not_ok(found) == {"workdir": "missing"}
    assert by_name(found)["workdir"].found == "exists, not writable by the job's user"
    with sudo_executor(roots / "a" / "b") as executor:
        found = executor.doctor()
    assert not_ok(found) == {"workdir": "missing"}
    assert by_name(found)["workdir"].found.endswith(f"cannot make it in {roots}")
    assert list(theirs.iterdir()) == list(roots.iterdir()) == []
    temp = Path(os.environ.get("TMPDIR", "/tmp"))
    assert list(temp.glob(f"{SCRATCH_PREFIX}*")) == []


def test_without_a_sudo_rule_the_doctor_names_the_line(
    base: Path, job_entry: pwd.struct_passwd
) -> None:
    # WORKER_USER may run commands as JOB_USER only: not as `nobody`.
    executor = RunAsExecutor(
        base / "work", "nobody", worker_is_root=False, sudo=[*as_user(WORKER_USER), "sudo"]
    )
    with pytest.raises(CommandError) as refused:
        executor.doctor()
    assert "ALL=(nobody) NOPASSWD: ALL" in str(refused.value)
    assert not (base / "work").exists()
