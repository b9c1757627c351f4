"""The workers' error tree: failures of the tasks themselves, rooted in
[`WorkerError`], a `RunwardenError` (the whole tree is drawn in `schemas.errors`).
The run store's errors (`StoreError`, `NotFound`, ...) are `schemas.errors.RunError`s,
shared with producers; executors keep their own subtree (`workers.executors.errors`).

    WorkerError
    ├── LaunchError               a launch could not be carried out
    │   ├── SecretMissing         a secret the launch names is not set (name only)
    │   └── NotAllowed            a secret or an upload its target does not allow
    ├── ProducerNotAllowed        a producer its target does not allow
    └── RetrievalError            artifacts could not be retrieved or checked;
        │                         `retryable` says whether trying again may help
        ├── ArtifactMismatch      the download and the target's manifest disagree
        ├── ArtifactQuotaExceeded a quota or the disk reserve of the artifact store
        │                         would be passed
        └── StoredArtifactsInvalid  a stored retrieval is missing or damaged
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Final

from schemas import RunwardenError
from schemas.protocol import SECRET_ENV_PREFIX

__all__ = [
    "ArtifactMismatch",
    "ArtifactQuotaExceeded",
    "LaunchError",
    "NotAllowed",
    "ProducerNotAllowed",
    "RetrievalError",
    "SecretMissing",
    "SecretUnusable",
    "StoredArtifactsInvalid",
    "WorkerError",
]

MAX_LISTED: Final = 30
"""Paths an error message names at most (the error's attributes hold them all)."""


class WorkerError(RunwardenError):
    """Root of every error of the workers' tasks."""


class LaunchError(WorkerError):
    """A launch could not be carried out; nothing is left running."""


class SecretMissing(LaunchError):
    """A secret the launch names has no value on the worker (no file of that name in
    the secrets directory); names it, never a value."""

    def __init__(self, name: str, where: Path | str | None = None) -> None:
        self.name = name
        self.where = None if where is None else str(where)
        place = f"in {where}" if where is not None else "on the worker"
        super().__init__(
            f"secret {name} is not set {place}: put it in the file {name} of the worker's "
            f"secrets directory (or, with RUNWARDEN_SECRETS_FROM_ENV, in {SECRET_ENV_PREFIX}{name})"
        )


class SecretUnusable(LaunchError):
    """A secret's value cannot reach a job as it is (a line break or a NUL byte:
    `schemas.job.check_secret_value`); names the secret, never its value. Refused
    before anything is claimed."""

    def __init__(self, name: str) -> None:
        self.name = name
        super().__init__(
            f"secret {name} holds a line break or a NUL byte: no job can receive it as it "
            "is; write it on one line"
        )


class ProducerNotAllowed(WorkerError):
    """A message's producer may not act on the target of what it asks (the target
    names its producers, `TargetConfig.producers`, and not this one). Nothing was
    done."""

    def __init__(self, producer: str, target: str, what: str) -> None:
        self.producer = producer
        self.target = target
        self.what = what
        super().__init__(producer, target, what)

    def __str__(self) -> str:
        return f"{self.what}: producer {self.producer!r} may not act on target {self.target!r}"


class NotAllowed(LaunchError):
    """A launch asks for what its target does not allow: a secret not in its
    `allow_secrets`, an upload outside its `upload_roots`. Nothing was started."""


def listed(kind: str, paths: Sequence[str]) -> str:
    """`<n> <kind> ('a', 'b' and 3 more)`: at most [`MAX_LISTED`] paths named."""
    shown = ", ".join(repr(p) for p in paths[:MAX_LISTED])
    more = f" and {len(paths) - MAX_LISTED} more" if len(paths) > MAX_LISTED else ""
    return f"{len(paths)} {kind} ({shown}{more})"


class RetrievalError(WorkerError):
    """A retrieval failed; nothing was made visible at its destination. `retryable`
    says whether trying again may help: yes for a broken connection, an interrupted
    stream, a target that changed during the retrieval, a full disk here; no for a
    run directory that does not exist, a refused host key or login, a hostile
    archive, a destination this process may not write."""

    def __init__(self, message: str, *, retryable: bool) -> None:
        self.retryable = retryable
        super().__init__(message)


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
            listed(kind, paths)
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


class ArtifactQuotaExceeded(RetrievalError):
    """A retrieval would pass the per-run quota, the artifact store's quota or its
    free-space reserve (`workers.retrieval.quota`); the message names which, with the
    setting, and what to do. Not retryable: a person must act first."""

    def __init__(self, message: str) -> None:
        super().__init__(message, retryable=False)


class StoredArtifactsInvalid(RetrievalError):
    """A retrieval in the artifact store is not there (no `manifest.json`), cannot be
    read, or no longer matches its manifest (a listed file is missing or has another
    size). Not retryable as such: the store must be retrieved into again."""

    def __init__(self, dest: Path, message: str) -> None:
        self.dest = dest
        super().__init__(f"artifacts in {dest}: {message}", retryable=False)
