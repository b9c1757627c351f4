"""The executor error tree: every failure to run or reach a job is an [`ExecError`], a
`RunwardenError` (the whole tree: `schemas.errors`).

Library errors (OSError, subprocess, paramiko) are translated into these with
`raise ... from`, so a caller catches one root and still sees the cause.

    ExecError
    ├── IoError          a local file or directory could not be read or written
    ├── SpawnError       a local program could not be started or waited for
    ├── CommandError     a command on the target failed (action, message)
    ├── SshError         the SSH connection failed or broke (kind)
    ├── InvalidSecret    a secret cannot be passed to the job (names the variable only)
    ├── InvalidArgument  an argument cannot be used (bad path, pattern, owner)
    └── ProtocolError    the target answered something unexpected
        └── UnsafeArchive  a downloaded archive member would land outside the destination
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from schemas import RunwardenError

__all__ = [
    "CommandError",
    "ExecError",
    "InvalidArgument",
    "InvalidSecret",
    "IoError",
    "ProtocolError",
    "ScriptTimeout",
    "SpawnError",
    "SshError",
    "SshErrorKind",
    "UnsafeArchive",
]


class ExecError(RunwardenError):
    """Root of every executor error."""


class IoError(ExecError):
    """A local file or directory could not be read or written."""

    def __init__(self, path: Path | str, cause: OSError) -> None:
        self.path = Path(path)
        self.cause = cause
        super().__init__(f"cannot access {self.path}: {cause.strerror or cause}")


class SpawnError(ExecError):
    """A local program could not be started or waited for."""

    def __init__(self, program: str, cause: OSError) -> None:
        self.program = program
        self.cause = cause
        super().__init__(f"cannot run `{program}`: {cause.strerror or cause}")


class CommandError(ExecError):
    """A command on the target failed. `message` is the command's error output (one
    bounded line), or its exit status; it never holds a secret, since secrets only
    travel on standard input."""

    def __init__(self, action: str, message: str) -> None:
        self.action = action
        self.message = message
        super().__init__(f"{action} failed: {message}")


class ScriptTimeout(CommandError):
    """A script did not end within its deadline, `timeout_s` seconds: a local one was
    killed (its whole session), a remote one's shell or channel closed (the script
    left to end by itself there). Its transport told its listener first
    (`Transport.on_timeout`)."""

    def __init__(self, action: str, timeout_s: float | None) -> None:
        self.timeout_s = timeout_s
        super().__init__(action, f"timed out after {timeout_s:g} s" if timeout_s else "timed out")


SshErrorKind = Literal["connect", "host_key", "auth", "disconnected", "terminated"]


class SshError(ExecError):
    """The SSH connection failed or broke; `kind` tells how."""

    def __init__(self, kind: SshErrorKind, message: str) -> None:
        self.kind: SshErrorKind = kind
        self.message = message
        super().__init__(f"ssh failed ({kind}): {message}")


class InvalidSecret(ExecError):
    """A secret cannot be passed to the job: its name is not an environment variable
    name, or its value holds a line break or a NUL byte. Names the variable only."""

    def __init__(self, name: str) -> None:
        self.name = name
        super().__init__(f"{name[:80]} cannot be passed to the job")


class InvalidArgument(ExecError):
    """An argument cannot be used: a path that is not absolute or would leave its
    directory, an exclude pattern with unsupported syntax, a multi-line owner. Nothing
    was done on the target."""


class ProtocolError(ExecError):
    """The target answered something unexpected."""

    def __init__(self, message: str) -> None:
        super().__init__(f"unexpected answer from the target: {message}")


class UnsafeArchive(ProtocolError):
    """A downloaded archive held a member the destination must not receive: an
    absolute name, a `..` component, a link leading outside it. Refused at that
    member; nothing was written outside the destination. Never the target's own
    scripts (they only archive relative names): a hostile or broken target."""
