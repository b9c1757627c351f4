"""Containment: a cgroup v2 directory per run, wherever the worker can make one, so
every process of the job is held whatever session or environment it makes itself
(a `setsid env -i` daemon included), and a cancel or the run's end ends them all
(`sh/cgroup.sh`: SIGTERM to each, `cgroup.kill` after the grace).

Made for a local target, its jobs run as the worker's user or as another
(`run_as`: the worker makes the cgroup and enters it before the change of user,
`executors.runas`), with the worker root and a writable cgroup v2 hierarchy
(`/sys/fs/cgroup`, or `/sys/fs/cgroup/unified` on a hybrid host):
`<hierarchy>/runwarden/<run mark>`. Elsewhere (a target over SSH, a worker that is
not root, no cgroup v2) a run is not contained: its process group and its mark are
all a cancel has, and `show` and `doctor` say so.
"""

from __future__ import annotations

import contextlib
import functools
import os
import time
from pathlib import Path
from typing import Final

from schemas import RunRecord, Settings, TargetConfig
from schemas.protocol import CGROUP_PARENT

__all__ = ["CGROUP_PARENT", "EMPTY_AGE_S", "containment", "hierarchy", "remove_empty", "run_cgroup"]

EMPTY_AGE_S: Final = 60.0
"""How old an empty run cgroup must be before `remove_empty` takes it, in seconds: a
launcher enters its cgroup within milliseconds of making it, so one empty for this
long is a run's that ended (another service's on this machine too), never one a
launch is about to use."""


@functools.cache
def hierarchy() -> Path | None:
    """The mount point of this machine's cgroup v2 hierarchy when this process may
    make cgroups in it (root, mounted read-write), else None. Read once per process."""
    try:
        lines = Path("/proc/self/mounts").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        fields = line.split()
        if len(fields) >= 4 and fields[2] == "cgroup2" and "rw" in fields[3].split(","):
            # A mount point with a space or a tab is written escaped (\040): none here.
            point = Path(fields[1])
            if os.geteuid() == 0 and os.access(point / "cgroup.procs", os.W_OK):
                return point
    return None


def containment(target: TargetConfig, settings: Settings) -> str | None:
    """Why runs on `target` are not contained, for people; None when they are (each
    gets a cgroup of its own)."""
    if not settings.cgroups:
        return "cgroups are turned off (RUNWARDEN_CGROUPS=0)"
    if target.kind != "local":
        return "a target over SSH gets no cgroup from runwarden yet"
    if os.geteuid() != 0:
        return "the worker is not root: it cannot make cgroups"
    if hierarchy() is None:
        return "no writable cgroup v2 hierarchy on this machine"
    return None


def run_cgroup(target: TargetConfig, run: RunRecord, settings: Settings) -> str | None:
    """The cgroup directory (not made yet) the job of `run` starts in, or None when
    its target's runs are not contained ([`containment`]) or the run has no mark."""
    root = hierarchy()
    if root is None or run.mark is None or containment(target, settings) is not None:
        return None
    return str(root / CGROUP_PARENT / run.mark)


def remove_empty() -> int:
    """Removes the run cgroups of this machine that are empty and older than
    [`EMPTY_AGE_S`] (what a run's end could not remove: its cancel cut short, its
    worker gone meanwhile); never one that holds a process. Returns how many. Nothing
    where this worker makes no cgroups."""
    root = hierarchy()
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
