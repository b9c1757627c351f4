"""Retrieval of a run's artifacts into the artifact store, verified against the
target's manifest (DESIGN.md §3). Independent of the task queue: the caller decides
when to retrieve and whether to retry (see [`RetrievalError.retryable`]).

What comes home ([`retrieval_plan`]): `job.log` always; for a stopped run also
`snapshot.json` and the snapshot's checkpoint; for a succeeded run `output/` without
its intermediate `checkpoint-*` directories.

How ([`retrieve`]): the target's manifest (SHA-256 of every file, computed there)
runs on a thread while the download runs, and the download hashes every file as it
writes it, so verification costs no second pass over the data here. On the target
the manifest must read the files itself (it is the independent account of what the
target holds); it does so while the archive reads them, so mostly from the page
cache, with OpenSSL's SHA-256 where available. The download goes into a fresh
directory beside `dest`, flushed to disk as it arrives; only a download that
matches the manifest exactly (no file missing, differing or extra) is given its
`manifest.json` and renamed to `dest`, atomically. So `dest` either does not exist
or holds a complete, verified copy: a reader never sees a partial retrieval.

Layout of `dest`: the retrieved entries at their paths in the run directory (e.g.
`dest/output/checkpoint-12/...`), plus `manifest.json`:

    {"version": 1, "entries": [...], "exclude": [...], "absent": [...],
     "files": [{"path": "job.log", "sha256": "<64 hex>", "size": 1234}, ...]}

`dest` belongs to retrieval alone (nothing else may write there); its parent holds
the in-progress `.incoming-<dest name>-<random>` directories.

    WorkerError
    └── RetrievalError            retryable: whether trying again may help
        ├── ArtifactMismatch      the download and the target's manifest disagree
        └── StoredArtifactsInvalid  a stored retrieval is missing or damaged
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import logging
import os
import re
import secrets
import shutil
import stat
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from schemas import InvalidPath, RunState, Snapshot, safe_relpath
from schemas.protocol import JOB_LOG, OUTPUT_DIR, SNAPSHOT_FILE

from .errors import WorkerError
from .executors.base import Executor
from .executors.digest import FileDigest
from .executors.errors import (
    CommandError,
    ExecError,
    InvalidArgument,
    InvalidSecret,
    IoError,
    SshError,
    UnsafeArchive,
)

__all__ = [
    "CHECKPOINT_EXCLUDE",
    "MANIFEST_FILE",
    "ArtifactMismatch",
    "RetrievalError",
    "Retrieved",
    "StoredArtifactsInvalid",
    "StoredFile",
    "check_stored",
    "retrieval_plan",
    "retrieve",
    "reuse_stored",
    "stored_files",
    "stored_manifest",
]

log = logging.getLogger("runwarden")

MANIFEST_FILE: Final = "manifest.json"
"""The verified file list in a retrieval's directory; its presence marks it complete."""
CHECKPOINT_EXCLUDE: Final = "checkpoint-*"
"""What a succeeded run's `output/` is retrieved without: intermediate checkpoints."""
MANIFEST_VERSION: Final = 1
MAX_LISTED: Final = 30
"""Paths an error message names at most (the error's attributes hold them all)."""
_INCOMING: Final = ".incoming-"
_TOKEN_BYTES: Final = 6
_TOKEN: Final = re.compile(f"[0-9a-f]{{{2 * _TOKEN_BYTES}}}")
_PERMANENT_ERRNOS: Final = frozenset({errno.EACCES, errno.EPERM, errno.EROFS})


class RetrievalError(WorkerError):
    """A retrieval failed; nothing was made visible at its destination. `retryable`
    says whether trying again may help: yes for a broken connection, an interrupted
    stream, a target that changed during the retrieval, a full disk here; no for a
    run directory that does not exist, a refused host key or login, a hostile
    archive, a destination this process may not write."""

    def __init__(self, message: str, *, retryable: bool) -> None:
        self.retryable = retryable
        super().__init__(message)


def _listed(kind: str, paths: Sequence[str]) -> str:
    shown = ", ".join(repr(p) for p in paths[:MAX_LISTED])
    more = f" and {len(paths) - MAX_LISTED} more" if len(paths) > MAX_LISTED else ""
    return f"{len(paths)} {kind} ({shown}{more})"


