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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from schemas import InvalidPath, safe_relpath

from ..errors import StoredArtifactsInvalid, listed
from ..executors import FileDigest, Link
from .disk import fsync_dir

__all__ = [
    "MANIFEST_FILE",
    "Retrieved",
    "StoredFile",
    "StoredManifest",
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
MANIFEST_VERSION: Final = 2
"""2 added `run_id`, `links` and `skipped_links`; version 1 manifests still read."""


@dataclass(frozen=True)
class StoredFile:
    """A file of a stored retrieval, as its `manifest.json` lists it."""

    path: str
    sha256: str
    size: int

    @property
    def digest(self) -> FileDigest:
        return FileDigest(self.path, self.sha256)


@dataclass(frozen=True)
class StoredManifest:
    """A retrieval's `manifest.json`."""

    run_id: str | None
    """The run it was made for; None in a manifest written before run ids were
    recorded (see [`made_for`](StoredManifest.made_for))."""
    entries: list[str]
    exclude: list[str]
    absent: list[str]
    """Entries under which the target had no regular file."""
    files: list[StoredFile]
    """The verified regular files, sorted by path."""
    links: list[Link] = field(default_factory=list)
    """Symbolic links kept (their targets inside the retrieval), not verified."""
    skipped_links: list[Link] = field(default_factory=list)
    """Symbolic links left out: absolute, or leading outside the retrieval."""

    def made_for(self, dest: Path) -> str:
        """The run whose retrieval this is: its recorded run id; for a manifest
        without one (written by a version that recorded none), the name of `dest`,
        its directory: those versions only ever wrote `<artifact store>/<run id>`."""
        return self.run_id if self.run_id is not None else Path(dest).name


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
    links: tuple[Link, ...] = ()
    """Symbolic links kept, their targets inside the retrieval."""
    skipped_links: tuple[Link, ...] = ()
    """Symbolic links the run directory held that were not made: their targets are
    absolute or lead outside it (listed in `manifest.json`)."""

    @classmethod
    def of(
        cls, path: Path, stored: StoredManifest, started: float, *, reused: bool
    ) -> Retrieved:
        """The retrieval in `path` whose manifest is `stored`, for a call started at
        `started` (`time.monotonic()`)."""
        return cls(
            path=path,
            files=len(stored.files),
            bytes=sum(f.size for f in stored.files),
            seconds=time.monotonic() - started,
            absent=tuple(stored.absent),
            reused=reused,
            links=tuple(stored.links),
            skipped_links=tuple(stored.skipped_links),
        )


def _links_json(links: Sequence[Link]) -> list[dict[str, str]]:
    return [{"path": link.path, "target": link.target} for link in links]


def write_manifest(incoming: Path, stored: StoredManifest) -> None:
    """Writes `stored` as `incoming/manifest.json`, flushed to disk with its
    directory."""
    document = {
        "version": MANIFEST_VERSION,
        "run_id": stored.run_id,
        "entries": list(stored.entries),
        "exclude": list(stored.exclude),
        "absent": list(stored.absent),
        "files": [{"path": f.path, "sha256": f.sha256, "size": f.size} for f in stored.files],
        "links": _links_json(stored.links),
        "skipped_links": _links_json(stored.skipped_links),
    }
    # ASCII with \u escapes: a name that is not UTF-8 (a surrogate escape) survives.
    path = incoming / MANIFEST_FILE
    with path.open("w", encoding="ascii") as out:
        out.write(json.dumps(document, indent=1) + "\n")
        out.flush()
        os.fsync(out.fileno())
    fsync_dir(incoming)


def _foreign(dest: Path, stored: StoredManifest, run_id: str) -> str | None:
    """Why the retrieval in `dest` is not `run_id`'s, or None when it is."""
    owner = stored.made_for(dest)
    if owner == run_id:
        return None
    return f"made for run {owner[:80]!r}, not {run_id[:80]!r}"


def complete(dest: Path, started: float, run_id: str) -> Retrieved | None:
    """`dest` as a [`Retrieved`] when it is complete (has `manifest.json`), else None.

    Raises:
        StoredArtifactsInvalid: when its `manifest.json` cannot be read, or it was
            made for another run than `run_id` ([`StoredManifest.made_for`]).
    """
    stored = read_manifest(dest)
    if stored is None:
        return None
    foreign = _foreign(dest, stored, run_id)
    if foreign is not None:
        raise StoredArtifactsInvalid(dest, foreign)
    return Retrieved.of(dest, stored, started, reused=True)


def _links(items: Any) -> list[Link]:
    return [Link(safe_relpath(item["path"]), str(item["target"])) for item in items]


def read_manifest(dest: Path) -> StoredManifest | None:
    """The `manifest.json` of `dest`; None when there is none (no complete
    retrieval). Reads those of every version: one without a run id (version 1)
    has `run_id` None, no links and no skipped links.

    Raises:
        StoredArtifactsInvalid: when it cannot be read or is malformed.
    """
    path = dest / MANIFEST_FILE
    try:
        text = path.read_text("ascii")
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as error:
        raise StoredArtifactsInvalid(dest, f"cannot read {MANIFEST_FILE}: {error}") from error
    try:
        document: Any = json.loads(text)
        run_id = document.get("run_id")
        if run_id is not None and (not isinstance(run_id, str) or not run_id):
            raise ValueError(f"run_id {run_id!r} is not a run id")
        files = [
            StoredFile(safe_relpath(item["path"]), str(item["sha256"]), int(item["size"]))
            for item in document["files"]
        ]
        return StoredManifest(
            run_id=run_id,
            entries=[str(entry) for entry in document.get("entries", [])],
            exclude=[str(pattern) for pattern in document.get("exclude", [])],
            absent=[str(entry) for entry in document.get("absent", [])],
            files=files,
            links=_links(document.get("links", [])),
            skipped_links=_links(document.get("skipped_links", [])),
        )
    except (ValueError, TypeError, KeyError, AttributeError, InvalidPath) as error:
        raise StoredArtifactsInvalid(dest, f"{MANIFEST_FILE} is malformed: {error}") from error


def stored_files(dest: Path) -> list[StoredFile] | None:
    """The files of the complete retrieval in `dest` (path, SHA-256, size), sorted by
    path, as its `manifest.json` lists them; None when `dest` holds no complete
    retrieval (no `manifest.json`).

    Raises:
        StoredArtifactsInvalid: when `manifest.json` cannot be read or is malformed.
    """
    stored = read_manifest(Path(dest))
    return None if stored is None else stored.files


def stored_manifest(dest: Path) -> list[FileDigest] | None:
    """[`stored_files`] as digests (path, SHA-256): comparable with an executor's
    `manifest` of the same entries."""
    files = stored_files(dest)
    return None if files is None else [f.digest for f in files]


def check_stored(dest: Path, prefix: str, run_id: str) -> list[FileDigest]:
    """The stored files of the retrieval in `dest` under `prefix` (a path relative to
    the run directory, e.g. a checkpoint `output/checkpoint-12`; the file itself or
    everything below it; `""` for all), after checking that it was made for the run
    `run_id` ([`StoredManifest.made_for`]) and that each file is still there, a
    regular file of the size listed. Contents are not read again: they were verified
    when retrieved. Used to decide whether a stopped run can be resumed from here.

    Raises:
        StoredArtifactsInvalid: when `dest` has no `manifest.json` (not retrieved, or
            not completely), it is malformed, it was made for another run, it lists
            no file under `prefix`, or a listed file is missing or has another size
            (each such path named).
    """
    dest = Path(dest)
    if prefix:
        try:
            safe_relpath(prefix)
        except InvalidPath as error:
            raise StoredArtifactsInvalid(dest, str(error)) from error
    stored = read_manifest(dest)
    if stored is None:
        raise StoredArtifactsInvalid(dest, f"no {MANIFEST_FILE}: not retrieved (completely)")
    foreign = _foreign(dest, stored, run_id)
    if foreign is not None:
        raise StoredArtifactsInvalid(dest, foreign)
    files = stored.files
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


def reuse_stored(dest: Path, run_id: str) -> Retrieved | None:
    """The complete retrieval in `dest` when it was made for the run `run_id`
    ([`StoredManifest.made_for`]) and every file it lists is still there with its
    size (contents are not read again), without reaching any target; None when
    there is none. A damaged one (a file lost, or of another size) or one made for
    another run is moved to `<dest>.damaged-<unix time>` (kept: it may be all there
    is) and None returned, so that it is retrieved again. `manifest.json` is read
    once.

    Raises:
        StoredArtifactsInvalid: when `manifest.json` cannot be read.
        OSError: when a damaged copy cannot be moved aside.
    """
    started = time.monotonic()
    dest = Path(dest)
    stored = read_manifest(dest)
    if stored is None:
        return None
    try:
        foreign = _foreign(dest, stored, run_id)
        if foreign is not None:
            raise StoredArtifactsInvalid(dest, foreign)
        _check_files(dest, stored.files)
    except StoredArtifactsInvalid as error:
        aside = dest.with_name(f"{dest.name}.damaged-{int(time.time())}")
        log.warning("%s is damaged (%s): moved to %s", dest, error, aside)
        dest.rename(aside)
        return None
    return Retrieved.of(dest, stored, started, reused=True)
