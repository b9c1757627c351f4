"""[`retrieve`]: a run's artifacts downloaded into the artifact store and verified
against the target's manifest, published only once complete (see the package
docstring for the guarantees)."""

from __future__ import annotations

import errno
import fcntl
import os
import re
import secrets
import shutil
import stat
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Final

from schemas import InvalidPath, safe_relpath

from ..errors import ArtifactMismatch, RetrievalError
from ..executors import (
    Charge,
    CommandError,
    ExecError,
    Executor,
    FileDigest,
    InvalidArgument,
    InvalidSecret,
    IoError,
    SshError,
    UnsafeArchive,
)
from .disk import EarlyFlush, flush_tree, fsync_dir, regular_files
from .quota import ArtifactLimits, open_budget, remote_bytes
from .stored import (
    MANIFEST_FILE,
    Retrieved,
    StoredFile,
    StoredManifest,
    complete,
    write_manifest,
)

__all__ = ["retrieve"]

_INCOMING: Final = ".incoming-"
_TOKEN_BYTES: Final = 6
_TOKEN: Final = re.compile(f"[0-9a-f]{{{2 * _TOKEN_BYTES}}}")
_PERMANENT_ERRNOS: Final = frozenset({errno.EACCES, errno.EPERM, errno.EROFS})




def retrieve(
    executor: Executor,
    remote_dir: str,
    dest: Path,
    entries: Sequence[str],
    exclude: Sequence[str] = (),
    *,
    run_id: str,
    limits: ArtifactLimits | None = None,
) -> Retrieved:
    """Copies `entries` of the run directory `remote_dir` of the run `run_id` on
    `executor`'s target (names matching an `exclude` pattern left out at any depth)
    into the local directory `dest`, verified against the target's manifest, and
    returns what it holds. Symbolic links come as the executor's `download` makes
    them: those leading outside the run directory are left out, listed in
    `manifest.json` and in the result's `skipped_links`; the retrieval succeeds.

    Idempotent: a complete `dest` (it has `manifest.json`) made for `run_id` is
    returned unchanged, whatever it holds. Otherwise: leftovers of earlier attempts
    beside `dest` are removed; the manifest runs on the target on a second thread (an
    executor allows two concurrent calls) while the download goes into a fresh
    `.incoming-<name>-<random>` directory beside `dest`, hashed as it is written, and
    is flushed to disk (fsync) while the manifest may still run; every file the
    manifest lists must have arrived with the same SHA-256, and no other regular file
    may be there; then `manifest.json` (recording `run_id`) is written and flushed,
    and the directory is renamed to `dest` (its parent flushed too): after a crash, `dest` is either
    absent or complete on disk. Two concurrent retrievals of the same `dest` both
    download; the first rename wins and the other returns it.

    With `limits`, the artifact store (`dest`'s parent) is kept within them
    (`retrieval.quota`): checked before the download from the target's sizes (when
    it can tell them) and as each chunk arrives, before it is written.

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
            read, or that was made for another run (never replaced: a person looks
            first; `reuse_stored` moves such a copy aside).
        ArtifactQuotaExceeded: when a limit would be passed (not retryable; the
            download is stopped there).
    """
    started = time.monotonic()
    dest = Path(dest).absolute()
    _check_entries(entries)
    done = complete(dest, started, run_id)
    if done is not None:
        return done
    if os.path.lexists(dest) and not _is_empty_dir(dest):
        done = complete(dest, started, run_id)  # renamed there meanwhile by a concurrent call
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
        charge: Charge | None = None
        if limits is not None:
            expected = remote_bytes(executor, remote_dir, entries, exclude)
            charge = open_budget(limits, dest.parent, run_id, expected).charge
        incoming, lock = _new_incoming(dest)
        stored = _fetch(
            executor, remote_dir, incoming, entries, exclude, run_id=run_id, charge=charge
        )
        write_manifest(incoming, stored)
        try:
            os.rename(incoming, dest)
        except OSError:
            done = complete(dest, started, run_id)  # a concurrent retrieval won the rename
            if done is None:
                raise
            return done
        incoming = None
        fsync_dir(dest.parent)
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
    return Retrieved.of(dest, stored, started, reused=False)


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
    *,
    run_id: str,
    charge: Charge | None = None,
) -> StoredManifest:
    """Downloads into `incoming` while the target's manifest runs on a thread, then
    compares: returns the manifest to store (the verified files, the entries with
    none, the links kept and skipped). `charge` goes to the download; when it stops
    the download, this waits for the manifest to end all the same (a call is never
    left running on the executor).

    Raises:
        ArtifactMismatch, ExecError, OSError, and what `charge` raises.
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
        with EarlyFlush(incoming):
            downloaded = executor.download(remote_dir, incoming, entries, exclude, charge)
        # To disk while the manifest may still run on the target: the wait overlaps.
        flush_tree(incoming)
    finally:
        thread.join()  # never leaves a call running on the executor
    expected = answer[0]
    if isinstance(expected, BaseException):
        raise expected
    on_disk = regular_files(incoming)
    want = {d.path: d.sha256 for d in expected}
    got = {d.path: d.sha256 for d in downloaded.files}
    missing = sorted(p for p in want if p not in got or p not in on_disk)
    differing = sorted(p for p in want if p in got and p in on_disk and got[p] != want[p])
    extra = sorted((got.keys() | on_disk.keys()) - want.keys())
    if missing or differing or extra:
        raise ArtifactMismatch(missing, differing, extra)
    files = [StoredFile(path, want[path], on_disk[path]) for path in sorted(want)]
    absent = [
        entry for entry in entries if not any(p == entry or p.startswith(entry + "/") for p in want)
    ]
    return StoredManifest(
        run_id=run_id,
        entries=list(entries),
        exclude=list(exclude),
        absent=absent,
        files=files,
        links=downloaded.links,
        skipped_links=downloaded.skipped_links,
    )