class ArtifactMismatch(RetrievalError):
    """The download does not match the target's manifest: files `missing` from it,
    `differing` from the target's content, or `extra` (not in the manifest), each a
    sorted list of paths relative to the run directory. Retryable: the target's files
    changed while they were being retrieved, or bytes were damaged on the way."""

    def __init__(
        self, missing: Sequence[str], differing: Sequence[str], extra: Sequence[str]
    ) -> None:
        self.missing = list(missing)
        self.differing = list(differing)
        self.extra = list(extra)
        parts = [
            _listed(kind, paths)
            for kind, paths in (
                ("missing", self.missing),
                ("differing", self.differing),
                ("extra", self.extra),
            )
            if paths
        ]
        super().__init__(
            "the download does not match the target's manifest: " + "; ".join(parts),
            retryable=True,
        )


class StoredArtifactsInvalid(RetrievalError):
    """A retrieval in the artifact store is not there (no `manifest.json`), cannot be
    read, or no longer matches its manifest (a listed file is missing or has another
    size). Not retryable as such: the store must be retrieved into again."""

    def __init__(self, dest: Path, message: str) -> None:
        self.dest = dest
        super().__init__(f"artifacts in {dest}: {message}", retryable=False)


@dataclass(frozen=True)
class Retrieved:
    """A complete, verified retrieval."""

    path: Path
    """The destination directory (holds `manifest.json`)."""
    files: int
    """Regular files verified."""
    bytes: int
    """Their total size, in bytes."""
    seconds: float
    """Wall time of the call that returned this, in seconds."""
    absent: tuple[str, ...] = ()
    """Entries under which the target had no regular file (missing there, empty, or
    wholly excluded)."""
    reused: bool = False
    """True when `path` was already complete and this call changed nothing."""


@dataclass(frozen=True)
class StoredFile:
    """A file of a stored retrieval, as its `manifest.json` lists it."""

    path: str
    sha256: str
    size: int

    @property
    def digest(self) -> FileDigest:
        return FileDigest(self.path, self.sha256)


def retrieval_plan(state: RunState, snapshot: Snapshot | None) -> tuple[list[str], list[str]]:
    """The `(entries, exclude)` to retrieve for a run that ended in `state`: `job.log`
    always; stopped: also `snapshot.json` and the snapshot's checkpoint; succeeded:
    also `output` without any `checkpoint-*` name; failed or cancelled: `job.log`
    alone.

    Raises:
        ValueError: for a run that has not ended (`preparing`, `running`), or a
            stopped run without its snapshot.
    """
    if state is RunState.STOPPED:
        if snapshot is None:
            raise ValueError("a stopped run has a snapshot: none given")
        return [JOB_LOG, SNAPSHOT_FILE, snapshot.checkpoint], []
    if state is RunState.SUCCEEDED:
        return [JOB_LOG, OUTPUT_DIR], [CHECKPOINT_EXCLUDE]
    if state in (RunState.FAILED, RunState.CANCELLED):
        return [JOB_LOG], []
    raise ValueError(f"a {state.value} run has not ended: nothing to retrieve yet")


# --- retrieve ------------------------------------------------------------------------


