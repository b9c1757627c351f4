"""Containment: a cgroup v2 directory per run, wherever the worker can make one, so
every process of the job is held whatever session or environment it makes itself
(a `setsid env -i` daemon included), and a cancel or the run's end ends them all
(`sh/cgroup.sh`: SIGTERM to each, `cgroup.kill` after the grace).

Made for a local target, under a base ([`cgroup_base`]) as `<base>/runwarden/<run
mark>`:

- a worker that is root: the base is the machine's cgroup v2 hierarchy (`/sys/fs/cgroup`,
  or `/sys/fs/cgroup/unified` on a hybrid host), its jobs run as the worker's user or
  as another (`run_as`: the worker makes the cgroup and enters it before the change
  of user, `executors.runas`, so the job's user can take no process out);
- a worker that is not root: the base is its own cgroup when that is delegated to its
  user (systemd's `Delegate=yes`, `systemd-run --user --scope`, or a cgroup the
  operator made and gave the user: the directory and its `cgroup.procs` writable by
  it), for jobs run as the worker's own user (the launcher makes the run's cgroup
  and moves itself in: the kernel allows it, the cgroups' common ancestor, the
  base, being the user's). Such a job may move itself back out (as the worker's
  user, it may write to the base's `cgroup.procs`): contained against what a job
  leaves behind, not against a job that means to leave; `doctor` says so.

A target over SSH whose login user may make cgroups there (root, or a delegated
cgroup: `SshExecutor.cgroup_base` asks it once) gets `<base>/runwarden/<run mark>`
made by its launcher, as that user, the same way; for one whose jobs run as another
user the login makes the cgroup, gives the user its `cgroup.procs` and `cgroup.kill`
and enters it before the change of user (`sh/ssh_cgroup_enter.sh`): a root login by
`chown`, a login that is not root, with a delegated cgroup, by `chgrp` to the user's
primary group, of which it must be a member, and that group's write bit (it cannot
`chown`). The user may then end its run's cgroup but move no process out: the
common ancestor's `cgroup.procs` the kernel asks for is the login's or root's.

Elsewhere (a target over SSH with a login that may not; a worker that is not root
without a delegated cgroup or with jobs of another user; no cgroup v2) a run is not
contained: its process group and its mark are all a cancel has, and `show` and
`doctor` say so.
"""

from __future__ import annotations

import contextlib
import functools
import os
import time
from pathlib import Path
from typing import Final, Protocol, runtime_checkable

from schemas import RunRecord, Settings, TargetConfig
from schemas.protocol import CGROUP_PARENT

__all__ = [
    "CGROUP_PARENT",
    "EMPTY_AGE_S",
    "RemoteBase",
    "cgroup_base",
    "containment",
    "delegated",
    "hierarchy",
    "hierarchy_mount",
    "own_cgroup",
    "remove_empty",
    "run_cgroup",
]

EMPTY_AGE_S: Final = 60.0
"""How old an empty run cgroup must be before `remove_empty` takes it, in seconds: a
launcher enters its cgroup within milliseconds of making it, so one empty for this
long is a run's that ended (another service's on this machine too), never one a
launch is about to use."""


@functools.cache
def hierarchy_mount() -> Path | None:
    """The mount point of this machine's cgroup v2 hierarchy when it is mounted
    read-write, else None. Read once per process."""
    try:
        lines = Path("/proc/self/mounts").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        fields = line.split()
        if len(fields) >= 4 and fields[2] == "cgroup2" and "rw" in fields[3].split(","):
            # A mount point with a space or a tab is written escaped (\040): none here.
            return Path(fields[1])
    return None


def hierarchy() -> Path | None:
    """The mount point of this machine's cgroup v2 hierarchy when this process may
    make cgroups in it (root, mounted read-write), else None."""
    point = hierarchy_mount()
    if point is not None and os.geteuid() == 0 and os.access(point / "cgroup.procs", os.W_OK):
        return point
    return None


def own_cgroup(mount: Path, proc_cgroup: str) -> Path | None:
    """The directory of a process's cgroup v2 under `mount`, from its `/proc/<pid>/cgroup`
    text (the `0::<path>` line), None when it has none or the path is not plain."""
    for line in proc_cgroup.splitlines():
        if line.startswith("0::/"):
            path = line[3:]
            parts = path.split("/")[1:]
            if "." in parts or ".." in parts:
                return None
            return mount.joinpath(*[p for p in parts if p])
    return None


