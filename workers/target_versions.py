"""The highest version of each target's record a worker machine has seen, kept outside
Redis (`<state_dir>/target-versions.json`), so that a target record written back into
Redis (one the operator has since replaced, or one put in place of its tombstone) is
refused: versions only grow (`schemas.target_sig.next_version`).

Shared by every worker process of the machine (one state directory): each update
takes an exclusive `flock` on the file, reads it, keeps the larger version of each
target and replaces it atomically (a temporary file, `fsync`, rename), so no process
ever lowers what another raised. A file that cannot be read (missing, damaged) holds
nothing: the first record seen after is the floor again, which `doctor` cannot tell;
the file is the machine's memory of the operator's changes and is kept with its state.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from pathlib import Path
from typing import Final

from schemas.auth import Unauthenticated

__all__ = ["VERSIONS_FILE", "TargetVersions"]

VERSIONS_FILE: Final = "target-versions.json"
_MAX_BYTES: Final = 4 * 1024 * 1024


class TargetVersions:
    """The highest record version seen per target name, in `state_dir`."""

    def __init__(self, state_dir: Path) -> None:
        self.path = state_dir.expanduser() / VERSIONS_FILE

    def _read(self) -> dict[str, int]:
        try:
            with open(self.path, "rb") as file:
                data = json.loads(file.read(_MAX_BYTES + 1)[:_MAX_BYTES] or b"{}")
        except (OSError, ValueError):
            return {}
        if not isinstance(data, dict):
            return {}
        return {
            str(k): v for k, v in data.items() if isinstance(v, int) and not isinstance(v, bool)
        }

    def check(self, name: str, version: int) -> None:
        """Checks that target `name`'s record at `version` (its signature checked) is
        no older than the highest version seen on this machine, and records it when
        newer. One read of the file when nothing changed.

        Raises:
            Unauthenticated: older than a version seen (a record written back into
                Redis), or the versions seen cannot be recorded.
        """
        seen = self.seen(name)
        if version > seen:
            seen = self.raise_to(name, version)
        if version < seen:
            raise Unauthenticated(
                f"target {name!r}: its record is version {version}, older than version "
                f"{seen} this machine saw: a record written back is refused (the operator "
                "adds the target again to replace it)"
            )

    def seen(self, name: str) -> int:
        """The highest version of target `name` seen on this machine; 0 for none."""
        return self._read().get(name, 0)

    def raise_to(self, name: str, version: int) -> int:
        """Records that target `name`'s record at `version` was seen, unless a higher
        version was; returns the highest now recorded (larger than `version`: the
        record seen is older than one seen before).

        Raises:
            Unauthenticated: the state directory cannot be written (the record is
                not used: a worker that cannot remember a version must not trust one).
        """
        try:
            self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            with open(self.path.with_suffix(".lock"), "a") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX)
                found = self._read()
                highest = max(found.get(name, 0), version)
                if highest != found.get(name):
                    found[name] = highest
                    self._write(found)
                return highest
        except OSError as error:
            raise Unauthenticated(
                f"target {name!r} cannot be used: the versions seen cannot be recorded in "
                f"{self.path} ({error.strerror or error})"
            ) from error

    def _write(self, versions: dict[str, int]) -> None:
        temporary = self.path.with_name(f"{self.path.name}.{os.getpid()}.tmp")
        try:
            with open(temporary, "w") as file:
                json.dump(versions, file, sort_keys=True)
                file.flush()
                os.fsync(file.fileno())
            os.replace(temporary, self.path)
        finally:
            with contextlib.suppress(FileNotFoundError):
                temporary.unlink()