def retrieve(
    executor: Executor,
    remote_dir: str,
    dest: Path,
    entries: Sequence[str],
    exclude: Sequence[str] = (),
) -> Retrieved:
    """Copies `entries` of the run directory `remote_dir` on `executor`'s target (names
    matching an `exclude` pattern left out at any depth) into the local directory
    `dest`, verified against the target's manifest, and returns what it holds.

    Idempotent: a complete `dest` (it has `manifest.json`) is returned unchanged,
    whatever it holds. Otherwise: leftovers of earlier attempts beside `dest` are
    removed; the manifest runs on the target on a second thread (an executor allows
    two concurrent calls) while the download goes into a fresh
    `.incoming-<name>-<random>` directory beside `dest`, hashed as it is written, and
    is flushed to disk (fsync) while the manifest may still run; every file the
    manifest lists must have arrived with the same SHA-256, and no other regular file
    may be there; then `manifest.json` is written and flushed, and the directory is
    renamed to `dest` (its parent flushed too): after a crash, `dest` is either
    absent or complete on disk. Two concurrent retrievals of the same `dest` both
    download; the first rename wins and the other returns it.

    A failure leaves no `dest` and removes its incoming directory.

    Raises:
        ArtifactMismatch: when the download and the manifest disagree (each path
            named; retryable).
        RetrievalError: when the target or this machine fails, translated from the
            executor's `ExecError` or the `OSError` (`raise ... from`), with
            `retryable` set (see [`RetrievalError`]); also, not retryable, for an
            entry that is not a safe relative path or would hide `manifest.json`,
            and for a `dest` that exists without being a complete retrieval.
        StoredArtifactsInvalid: when `dest` has a `manifest.json` that cannot be
            read (never replaced: a person looks first).
    """
    started = time.monotonic()
    dest = Path(dest).absolute()
    _check_entries(entries)
    done = _complete(dest, started)
    if done is not None:
        return done
    if os.path.lexists(dest) and not _is_empty_dir(dest):
        done = _complete(dest, started)  # renamed there meanwhile by a concurrent call
        if done is not None:
            return done
        raise RetrievalError(
            f"{dest} exists and is not a complete retrieval (no {MANIFEST_FILE}): "
            "refusing to replace it",
            retryable=False,
        )
    where = f"{remote_dir} into {dest}"
    incoming: Path | None = None
    lock = -1
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
        _remove_leftovers(dest)
        incoming, lock = _new_incoming(dest)
        files, absent = _fetch(executor, remote_dir, incoming, entries, exclude)
        _write_manifest(incoming, entries, exclude, absent, files)
        try:
            os.rename(incoming, dest)
        except OSError:
            done = _complete(dest, started)  # a concurrent retrieval won the rename
            if done is None:
                raise
            return done
        incoming = None
        _fsync_dir(dest.parent)
    except ExecError as error:
        raise RetrievalError(
            f"cannot retrieve {where}: {error}", retryable=_retryable(error)
        ) from error
    except OSError as error:
        retryable = error.errno not in _PERMANENT_ERRNOS
        raise RetrievalError(f"cannot retrieve {where}: {error}", retryable=retryable) from error
    finally:
        if incoming is not None:
            shutil.rmtree(incoming, ignore_errors=True)
        if lock >= 0:
            os.close(lock)
    return Retrieved(
        path=dest,
        files=len(files),
        bytes=sum(f.size for f in files),
        seconds=time.monotonic() - started,
        absent=tuple(absent),
    )


def _check_entries(entries: Sequence[str]) -> None:
    for entry in entries:
        try:
            safe_relpath(entry)
        except InvalidPath as error:
            raise RetrievalError(f"cannot retrieve {entry!r}: {error}", retryable=False) from error
        if entry.split("/", 1)[0] == MANIFEST_FILE:
            raise RetrievalError(
                f"cannot retrieve {entry!r}: {MANIFEST_FILE} is the retrieval's own",
                retryable=False,
            )


def _retryable(error: ExecError) -> bool:
    if isinstance(error, SshError):
        return error.kind not in ("host_key", "auth")
    if isinstance(error, (InvalidArgument, InvalidSecret, UnsafeArchive)):
        return False
    if isinstance(error, CommandError):
        return not error.message.endswith("does not exist")
    if isinstance(error, IoError):
        return error.cause.errno not in _PERMANENT_ERRNOS
    return True  # a stream that broke off, a local shell that could not start


def _is_empty_dir(path: Path) -> bool:
    try:
        return stat.S_ISDIR(path.lstat().st_mode) and not any(os.scandir(path))
    except OSError:
        return False


def _complete(dest: Path, started: float) -> Retrieved | None:
    """`dest` as a [`Retrieved`] when it is complete (has `manifest.json`), else None.

    Raises:
        StoredArtifactsInvalid: when its `manifest.json` cannot be read.
    """
    stored = _read_manifest(dest)
    if stored is None:
        return None
    files, absent = stored
    return Retrieved(
        path=dest,
        files=len(files),
        bytes=sum(f.size for f in files),
        seconds=time.monotonic() - started,
        absent=tuple(absent),
        reused=True,
    )


def _incoming_prefix(dest: Path) -> str:
    return f"{_INCOMING}{dest.name}-"


def _remove_leftovers(dest: Path) -> None:
    """Removes the incoming directories of `dest` whose retrieval is over (its process
    died or failed to clean up): those whose lock can be taken. Another process's
    retrieval in progress holds its lock, and is left alone."""
    prefix = _incoming_prefix(dest)
    with os.scandir(dest.parent) as found:
        names = [
            e.name
            for e in found
            if e.name.startswith(prefix)
            and _TOKEN.fullmatch(e.name[len(prefix) :])
            and e.is_dir(follow_symlinks=False)
        ]
    for name in names:
        path = dest.parent / name
        try:
            fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except FileNotFoundError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue
        try:
            shutil.rmtree(path, ignore_errors=True)
        finally:
            os.close(fd)


