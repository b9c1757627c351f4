"""Executors: carry out actions in run directories on a target (this machine, or a
remote one over SSH), with the on-target protocol of DESIGN.md §2."""

from __future__ import annotations

from .base import Executor
from .digest import FileDigest, glob_match, local_manifest, parse_manifest, sha256_file
from .errors import (
    CommandError,
    ExecError,
    InvalidArgument,
    InvalidSecret,
    IoError,
    ProtocolError,
    SpawnError,
    SshError,
)
from .lines import LineStream, complete_lines
from .local import FILTERED_ENV_PREFIXES, LocalExecutor, job_environment
from .scripts import parse_status, quote
from .shell import ScriptExecutor
from .transport import Completed, LocalTransport, Transport

__all__ = [
    "FILTERED_ENV_PREFIXES",
    "CommandError",
    "Completed",
    "ExecError",
    "Executor",
    "FileDigest",
    "InvalidArgument",
    "InvalidSecret",
    "IoError",
    "LineStream",
    "LocalExecutor",
    "LocalTransport",
    "ProtocolError",
    "ScriptExecutor",
    "SpawnError",
    "SshError",
    "Transport",
    "complete_lines",
    "glob_match",
    "job_environment",
    "local_manifest",
    "parse_manifest",
    "parse_status",
    "quote",
    "sha256_file",
]
