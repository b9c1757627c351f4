"""`workers.executors.scripts.doctor`: the doctor's probe run by dash and `busybox sh`
on real directories with hostile names: what it finds, that it leaves nothing behind
(nor anything a name could make it run), and that an interrupted probe still removes
its scratch directory."""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import time
from pathlib import Path

import pytest

from workers.executors import LocalTransport
from workers.executors.scripts.doctor import SCRATCH_PREFIX, doctor_script, parse_doctor

SHELLS = {"dash": ("sh",), "busybox": ("busybox", "sh")}
HOSTILE = "w $(touch PWNED) 'q' \"d\" `touch PWNED` ;&|<>*?\n\tend"


def probe(shell: tuple[str, ...], workdir: Path, *, writes: bool = True) -> dict[str, str]:
    token = secrets.token_hex(16)
    script = doctor_script(
        str(workdir), token, job_writes_workdir=writes, random=secrets.token_hex(6)
    )
    result = LocalTransport(shell=shell).run(script.text, action="doctor", args=script.args)
    assert result.exit_code == 0, result.stderr
    return parse_doctor(result.stdout, token)


def tree(root: Path) -> list[tuple[str, int]]:
    return sorted((str(p), p.lstat().st_mode) for p in root.rglob("*"))


def scratches() -> list[Path]:
    tmp = Path(os.environ.get("TMPDIR", "/tmp"))
    return sorted(tmp.glob(f"{SCRATCH_PREFIX}*"))


@pytest.mark.parametrize("shell", SHELLS.values(), ids=SHELLS.keys())
def test_the_probe_finds_and_leaves_nothing_behind(tmp_path: Path, shell: tuple[str, ...]) -> None:
    workdir = tmp_path / HOSTILE
    (workdir / "run-1").mkdir(parents=True)
    (workdir / "run-1" / "job.log").write_text("hello\n")
    before, temp_before = tree(tmp_path), scratches()
    found = probe(shell, workdir)
    assert tree(tmp_path) == before
    assert scratches() == temp_before
    assert not list(tmp_path.rglob("PWNED"))
    assert not Path("PWNED").exists()
    assert Path(found["sh_exe"]).name == ("busybox" if "busybox" in shell else "dash")
    expected = {"sh_posix": "yes", "workdir": "yes", "writable": "yes", "scratch": "yes",
                "mv_t": "yes", "tar_create": "yes", "tar_extract": "yes", "proc_stat": "yes",
                "proc_environ": "yes", "dd_nonblock": "yes"}  # fmt: skip
    assert {k: found.get(k) for k in expected} == expected
    stat = os.statvfs(workdir)
    blocks = found["df"].split()
    assert int(blocks[1]) * 1024 == stat.f_blocks * stat.f_frsize


@pytest.mark.parametrize("shell", SHELLS.values(), ids=SHELLS.keys())
def test_a_workdir_not_there_yet_is_tried_in_its_parent(
    tmp_path: Path, shell: tuple[str, ...]
) -> None:
    workdir = tmp_path / HOSTILE / "a" / "b"
    before = tree(tmp_path)
    found = probe(shell, workdir)
    assert (found["workdir"], found["workdir_parent"], found["writable"]) == (
        "no", str(tmp_path), "yes"
    )  # fmt: skip
    assert tree(tmp_path) == before
    assert not workdir.exists()


def test_a_workdir_the_worker_makes_is_not_written(tmp_path: Path) -> None:
    before, temp_before = tree(tmp_path), scratches()
    found = probe(("sh",), tmp_path, writes=False)
    assert "writable" not in found
    assert found["mv_t"] == "yes"  # tried in a mktemp -d directory, removed
    assert tree(tmp_path) == before
    assert scratches() == temp_before


def test_an_interrupted_probe_removes_its_scratch(tmp_path: Path) -> None:
    """`df` hangs (an NFS mount gone away): the probe is sent SIGTERM while its scratch
    directory exists, and removes it."""
    shims = tmp_path / "shims"
    shims.mkdir()
    started = tmp_path / "df-started"
    (shims / "df").write_text(f"#!/bin/sh\n: > {started}\nexec sleep 600\n")
    (shims / "df").chmod(0o755)
    workdir = tmp_path / "work"
    workdir.mkdir()
    token = secrets.token_hex(16)
    script = doctor_script(str(workdir), token, job_writes_workdir=True, random="0123456789ab")
    env = {**os.environ, "PATH": f"{shims}:{os.environ['PATH']}"}
    proc = subprocess.Popen(["sh", "-c", script.text, "rw", *script.args], env=env,
                            start_new_session=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while not started.exists():
            assert time.monotonic() < deadline, "df was never reached"
            time.sleep(0.02)
        assert [p.name for p in workdir.iterdir()] == [f"{SCRATCH_PREFIX}{proc.pid}.0123456789ab"]
        os.killpg(proc.pid, signal.SIGTERM)
        proc.communicate(timeout=30)
    finally:
        if proc.returncode is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    assert proc.returncode != 0
    assert list(workdir.iterdir()) == []
