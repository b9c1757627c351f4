"""Processes on this machine, for the tests that count a job's processes: every
process of a job carries `RUNWARDEN_RUN_ID=<run id>` in its environment
(`/proc/<pid>/environ`).

Only this test process's descendants count: under pytest-xdist, another worker may
run a job of the same run id (ids are a second's time stamp and a name) at the same
time. Nothing of a job escapes that tree: every test process is a child subreaper
(tests/conftest.py), so an orphan is re-parented to it or to a reaper below it."""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Iterable
from datetime import UTC, datetime
from pathlib import Path

from schemas import RunRecord, RunState
from store import RunStore
from workers.executors.liveness import group_is_the_jobs

__all__ = [
    "assert_one_followed_job",
    "children",
    "command_lines",
    "descends_from_this_process",
    "hidden_processes",
    "is_worker_script",
    "job_processes",
    "job_processes_of",
    "kill_job_groups",
    "kill_processes_in",
    "kill_session",
    "processes_carrying",
    "processes_carrying_any",
    "read_proc",
    "trainers",
]


def read_proc(path: str) -> bytes:
    """The content of the `/proc` file `path`; empty when it cannot be read (the
    process is gone, or a zombie)."""
    try:
        with open(path, "rb") as file:
            return file.read()
    except OSError:
        return b""


def _pids() -> list[int]:
    return [int(entry) for entry in os.listdir("/proc") if entry.isdigit()]


def _ppid(pid: int) -> int:
    stat = read_proc(f"/proc/{pid}/stat")
    return int(stat.rsplit(b")", 1)[1].split()[1]) if stat else -1


def descends_from_this_process(pid: int) -> bool:
    """Whether `pid` is a descendant of this (test) process; False when it is gone."""
    me = os.getpid()
    for _ in range(256):  # deeper than any process tree a test builds
        pid = _ppid(pid)
        if pid == me:
            return True
        if pid <= 1:
            return False
    return False


def children(pid: int) -> list[int]:
    """The processes whose parent is `pid`."""
    return [p for p in _pids() if _ppid(p) == pid]


def job_processes(run_id: str) -> list[int]:
    """Live processes whose environment holds `RUNWARDEN_RUN_ID=<run_id>` (a zombie's
    environment reads empty)."""
    return processes_carrying(f"RUNWARDEN_RUN_ID={run_id}")


def job_processes_of(run_ids: Iterable[str]) -> dict[str, list[int]]:
    """`job_processes` of each run of `run_ids`, from one pass over `/proc` (a
    campaign's check of a hundred runs reads each process's environment once, not
    once per run)."""
    ids = list(run_ids)
    found = processes_carrying_any(f"RUNWARDEN_RUN_ID={run_id}" for run_id in ids)
    return {run_id: found[f"RUNWARDEN_RUN_ID={run_id}"] for run_id in ids}


def hidden_processes(path: str) -> list[int]:
    """Live processes (not zombies) with an argument that is `path` or below it: a
    hostile job's process that cleared its environment (no mark to find it by) and
    put its run directory among its arguments (bench/harness/hostile.py,
    `env-i-daemon`)."""
    exact, below = path.encode(), path.rstrip("/").encode() + b"/"
    found = []
    for p in _pids():
        args = read_proc(f"/proc/{p}/cmdline").split(b"\0")
        if any(a == exact or a.startswith(below) for a in args):
            stat = read_proc(f"/proc/{p}/stat").rsplit(b")", 1)
            if len(stat) == 2 and stat[1].split()[:1] != [b"Z"]:
                found.append(p)
    return found


def is_worker_script(pid: int) -> bool:
    """Whether process `pid` is one of the worker's scripts (`sh -c SCRIPT rw ARG...`,
    `transport.SCRIPT_NAME`), which name a run directory among their arguments too;
    also on its way there as a target's jobs' user (`sudo -n -u USER -- env -i K=V...
    sh -c SCRIPT rw ARG...`: `SshTransport._as`), before `sudo` and `env` exec it."""
    args = read_proc(f"/proc/{pid}/cmdline").split(b"\0")
    return any(
        args[i] == b"-c" and args[i + 2] == b"rw" and args[i - 1].rsplit(b"/", 1)[-1] == b"sh"
        for i in range(1, len(args) - 2)
    )


