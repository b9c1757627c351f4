"""What a retrieval may write into the artifact store: at most a quota per run, at
most a quota for the whole store, and never so much that the store's filesystem has
less free space than a reserve (the embedded Redis keeps its append-only file there:
a full disk would make Redis refuse writes, and every stop stall).

Checked twice: before the download, from the sizes the target reports for what would
come ([`remote_bytes`], skipped when the target cannot say), and during it, as each
chunk arrives ([`Budget.charge`], the executors' `charge`), before it is written. A
retrieval that would pass a limit stops with [`ArtifactQuotaExceeded`] (not
retryable: a person frees space or raises a limit, then `runwarden retrieve RUN`);
the caller removes its partial copy, and the copy on the target is never touched.

The whole store's size is what its regular files hold when the retrieval starts
(other retrievals' partial copies included); retrievals running at the same time
each count only their own bytes on top, so together they may pass the total quota
by what they write concurrently. The reserve is read from the filesystem at every
chunk, so it holds whatever runs beside.
"""

from __future__ import annotations

import logging
import os
import stat
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from schemas import Settings
from schemas.text import format_bytes

from ..errors import ArtifactQuotaExceeded
from ..executors import ExecError, Executor

__all__ = ["ArtifactLimits", "Budget", "free_bytes", "open_budget", "remote_bytes", "stored_bytes"]

log = logging.getLogger("runwarden")


@dataclass(frozen=True)
class ArtifactLimits:
    """The limits of the artifact store, in bytes."""

    run_bytes: int
    """Most bytes one run's retrieval writes."""
    total_bytes: int
    """Most bytes the store holds, every run together."""
    reserve_bytes: int
    """Free space always left on the store's filesystem."""

    @classmethod
    def of(cls, settings: Settings) -> ArtifactLimits:
        return cls(
            run_bytes=settings.artifact_quota_run_bytes,
            total_bytes=settings.artifact_quota_total_bytes,
            reserve_bytes=settings.artifact_reserve_bytes,
        )


def free_bytes(path: Path) -> int:
    """Bytes an unprivileged writer may still use on the filesystem of `path`."""
    info = os.statvfs(path)
    return info.f_bavail * info.f_frsize


def stored_bytes(root: Path) -> int:
    """The bytes of every regular file under `root` (links not followed), from the
    directory entries alone; a file or directory that vanishes meanwhile (another
    retrieval renamed or removed it) counts as gone. 0 when `root` does not exist."""
    total = 0
    for dirpath, _dirs, names in os.walk(root):
        for name in names:
            try:
                info = os.lstat(os.path.join(dirpath, name))
            except FileNotFoundError:
                continue
            if stat.S_ISREG(info.st_mode):
                total += info.st_size
    return total


def remote_bytes(
    executor: Executor, remote_dir: str, entries: Sequence[str], exclude: Sequence[str]
) -> int | None:
    """The bytes a download of `entries` (without `exclude`) of `remote_dir` would
    bring, as the target counts them (`Executor.sizes`, read-only, bounded by the
    transport's deadline); None when it cannot say (no GNU find, the probe
    failed: logged), and the check during the download alone applies."""
    try:
        return executor.sizes(remote_dir, entries, exclude)
    except ExecError as error:
        log.info("cannot size the retrieval of %s before it starts: %s", remote_dir, error)
        return None


class Budget:
    """What one retrieval may still write into the store whose root is `root`,
    holding `stored` bytes when it started. [`charge`] is its executors' `charge`:
    called from the download's thread, not thread safe."""

    def __init__(self, limits: ArtifactLimits, root: Path, run_id: str, stored: int) -> None:
        self.limits = limits
        self.root = root
        self.run_id = run_id
        self.stored = stored
        self.written = 0
        """Bytes charged so far."""

    def _refuse(self, what: str, when: str) -> ArtifactQuotaExceeded:
        return ArtifactQuotaExceeded(
            f"retrieval of run {self.run_id} stopped {when}: {what}; nothing of it is kept "
            f"here, the copy on the target is: act, then `runwarden retrieve {self.run_id}`"
        )

    def check(self, more: int, when: str) -> None:
        """Raises [`ArtifactQuotaExceeded`] when writing `more` bytes now would pass
        a limit; `when` says when, for the message."""
        limits = self.limits
        need = self.written + more
        if need > limits.run_bytes:
            raise self._refuse(
                f"it needs {format_bytes(need)}, above the per-run quota of "
                f"{format_bytes(limits.run_bytes)} (RUNWARDEN_ARTIFACT_QUOTA_RUN_BYTES)",
                when,
            )
        if self.stored + need > limits.total_bytes:
            raise self._refuse(
                f"the artifact store would hold {format_bytes(self.stored + need)}, above "
                f"its quota of {format_bytes(limits.total_bytes)} "
                "(RUNWARDEN_ARTIFACT_QUOTA_TOTAL_BYTES)",
                when,
            )
        free = free_bytes(self.root)
        if free - more < limits.reserve_bytes:
            raise self._refuse(
                f"{format_bytes(free)} free on the artifact store's filesystem, "
                f"{format_bytes(more)} more would leave less than its reserve of "
                f"{format_bytes(limits.reserve_bytes)} (RUNWARDEN_ARTIFACT_RESERVE_BYTES)",
                when,
            )

    def charge(self, size: int) -> None:
        """Counts `size` bytes about to be written, after [`check`]ing them."""
        self.check(size, f"after {format_bytes(self.written)} written")
        self.written += size


def open_budget(
    limits: ArtifactLimits,
    root: Path,
    run_id: str,
    expected: int | None,
) -> Budget:
    """The budget of a retrieval into the store at `root` (which exists), checked
    once before anything is written: with `expected` (the target's sizes, see
    [`remote_bytes`]) against every limit, else against the reserve alone.

    Raises:
        ArtifactQuotaExceeded: a limit would be passed.
        OSError: the store cannot be read.
    """
    budget = Budget(limits, root, run_id, stored_bytes(root))
    if expected is None:
        budget.check(0, "before it started")
    else:
        budget.check(expected, f"before it started ({format_bytes(expected)} to come)")
    return budget
