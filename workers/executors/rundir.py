"""A run directory on this machine read by the worker itself, as the follow and status
scripts read theirs (`sh/follow.sh`, `sh/status_fn.sh`): the control plane's own
reading, for a worker that can read what its job's user writes (root, for a run-as
target) and must not let a process of that user pause, kill or write into the reader.

Guarantees, beyond the scripts':

- Every file is opened from a descriptor of the run directory, one component at a
  time, without following a link (`O_NOFOLLOW`) nor waiting for a FIFO's writer
  (`O_NONBLOCK`), and read only when the descriptor is a regular file the job's user
  may read by its mode (a [`Reader`]), as the scripts run as that user read: a link,
  a FIFO, a device, or a hard link to a file of root's the user may not read is not
  there. Reads are bounded in bytes by the same limits as the scripts', and a
  regular file never blocks.
- A run's failure (its directory unreadable, an I/O error) stays that run's: its
  update carries a [`ProtocolError`] status, the others theirs.
- The answer for each run is what `scripts.parse_follow` gives for the script's
  output on the same files: the same records, limits and signature format.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import stat
from collections.abc import Iterator, Sequence
from typing import Final, NamedTuple

from schemas import JobId, JobStatus
from schemas.protocol import END_LIMIT, PROOF_LIMIT

from .errors import InvalidArgument, ProtocolError
from .liveness import group_exists, group_is_the_jobs
from .scripts.common import check_job_pid
from .scripts.follow import (
    FOLLOW_CHUNK_BYTES,
    NOTICE_READ_BYTES,
    NOTICE_STATE_READ_BYTES,
    FollowEntry,
    FollowUpdate,
)
from .scripts.status import parse_status

__all__ = ["Reader", "follow_here", "status_here"]

_DIR_FLAGS: Final = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_READ_FLAGS: Final = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_EXIT_CODE: Final = re.compile(rb"-?[0-9]+")
_EXIT_CODE_CHARS: Final = 11
"""The longest `exit_code` the status script takes, its sign included."""
_ABSENT: Final = frozenset({errno.ENOENT, errno.ELOOP, errno.ENOTDIR, errno.ENXIO})
"""Errors of an open that say the file is not there as a regular file: gone, a
link, a directory's place taken by a file, a FIFO without a writer (`O_NONBLOCK`)."""
_REQUEST_BYTES: Final = 64
_REASON_BYTES: Final = 32


class Reader(NamedTuple):
    """The user files are read for: its uid and every group it is in."""

    uid: int
    gids: frozenset[int]

    def may_read(self, info: os.stat_result) -> bool:
        """Whether the user may read a file of status `info` by its mode bits (the
        owner's, else the group's, else the others', as the kernel decides; root
        may read anything)."""
        if self.uid == 0:
            return True
        if info.st_uid == self.uid:
            return bool(info.st_mode & stat.S_IRUSR)
        if info.st_gid in self.gids:
            return bool(info.st_mode & stat.S_IRGRP)
        return bool(info.st_mode & stat.S_IROTH)