@functools.cache
def delegated() -> Path | None:
    """This process's own cgroup when its user may make cgroups in it and move its
    processes into them (the directory and its `cgroup.procs` writable), for a worker
    that is not root; else None. Read once per process."""
    mount = hierarchy_mount()
    if mount is None or os.geteuid() == 0:
        return None
    try:
        own = own_cgroup(mount, Path("/proc/self/cgroup").read_text())
    except OSError:
        return None
    if own is None or own == mount:
        return None
    if os.access(own, os.W_OK | os.X_OK) and os.access(own / "cgroup.procs", os.W_OK):
        return own
    return None


def cgroup_base() -> Path | None:
    """Where run cgroups are made (`<base>/runwarden/<mark>`): the hierarchy for a root
    worker, its delegated cgroup for one that is not root ([`delegated`]), else None."""
    return hierarchy() if os.geteuid() == 0 else delegated()


@runtime_checkable
class RemoteBase(Protocol):
    """An executor of a target over SSH, which asks the target where its runs' cgroups
    go (`SshExecutor.cgroup_base`)."""

    def cgroup_base(self) -> tuple[str | None, str]: ...


def _remote(executor: object | None) -> tuple[str | None, str]:
    if isinstance(executor, RemoteBase):
        return executor.cgroup_base()
    return None, "a target over SSH gets no cgroup without its executor"


def containment(
    target: TargetConfig, settings: Settings, executor: object | None = None
) -> str | None:
    """Why runs on `target` are not contained, for people; None when they are (each
    gets a cgroup of its own). A target over SSH is asked through its `executor`
    (a root login, or one whose cgroup is delegated to it: `SshExecutor.cgroup_base`)."""
    if target.slurm is not None:
        return "Slurm runs the jobs: their containment is its own (its ProctrackType)"
    if not settings.cgroups:
        return "cgroups are turned off (RUNWARDEN_CGROUPS=0)"
    if target.kind != "local":
        base, why = _remote(executor)
        return None if base is not None else why
    if os.geteuid() != 0:
        if target.run_as is not None:
            return "the worker is not root: it cannot put the jobs of another user in a cgroup"
        if delegated() is None:
            return (
                "the worker is not root and its own cgroup is not delegated to its user "
                "(start it in one: systemd's Delegate=yes, `systemd-run --user --scope`, "
                "or a cgroup the operator gives its user; docs/security.md)"
            )
        return None
    if hierarchy() is None:
        return "no writable cgroup v2 hierarchy on this machine"
    return None


def run_cgroup(
    target: TargetConfig, run: RunRecord, settings: Settings, executor: object | None = None
) -> str | None:
    """The cgroup directory (not made yet) the job of `run` starts in, or None when
    its target's runs are not contained ([`containment`]) or the run has no mark."""
    if run.mark is None or containment(target, settings, executor) is not None:
        return None
    if target.kind != "local":
        base = _remote(executor)[0]
        return None if base is None else f"{base.rstrip('/')}/{CGROUP_PARENT}/{run.mark}"
    root = cgroup_base()
    return None if root is None else str(root / CGROUP_PARENT / run.mark)


def remove_empty() -> int:
    """Removes the run cgroups of this machine that are empty and older than
    [`EMPTY_AGE_S`] (what a run's end could not remove: its cancel cut short, its
    worker gone meanwhile); never one that holds a process. Returns how many. Nothing
    where this worker makes no cgroups."""
    root = cgroup_base()
    if root is None:
        return 0
    removed = 0
    now_s = time.time()
    with contextlib.suppress(OSError):
        for entry in os.scandir(root / CGROUP_PARENT):
            try:
                if not entry.is_dir(follow_symlinks=False):
                    continue
                if now_s - entry.stat(follow_symlinks=False).st_mtime < EMPTY_AGE_S:
                    continue
                events = Path(entry.path, "cgroup.events").read_text()
                if "populated 0" in events.splitlines():
                    os.rmdir(entry.path)  # the kernel refuses it if a process came in
                    removed += 1
            except OSError:
                continue
    return removed