def command_lines(pids: Iterable[int], width: int = 80) -> list[str]:
    """`pid: command line` of each of `pids` (arguments joined by blanks, cut to
    `width` characters), to say what a leftover process is."""
    lines = []
    for pid in pids:
        args = read_proc(f"/proc/{pid}/cmdline").split(b"\0")
        text = " ".join(a.decode("utf-8", "replace") for a in args if a)
        lines.append(f"{pid}: {text[:width]}")
    return lines


def kill_processes_in(path: Path | str) -> list[int]:
    """SIGKILLs every process with an argument at or below `path`, or working in it
    (its `cwd`): what a test's jobs left there, whoever they run as, and nothing of
    another test's (never a whole user's processes: other tests run as the same
    users at once). Returns their pids."""
    base = str(path).rstrip("/")
    found = set(hidden_processes(base))
    for p in _pids():
        with contextlib.suppress(OSError):
            cwd = os.readlink(f"/proc/{p}/cwd")
            if cwd == base or cwd.startswith(base + "/"):
                found.add(p)
    for p in found:
        with contextlib.suppress(ProcessLookupError):
            os.kill(p, signal.SIGKILL)
    return sorted(found)


def kill_job_groups(runs: Iterable[RunRecord]) -> list[int]:
    """SIGKILLs the process group of each of `runs`' jobs while it is still the job's
    (`group_is_the_jobs`, by its leader's start time), for a teardown. Never a group
    by its pid alone: pids wrap within a suite (`pid_max` is 32768 here), so the pid of
    a job that ended long ago may lead another test's job's group by now. A job
    without a known start time is left (`kill_processes_in` finds it by its
    directory). Returns the groups signalled."""
    killed = []
    for run in runs:
        job = run.job
        if job is None or job.start is None or job.pid <= 1:
            continue
        with contextlib.suppress(OSError):
            if group_is_the_jobs(job.pid, job.start):
                os.killpg(job.pid, signal.SIGKILL)
                killed.append(job.pid)
    return killed


def kill_session(sid: int) -> list[int]:
    """SIGKILLs every process of the session `sid` (field 6 of `/proc/<pid>/stat`),
    found one by one: once its leader is reaped, a `killpg(sid)` may reach whatever
    group took that pid since (pids wrap within a suite). Returns their pids."""
    found = []
    for p in _pids():
        stat = read_proc(f"/proc/{p}/stat").rsplit(b")", 1)
        if len(stat) == 2 and stat[1].split()[3:4] == [str(sid).encode()]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(p, signal.SIGKILL)
                found.append(p)
    return found


def processes_carrying(entry: str) -> list[int]:
    """Live processes started from this one whose environment holds the exact `entry`
    (`NAME=value`; a zombie's environment reads empty)."""
    return processes_carrying_any([entry])[entry]


def processes_carrying_any(entries: Iterable[str]) -> dict[str, list[int]]:
    """`processes_carrying` of each of `entries`, from one pass over `/proc`: each
    process's environment is read once, and the ancestry of those that match is
    walked once."""
    needles = {entry.encode(): entry for entry in entries}
    found: dict[str, list[int]] = {entry: [] for entry in needles.values()}
    for p in _pids():
        hits = needles.keys() & set(read_proc(f"/proc/{p}/environ").split(b"\0"))
        if hits and descends_from_this_process(p):
            for hit in hits:
                found[needles[hit]].append(p)
    return found


def trainers(run_id: str) -> dict[int, int]:
    """The toy trainers of run `run_id` on this machine (Python running
    `toy_trainer.py`, not the shells whose scripts name it): pid -> process group."""
    found = {}
    for pid in job_processes(run_id):
        argv = read_proc(f"/proc/{pid}/cmdline").split(b"\0")
        if os.path.basename(argv[0]).startswith(b"python") and any(
            a.endswith(b"toy_trainer.py") for a in argv
        ):
            with contextlib.suppress(ProcessLookupError):
                found[pid] = os.getpgid(pid)
    return found


def assert_one_followed_job(store: RunStore, run_id: str) -> RunRecord:
    """Run `run_id` runs exactly one job on this machine, the one its record names,
    and it is followed."""
    run = store.runs.get(run_id)
    assert run.state is RunState.RUNNING, run
    assert run.job is not None
    found = trainers(run_id)
    assert list(found.values()) == [run.job.pid], (found, run.job)
    assert run_id in store.follow.runs(run.target)
    assert store.launches.preparing(datetime.now(UTC)) == []
    return run
