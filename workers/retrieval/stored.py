"""A retrieval as the artifact store holds it: its `manifest.json` (the verified file
list; its presence marks the retrieval complete), and the checks of a stored copy
that decide whether it can be reused or resumed from without reaching the target."""

from __future__ import annotations

import json
import logging
import os
import stat
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from schemas import InvalidPath, safe_relpath

from ..errors import StoredArtifactsInvalid, listed
from ..executors import FileDigest
from .disk import fsync_dir

__all__ = [
    "MANIFEST_FILE",
    "Retrieved",
    "StoredFile",
    "check_stored",
    "complete",
    "read_manifest",
    "reuse_stored",
    "stored_files",
    "stored_manifest",
    "write_manifest",
]

log = logging.getLogger("runwarden")

MANIFEST_FILE: Final = "manifest.json"
"""The verified file list in a retrieval's directory; its presence marks it complete."""
MANIFEST_VERSION: Final = 1


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

    @classmethod
    def of(
        cls,
        path: Path,
        files: Sequence[StoredFile],
        absent: Sequence[str],
        started: float,
        *,
        reused: bool,
    ) -> Retrieved:
        """The retrieval in `path` holding `files`, for a call started at `started`
        (`time.monotonic()`)."""
        return cls(
            path=path,
            files=len(files),
            bytes=sum(f.size for f in files),
            seconds=time.monotonic() - started,
            absent=tuple(absent),
            reused=reused,
        )


@dataclass(frozen=True)
class StoredFile:
    """A file of a stored retrieval, as its `manifest.json` lists it."""

    path: str
    sha256: str
    size: int

    @property
    def digest(self) -> FileDigest:
        return FileDigest(self.path, self.sha256)


def write_manifest(
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
    fsync_dir(incoming)


def complete(dest: Path, started: float) -> Retrieved | None:
    """`dest` as a [`Retrieved`] when it is complete (has `manifest.json`), else None.

    Raises:
        StoredArtifactsInvalid: when its `manifest.json` cannot be read.
    """
    stored = read_manifest(dest)
    if stored is None:
        return None
    files, absent = stored
    return Retrieved.of(dest, files, absent, started, reused=True)




def read_manifest(dest: Path) -> tuple[list[StoredFile], list[str]] | None:
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
    stored = read_manifest(Path(dest))
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
            listed(kind, paths)
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
    stored = read_manifest(Path(dest))
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
    return Retrieved.of(dest, files, absent, started, reused=True)
