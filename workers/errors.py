"""The workers' error tree: failures of the tasks themselves, rooted in
[`WorkerError`]. The run store's errors (`StoreError`, `NotFound`, ...) are
`schemas.errors.RunError`s, shared with producers; executors keep their own tree
(`workers.executors.errors`).

    WorkerError
    ├── LaunchError     a launch could not be carried out (a message for a person)
    ├── SecretMissing   a secret a launch names is not set on the worker (name only)
    └── RetrievalError  artifacts could not be retrieved or checked; says whether a
                        retry may help (`workers.retrieval`, with its subclasses)
"""

from __future__ import annotations

__all__ = ["LaunchError", "SecretMissing", "WorkerError"]


class WorkerError(Exception):
    """Root of every error of the workers' tasks."""


class LaunchError(WorkerError):
    """A launch could not be carried out; nothing is left running."""


class SecretMissing(LaunchError):
    """A secret the launch names is not set on the worker as `RUNWARDEN_SECRET_<NAME>`;
    names the variable, never a value."""

    def __init__(self, name: str) -> None:
        self.name = name
        super().__init__(
            f"secret {name} is not set on the worker: set RUNWARDEN_SECRET_{name} in its "
            "environment"
        )
