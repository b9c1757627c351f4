"""Executors: carry out actions in run directories on a target (this machine, or a
remote one over SSH), with the on-target protocol (docs/protocol.md).

This package's exports are the executors' public face: code outside
`workers/executors/` imports from here, never from its modules.
"""

from __future__ import annotations

import typing

from schemas.protocol import FILTERED_ENV_PREFIXES

from .base import Executor
from .digest import Charge, FileDigest, glob_match, parse_manifest, sha256_file
from .errors import (
    CommandError,
    ExecError,
    InvalidArgument,
    InvalidSecret,
    IoError,
    ProtocolError,
    ScriptTimeout,
    SpawnError,
    SshError,
    UnsafeArchive,
)
from .lines import LineStream, complete_lines
from .local import LocalExecutor, job_environment
from .localtree import local_manifest
from .marked import find_marked_job
from .notices import Notice, NoticeState, parse_notice, parse_notice_state
from .runas import RunAsExecutor, run_as_environment
from .safetree import Downloaded, Link
from .scripts import FOLLOW_TIMEOUT_S, FollowEntry, FollowUpdate, parse_status, quote
from .shell import CANCEL_DEADLINE_S, CONTAINER_STOP_S, ScriptExecutor, cancel_deadline_s
from .transport import Completed, LocalTransport, Transport

if typing.TYPE_CHECKING:
    from .ssh import SshExecutor

_LAZY = ("SshExecutor",)
"""Public names bound on first use (`__getattr__`)."""


def __getattr__(name: str) -> typing.Any:
    # The SSH executor imports paramiko (0.13 s of CPU): only a process that reaches an
    # SSH target pays for it.
    if name == "SshExecutor":
        from .ssh import SshExecutor  # noqa: PLC0415

        return SshExecutor
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "CANCEL_DEADLINE_S",
    "CONTAINER_STOP_S",
    "FILTERED_ENV_PREFIXES",
    "FOLLOW_TIMEOUT_S",
    "Charge",
    "CommandError",
    "Completed",
    "Downloaded",
    "ExecError",
    "Executor",
    "FileDigest",
    "FollowEntry",
    "FollowUpdate",
    "InvalidArgument",
    "InvalidSecret",
    "IoError",
    "LineStream",
    "Link",
    "LocalExecutor",
    "LocalTransport",
    "Notice",
    "NoticeState",
    "ProtocolError",
    "RunAsExecutor",
    "ScriptExecutor",
    "ScriptTimeout",
    "SpawnError",
    "SshError",
    "SshExecutor",
    "Transport",
    "UnsafeArchive",
    "cancel_deadline_s",
    "complete_lines",
    "find_marked_job",
    "glob_match",
    "job_environment",
    "local_manifest",
    "parse_manifest",
    "parse_notice",
    "parse_notice_state",
    "parse_status",
    "quote",
    "run_as_environment",
    "sha256_file",
]