def _new_incoming(dest: Path) -> tuple[Path, int]:
    """A new incoming directory for `dest`, locked (flock, held until the returned
    descriptor is closed) so that no other retrieval takes it for a leftover."""
    while True:
        path = dest.parent / f"{_incoming_prefix(dest)}{secrets.token_hex(_TOKEN_BYTES)}"
        path.mkdir(mode=0o700)
        # Until it is locked, a concurrent retrieval may take it for a leftover and
        # remove it: then take another.
        try:
            fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except FileNotFoundError:
            continue
        fcntl.flock(fd, fcntl.LOCK_EX)
        if os.fstat(fd).st_nlink > 0:
            return path, fd
        os.close(fd)


def _fetch(
    executor: Executor,
    remote_dir: str,
    incoming: Path,
    entries: Sequence[str],
    exclude: Sequence[str],
) -> tuple[list[StoredFile], list[str]]:
    """Downloads into `incoming` while the target's manifest runs on a thread, then
    compares: returns the verified files and the entries with none.

    Raises:
        ArtifactMismatch, ExecError, OSError.
    """
    answer: list[list[FileDigest] | BaseException] = []

    def manifest() -> None:
        try:
            answer.append(executor.manifest(remote_dir, entries, exclude))
        except BaseException as error:  # noqa: BLE001 # re-raised on the caller's thread
            answer.append(error)

    thread = threading.Thread(target=manifest, name="retrieval-manifest", daemon=True)
    thread.start()
    try:
        with _EarlyFlush(incoming):
            downloaded = executor.download(remote_dir, incoming, entries, exclude)
        # To disk while the manifest may still run on the target: the wait overlaps.
        _flush(incoming)
    finally:
        thread.join()  # never leaves a call running on the executor
    expected = answer[0]
    if isinstance(expected, BaseException):
        raise expected
    on_disk = _regular_files(incoming)
    want = {d.path: d.sha256 for d in expected}
    got = {d.path: d.sha256 for d in downloaded}
    missing = sorted(p for p in want if p not in got or p not in on_disk)
    differing = sorted(p for p in want if p in got and p in on_disk and got[p] != want[p])
    extra = sorted((got.keys() | on_disk.keys()) - want.keys())
    if missing or differing or extra:
        raise ArtifactMismatch(missing, differing, extra)
    files = [StoredFile(path, want[path], on_disk[path]) for path in sorted(want)]
    absent = [
        entry for entry in entries if not any(p == entry or p.startswith(entry + "/") for p in want)
    ]
    return files, absent


def _regular_files(root: Path) -> dict[str, int]:
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


def _write_manifest(
    incoming: Path,
    entries: Sequence[str],
    exclude: Sequence[str],
    absent: Sequence[str],
    files: Sequence[StoredFile],
) -> None:
    document = {
        "version": MANIFEST_VERSION,
        "entries": list(entries),
        "exclude": list(exclude),
        "absent": list(absent),
        "files": [{"path": f.path, "sha256": f.sha256, "size": f.size} for f in files],
    }
    # ASCII with \u escapes: a name that is not UTF-8 (a surrogate escape) survives.
    path = incoming / MANIFEST_FILE
    with path.open("w", encoding="ascii") as out:
        out.write(json.dumps(document, indent=1) + "\n")
        out.flush()
        os.fsync(out.fileno())
    _fsync_dir(incoming)


class _EarlyFlush:
    """While a download writes under `root`: every `interval_s`, fsyncs the files whose
    size did not change since the previous look (most likely complete), so that the
    writeback to disk overlaps the download instead of following it (measured: the
    final fsync of 1 GiB took 0.3 s after a 0.9 s local download). Best effort, an
    optimization only: [`_flush`] still syncs everything afterwards."""

    def __init__(self, root: Path, interval_s: float = 0.1) -> None:
        self._root = root
        self._interval_s = interval_s
        self._sizes: dict[str, int] = {}
        self._flushed: dict[str, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="retrieval-flush", daemon=True)

    def __enter__(self) -> _EarlyFlush:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(self._interval_s):
            # The download reports its own errors; `_flush` syncs whatever is missed.
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


def _flush(root: Path) -> None:
    """fsyncs every regular file and directory under `root` (bottom-up), so that the
    rename that publishes it never exposes files whose data is not on disk yet."""
    for dirpath, _dirs, names in os.walk(root, topdown=False):
        for name in names:
            path = os.path.join(dirpath, name)
            if stat.S_ISREG(os.lstat(path).st_mode):
                _fsync_file(path)
        _fsync_dir(Path(dirpath))


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# --- the stored retrieval ------------------------------------------------------------


