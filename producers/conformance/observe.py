"""What `runwarden check-trainer` reads of a run on this machine (a local target): its
run directory's metrics, request, proof, checkpoint, exit and the ranks' stop reports.

Every read is bounded in bytes (`MAX_READ` per small file, `METRICS_CHUNK` per metrics
poll, `MAX_ENTRIES` files per listing), opens no link and waits on no FIFO: the job
being checked wrote these files, and a broken job must give a failed check, never a
hung or crashed checker. Nothing here raises `OSError`: what cannot be read is absent.
"""

from __future__ import annotations

import json
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from schemas.protocol import METRICS_FILE

__all__ = [
    "MAX_ENTRIES",
    "MAX_READ",
    "METRICS_CHUNK",
    "Listing",
    "MetricsReader",
    "inside",
    "listing",
    "mtime",
    "mtime_ns",
    "rank_reports",
    "read_json",
    "read_small",
    "tail",
]

MAX_READ: Final = 64 * 1024
"""Bytes read at most of a small file (a proof, an exit code, a rank's report)."""
METRICS_CHUNK: Final = 1024 * 1024
"""Bytes of `metrics.jsonl` read at most per poll; the rest waits for the next."""
MAX_METRICS: Final = 64 * 1024 * 1024
"""Bytes of `metrics.jsonl` read at most in all; a job that writes more is read no further."""
MAX_ENTRIES: Final = 100_000
"""Files listed at most in a checkpoint; a listing cut there says so."""

_FLAGS: Final = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)

Listing = dict[str, tuple[int, int]]
"""A checkpoint's regular files: path relative to it -> (size in bytes, mtime in ns)."""


def read_small(path: Path, limit: int = MAX_READ) -> bytes | None:
    """The first `limit` bytes of the regular file `path` (not through a link), or None."""
    try:
        fd = os.open(path, _FLAGS)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        return os.read(fd, limit)
    except OSError:
        return None
    finally:
        os.close(fd)


def tail(path: Path, lines: int = 5, limit: int = 4096) -> str:
    """The last `lines` lines of the regular file `path` (of its last `limit` bytes),
    as text, for a person; "" when there is nothing."""
    try:
        fd = os.open(path, _FLAGS)
    except OSError:
        return ""
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            return ""
        data = os.pread(fd, limit, max(0, info.st_size - limit))
    except OSError:
        return ""
    finally:
        os.close(fd)
    text = data.decode("utf-8", "replace").strip().splitlines()[-lines:]
    return " | ".join(line.strip() for line in text if line.strip())


def read_json(path: Path) -> dict[str, Any] | None:
    """The JSON object in the small regular file `path`, or None (absent, too big,
    not an object)."""
    data = read_small(path, MAX_READ + 1)
    if data is None or len(data) > MAX_READ:
        return None
    try:
        value = json.loads(data)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def mtime(path: Path) -> float | None:
    """The modification time (unix seconds) of the regular file `path`, not through a
    link, or None."""
    ns = mtime_ns(path)
    return None if ns is None else ns / 1e9


def mtime_ns(path: Path) -> int | None:
    """The modification time (unix nanoseconds, as the file system keeps it: to its
    clock's tick, a few milliseconds) of the regular file `path`, not through a link,
    or None."""
    try:
        info = os.lstat(path)
    except OSError:
        return None
    return info.st_mtime_ns if stat.S_ISREG(info.st_mode) else None


def inside(relative: str) -> bool:
    """Whether `relative` (a proof's checkpoint) names a place inside the directory it
    is relative to: not absolute, no `..`, no NUL."""
    parts = Path(relative).parts
    return (
        bool(parts)
        and not Path(relative).is_absolute()
        and ".." not in parts
        and "\0" not in relative
    )


def listing(directory: Path) -> tuple[Listing, bool]:
    """The regular files under `directory` (links neither followed nor listed), and
    whether the listing is whole (False: cut at `MAX_ENTRIES`)."""
    found: Listing = {}
    for current, dirs, files in os.walk(directory):
        dirs.sort()
        for name in sorted(files):
            path = Path(current) / name
            try:
                info = os.lstat(path)
            except OSError:
                continue
            if stat.S_ISREG(info.st_mode):
                found[str(path.relative_to(directory))] = (info.st_size, info.st_mtime_ns)
            if len(found) >= MAX_ENTRIES:
                return found, False
    return found, True


def rank_reports(directory: Path, ranks: int) -> dict[int, dict[str, Any]]:
    """Rank -> its stop report (`runwarden_job.report_stop`: `rank-<r>.json`), for the
    ranks 0 .. `ranks` - 1 that wrote a valid one (an int `step` in it)."""
    reports: dict[int, dict[str, Any]] = {}
    for rank in range(ranks):
        report = read_json(directory / f"rank-{rank}.json")
        step = None if report is None else report.get("step")
        if isinstance(step, int) and not isinstance(step, bool) and step >= 0:
            reports[rank] = report  # type: ignore[assignment]
    return reports


@dataclass
class MetricsReader:
    """Reads `metrics.jsonl` of a run directory as it grows ([`poll`]): the `log`
    steps with their times, the first `begin` line. Lines that are not JSON objects
    are skipped; a line longer than `METRICS_CHUNK` is dropped whole."""

    run_dir: Path
    steps: list[tuple[int, float]] = field(default_factory=list)
    """Each `log` line's step and time (unix seconds), in file order."""
    begin: dict[str, Any] | None = None
    _offset: int = 0
    _partial: bytes = b""

    @property
    def last_step(self) -> int | None:
        """The last logged step, or None before any."""
        return self.steps[-1][0] if self.steps else None

    def poll(self) -> int:
        """Reads what was appended since the last poll (at most `METRICS_CHUNK`);
        returns how many bytes that was."""
        if self._offset >= MAX_METRICS:
            return 0
        try:
            fd = os.open(self.run_dir / METRICS_FILE, _FLAGS)
        except OSError:
            return 0
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                return 0
            data = os.pread(fd, METRICS_CHUNK, self._offset)
        except OSError:
            return 0
        finally:
            os.close(fd)
        self._offset += len(data)
        lines = (self._partial + data).split(b"\n")
        self._partial = lines.pop()
        if len(self._partial) > METRICS_CHUNK:
            self._partial = b""
        for line in lines:
            self._take(line)
        return len(data)

    def read_all(self) -> None:
        """Polls until nothing more is there (or the bound `MAX_METRICS` is reached)."""
        while self.poll():
            pass

    def _take(self, line: bytes) -> None:
        try:
            record = json.loads(line)
        except ValueError:
            return
        if not isinstance(record, dict):
            return
        event, step, when = record.get("event"), record.get("step"), record.get("time")
        if event == "begin" and self.begin is None:
            self.begin = record
        elif (
            event == "log"
            and isinstance(step, int)
            and not isinstance(step, bool)
            and isinstance(when, (int, float))
        ):
            self.steps.append((step, float(when)))
