"""Disk work of a retrieval: flushing a downloaded tree to disk (while it arrives, and
all of it before it is published), and listing its regular files without reading
them."""

from __future__ import annotations

import contextlib
import os
import stat
import threading
from pathlib import Path

__all__ = ["EarlyFlush", "flush_tree", "fsync_dir", "regular_files"]


def regular_files(root: Path) -> dict[str, int]:
    """Relative path -> size of every regular file under `root` (links not followed),
    from the directory entries alone: no file is read."""
    found: dict[str, int] = {}

    def fail(error: OSError) -> None:
        raise error

    for dirpath, _dirs, names in os.walk(root, onerror=fail):
        base = Path(dirpath)
        for name in names:
            info = (base / name).lstat()
            if stat.S_ISREG(info.st_mode):
                found[(base / name).relative_to(root).as_posix()] = info.st_size
    return found


class EarlyFlush:
    """While a download writes under `root`: every `interval_s`, fsyncs the files whose
    size did not change since the previous look (most likely complete), so that the
    writeback to disk overlaps the download instead of following it (measured: the
    final fsync of 1 GiB took 0.3 s after a 0.9 s local download). Best effort, an
    optimization only: [`flush_tree`] still syncs everything afterwards."""

    def __init__(self, root: Path, interval_s: float = 0.1) -> None:
        self._root = root
        self._interval_s = interval_s
        self._sizes: dict[str, int] = {}
        self._flushed: dict[str, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="retrieval-flush", daemon=True)

    def __enter__(self) -> EarlyFlush:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(self._interval_s):
            # The download reports its own errors; `flush_tree` syncs whatever is missed.
            with contextlib.suppress(OSError):
                self._look()

    def _look(self) -> None:
        for dirpath, _dirs, names in os.walk(self._root):
            for name in names:
                if self._stop.is_set():
                    return
                path = os.path.join(dirpath, name)
                info = os.lstat(path)
                if not stat.S_ISREG(info.st_mode):
                    continue
                size = info.st_size
                if self._sizes.get(path) == size and self._flushed.get(path) != size:
                    _fsync_file(path)
                    self._flushed[path] = size
                self._sizes[path] = size


def _fsync_file(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def flush_tree(root: Path) -> None:
    """fsyncs every regular file and directory under `root` (bottom-up), so that the
    rename that publishes it never exposes files whose data is not on disk yet."""
    for dirpath, _dirs, names in os.walk(root, topdown=False):
        for name in names:
            path = os.path.join(dirpath, name)
            if stat.S_ISREG(os.lstat(path).st_mode):
                _fsync_file(path)
        fsync_dir(Path(dirpath))


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