def _read_manifest(dest: Path) -> tuple[list[StoredFile], list[str]] | None:
    path = dest / MANIFEST_FILE
    try:
        text = path.read_text("ascii")
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as error:
        raise StoredArtifactsInvalid(dest, f"cannot read {MANIFEST_FILE}: {error}") from error
    try:
        document: Any = json.loads(text)
        files = [
            StoredFile(safe_relpath(item["path"]), str(item["sha256"]), int(item["size"]))
            for item in document["files"]
        ]
        absent = [str(entry) for entry in document.get("absent", [])]
    except (ValueError, TypeError, KeyError, InvalidPath) as error:
        raise StoredArtifactsInvalid(dest, f"{MANIFEST_FILE} is malformed: {error}") from error
    return files, absent


def stored_files(dest: Path) -> list[StoredFile] | None:
    """The files of the complete retrieval in `dest` (path, SHA-256, size), sorted by
    path, as its `manifest.json` lists them; None when `dest` holds no complete
    retrieval (no `manifest.json`).

    Raises:
        StoredArtifactsInvalid: when `manifest.json` cannot be read or is malformed.
    """
    stored = _read_manifest(Path(dest))
    return None if stored is None else stored[0]


def stored_manifest(dest: Path) -> list[FileDigest] | None:
    """[`stored_files`] as digests (path, SHA-256): comparable with an executor's
    `manifest` of the same entries."""
    files = stored_files(dest)
    return None if files is None else [f.digest for f in files]


def check_stored(dest: Path, prefix: str) -> list[FileDigest]:
    """The stored files of the retrieval in `dest` under `prefix` (a path relative to
    the run directory, e.g. a checkpoint `output/checkpoint-12`; the file itself or
    everything below it; `""` for all), after checking that each is still there, a
    regular file of the size listed. Contents are not read again: they were verified
    when retrieved. Used to decide whether a stopped run can be resumed from here.

    Raises:
        StoredArtifactsInvalid: when `dest` has no `manifest.json` (not retrieved, or
            not completely), it is malformed, it lists no file under `prefix`, or a
            listed file is missing or has another size (each such path named).
    """
    dest = Path(dest)
    if prefix:
        try:
            safe_relpath(prefix)
        except InvalidPath as error:
            raise StoredArtifactsInvalid(dest, str(error)) from error
    files = stored_files(dest)
    if files is None:
        raise StoredArtifactsInvalid(dest, f"no {MANIFEST_FILE}: not retrieved (completely)")
    chosen = [f for f in files if not prefix or f.path == prefix or f.path.startswith(prefix + "/")]
    if not chosen:
        raise StoredArtifactsInvalid(dest, f"no file under {prefix!r} was retrieved")
    _check_files(dest, chosen)
    return [f.digest for f in chosen]


def _check_files(dest: Path, files: Sequence[StoredFile]) -> None:
    """Raises `StoredArtifactsInvalid` naming every file of `files` that is missing
    under `dest`, not a regular file, or of another size than listed."""
    missing: list[str] = []
    resized: list[str] = []
    for item in files:
        try:
            info = (dest / item.path).lstat()
        except FileNotFoundError:
            missing.append(item.path)
            continue
        except OSError as error:
            raise StoredArtifactsInvalid(dest, f"cannot access {item.path!r}: {error}") from error
        if not stat.S_ISREG(info.st_mode):
            missing.append(item.path)
        elif info.st_size != item.size:
            resized.append(item.path)
    if missing or resized:
        parts = [
            _listed(kind, paths)
            for kind, paths in (("missing", missing), ("of another size", resized))
            if paths
        ]
        raise StoredArtifactsInvalid(dest, "; ".join(parts))


def reuse_stored(dest: Path) -> Retrieved | None:
    """The complete retrieval in `dest` when every file it lists is still there with
    its size (contents are not read again), without reaching any target; None when
    there is none. A damaged one (a file lost, or of another size) is moved to
    `<dest>.damaged-<unix time>` (kept: it may be all there is) and None returned, so
    that it is retrieved again. `manifest.json` is read once.

    Raises:
        StoredArtifactsInvalid: when `manifest.json` cannot be read.
        OSError: when a damaged copy cannot be moved aside.
    """
    started = time.monotonic()
    stored = _read_manifest(Path(dest))
    if stored is None:
        return None
    files, absent = stored
    try:
        _check_files(dest, files)
    except StoredArtifactsInvalid as error:
        aside = dest.with_name(f"{dest.name}.damaged-{int(time.time())}")
        log.warning("%s is damaged (%s): moved to %s", dest, error, aside)
        dest.rename(aside)
        return None
    return Retrieved(
        path=dest,
        files=len(files),
        bytes=sum(f.size for f in files),
        seconds=time.monotonic() - started,
        absent=tuple(absent),
        reused=True,
    )