class _Run:
    """One run directory, open: reads relative to its descriptor, for `reader` (None:
    as this process may)."""

    def __init__(self, fd: int, reader: Reader | None) -> None:
        self.fd = fd
        self.reader = reader

    @contextlib.contextmanager
    def open(self, name: str) -> Iterator[tuple[int, os.stat_result] | None]:
        """The regular file `name` (`a/b`: each component opened without following a
        link) the reader may read, open, with its status; None when it is not one.

        Raises:
            OSError: an error other than the file, or one of its directories, not
                being there or not being what it should (a link, a FIFO's missing
                writer).
        """
        fd = self._open_file(name)
        if fd is None:
            yield None
            return
        try:
            info = os.fstat(fd)
            ok = stat.S_ISREG(info.st_mode) and (self.reader is None or self.reader.may_read(info))
            yield (fd, info) if ok else None
        finally:
            os.close(fd)

    def _open_file(self, name: str) -> int | None:
        *dirs, leaf = name.split("/")
        at = self.fd
        try:
            for part in dirs:
                below = os.open(part, _DIR_FLAGS, dir_fd=at)
                if at != self.fd:
                    os.close(at)
                at = below
            return os.open(leaf, _READ_FLAGS, dir_fd=at)
        except OSError as error:
            if error.errno in _ABSENT:
                return None
            raise
        finally:
            if at != self.fd:
                os.close(at)

    def read(self, name: str, limit: int, offset: int = 0) -> bytes | None:
        """At most `limit` bytes of `name` from `offset`, None when it is not a
        regular file the reader may read."""
        with self.open(name) as found:
            return None if found is None else os.pread(found[0], limit, offset)

    def exists(self, name: str) -> bool:
        """Whether `name` exists, as `test -e` sees it (a link to something counts)."""
        try:
            os.stat(name, dir_fd=self.fd)
        except OSError:
            return False
        return True

    def lexists(self, name: str) -> bool:
        """Whether `name` exists or is a link (`test -e || test -h`)."""
        try:
            os.stat(name, dir_fd=self.fd, follow_symlinks=False)
        except OSError:
            return False
        return True


def _status(job: JobId, run: _Run | None) -> JobStatus:
    """The status of `job` in the protocol's order (`rw_status`, `sh/status_fn.sh`),
    its group's liveness sampled once, before any marker is read."""
    pgid = check_job_pid(job)
    alive = False
    if job.start is not None:
        if group_is_the_jobs(pgid, job.start):
            return JobStatus.RUNNING
    else:
        alive = group_exists(pgid)
    if run is None:
        return JobStatus.LOST
    if run.lexists("cancelled"):
        return JobStatus.CANCELLED
    if alive and run.lexists("cancelling"):
        return JobStatus.RUNNING
    code = (run.read("exit_code", 32) or b"").rstrip(b"\n")
    if _EXIT_CODE.fullmatch(code) and len(code) <= _EXIT_CODE_CHARS:
        return parse_status(f"exited {code.decode()}")
    if run.lexists("cancelling"):
        return JobStatus.CANCELLED
    return JobStatus.RUNNING if alive else JobStatus.LOST


def _open_dir(path: str) -> int | None:
    """A descriptor of the run directory `path` (its last component not a link), None
    when it is not there."""
    try:
        return os.open(path, _DIR_FLAGS)
    except OSError as error:
        if error.errno in (errno.ENOENT, errno.ENOTDIR, errno.ELOOP):
            return None
        raise


def status_here(job: JobId, reader: Reader | None) -> JobStatus | ProtocolError:
    """The status of `job` read here, as the status script decides it; a
    [`ProtocolError`] when its run directory cannot be read.

    Raises:
        InvalidArgument: for a pid no script may signal (0, 1, negative), as
            `scripts.status_script` does.
    """
    check_job_pid(job)
    try:
        fd = _open_dir(job.dir)
        try:
            return _status(job, None if fd is None else _Run(fd, reader))
        finally:
            if fd is not None:
                os.close(fd)
    except (OSError, ProtocolError) as error:
        return _failed(job, error)


def _failed(job: JobId, error: Exception) -> ProtocolError:
    if isinstance(error, ProtocolError):
        return error
    return ProtocolError(f"{job.dir}: {error}")


def _signature(info: os.stat_result) -> str:
    """`SIZE:MTIME` as GNU `find -printf '%s:%T@'` prints it (ten fraction digits)."""
    seconds, nanos = divmod(info.st_mtime_ns, 10**9)
    return f"{info.st_size}:{seconds}.{nanos:09d}0"


def _request(run: _Run) -> str | None:
    """The reason in `snapshot.request` as the follow's `Q` record gives it."""
    data = run.read("snapshot.request", _REQUEST_BYTES)
    if not data:
        return None
    line = data.rstrip(b"\n").split(b"\n", 1)[0] or b"requested"
    return line[:_REASON_BYTES].decode("utf-8", "replace").strip() or None


