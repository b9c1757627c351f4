"""`bench.harness.processes`: the hostile matrix tells the worker's own scripts from a
job's processes by their command lines (real processes)."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from contextlib import contextmanager

from bench.harness.processes import is_worker_script, read_proc

from ...conftest import wait_for


@contextmanager
def running(*argv: str) -> Iterator[int]:
    """A process of `argv`, once it runs it (its command line is `argv`)."""
    process = subprocess.Popen(argv)
    try:
        wait_for(lambda: read_proc(f"/proc/{process.pid}/cmdline").split(b"\0")[:-1]
                 == [a.encode() for a in argv])  # fmt: skip
        yield process.pid
    finally:
        process.kill()
        process.wait()


def test_the_worker_s_scripts_are_told_from_a_job_s_look_alikes() -> None:
    """`sh -c SCRIPT rw ARG...`, also behind the `sudo ... env -i ...` that runs it as
    a target's jobs' user (the same words, later in the command line: a shell whose
    own command line holds them stands in for that moment before `sudo` execs); a
    job's `sh -c SCRIPT rw-hidden DIR` is not one."""
    with running("/bin/sh", "-c", "sleep 30", "rw", "/runs/r1") as worker:
        assert is_worker_script(worker)
    behind = ("-n", "-u", "job", "--", "env", "-i", "A=B", "/bin/sh", "-c", "S", "rw", "/runs/r1")
    with running("/bin/sh", "-c", "sleep 30", "sudo", *behind) as sudo:
        assert is_worker_script(sudo)
    with running("/bin/sh", "-c", "sleep 30", "rw-hidden", "/runs/r1") as hidden:
        assert not is_worker_script(hidden)
    with running("/bin/sleep", "30") as other:
        assert not is_worker_script(other)