def _tail(run: _Run, name: str, offset: int, chunk: int, skip: bool) -> tuple[bytes, int, int]:
    """What grew in `name` past `offset`: (bytes, size, skipped), (b"", 0, 0) when it
    did not grow or is not there; with `skip`, a file more than `chunk` bytes behind
    is read from its last `chunk` bytes."""
    with run.open(name) as found:
        if found is None or found[1].st_size <= offset:
            return b"", 0, 0
        size = found[1].st_size
        skipped = max(0, size - offset - chunk) if skip else 0
        return os.pread(found[0], chunk, offset + skipped), size, skipped


def _one(
    entry: FollowEntry | tuple[JobId, int, int], reader: Reader | None, chunk: int, log_chunk: int
) -> FollowUpdate:
    job, log_offset, metrics_offset = entry[0], entry[1], entry[2]
    fd = _open_dir(job.dir)
    if fd is None:
        return FollowUpdate(_status(job, None), None, log_chunk=log_chunk)
    try:
        run = _Run(fd, reader)
        status = _status(job, run)
        request = _request(run)
        notice = run.read("notice.json", NOTICE_READ_BYTES)
        state = run.read(".runwarden/notice.state", NOTICE_STATE_READ_BYTES)
        proof: bytes | None = None
        sig = ""
        unchanged = False
        if isinstance(entry, FollowEntry) and entry.proof:
            with run.open("snapshot.json") as found:
                if found is not None:
                    sig = _signature(found[1])
                    unchanged = sig == entry.proof_seen
                    if not unchanged:
                        proof = os.pread(found[0], PROOF_LIMIT, 0)
        final_proof: bytes | None = None
        job_end: bytes | None = None
        if run.exists("exit_code") or run.exists("cancelled"):
            final_proof = run.read("snapshot.json", PROOF_LIMIT)
            if final_proof is None and not run.lexists("snapshot.json"):
                final_proof = b""
            if run.exists("exit_code"):
                job_end = run.read(".runwarden/ended", END_LIMIT) or b""
        log, log_size, skipped = _tail(run, "job.log", log_offset, log_chunk, True)
        metrics, metrics_size, _ = _tail(run, "metrics.jsonl", metrics_offset, chunk, False)
    finally:
        os.close(fd)
    return FollowUpdate(
        status,
        request,
        log,
        log_size,
        metrics,
        metrics_size,
        notice=notice,
        notice_state=state,
        proof=proof,
        proof_sig=sig,
        proof_unchanged=unchanged,
        final_proof=final_proof,
        job_end=job_end,
        log_skipped=skipped,
        log_chunk=log_chunk,
    )


def follow_here(
    entries: Sequence[FollowEntry | tuple[JobId, int, int]],
    reader: Reader | None,
    chunk: int = FOLLOW_CHUNK_BYTES,
    log_chunk: int = FOLLOW_CHUNK_BYTES,
) -> list[FollowUpdate]:
    """A follow tick over `entries` read here: per run, what `scripts.parse_follow`
    gives for the follow script's answer on the same files (`chunk` and `log_chunk`
    as there), only files `reader` may read (None: what this process may). A run
    whose directory cannot be read gets a [`ProtocolError`] status and nothing else;
    never raises for one run's files.

    Raises:
        InvalidArgument: for a pid no script may signal or a negative offset, as
            `scripts.follow_script` does, before anything is read.
    """
    for entry in entries:
        check_job_pid(entry[0])
        if entry[1] < 0 or entry[2] < 0:
            raise InvalidArgument("offsets are non-negative")
    updates: list[FollowUpdate] = []
    for entry in entries:
        try:
            updates.append(_one(entry, reader, chunk, log_chunk))
        except (OSError, ProtocolError) as error:
            updates.append(FollowUpdate(_failed(entry[0], error), None, log_chunk=log_chunk))
    return updates
