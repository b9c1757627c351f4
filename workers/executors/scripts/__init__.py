"""The POSIX `sh` scripts of the on-target protocol, written once and run by every
executor (local and SSH), and the parsers of their answers.

The scripts are files (`workers/executors/sh/*.sh`, constant text, checked by
shellcheck); every value reaches one only as a positional argument ([`Script`]: paths,
owners, patterns, names, a job's command) or on its standard input (secrets, file
content), and a command line for a remote shell quotes each word ([`quote`]).
Scripts run under dash and busybox `sh`; they use only POSIX
utilities plus `setsid`, `head -c`, `find -print0`, `xargs -0` (and GNU `tar` and
`sha256sum -z` where a faster path exists, with a portable fallback for hashing).

    common   quoting, process-group signalling, pid checks
    status   status and cancel (the order of the protocol's status rules)
    files    claim, byte ranges, small files, archives, manifests, sizes
    launch   launcher, job wrapper, the job's shell, on-target watchdog
    follow   the batched follow tick
    proof    the rule for a proof's checkpoint (a real directory in the run directory)
    doctor   the doctor's probe of what a target has, and its clock reading
"""

from __future__ import annotations

from .common import CLOCK, GROUP_SIGNAL, Script, quote
from .files import (
    MANIFEST_OPENSSL_ABOVE,
    archive_script,
    check_exclude,
    check_owner,
    claim_script,
    manifest_script,
    parse_claim,
    parse_put_files,
    parse_size_answer,
    put_file_script,
    put_files_script,
    read_range_script,
    size_script,
    unpack_script,
)
from .follow import (
    FOLLOW_CHUNK_BYTES,
    FOLLOW_TIMEOUT_S,
    FollowEntry,
    FollowUpdate,
    follow_script,
    parse_follow,
)
from .launch import WATCHDOG_PID_FILE, launcher_script, watchdog_script, wrapper_script
from .proof import CHECKPOINT_TIMEOUT_S, checkpoint_script, parse_checkpoints
from .status import (
    CANCEL_KILL_WAIT_S,
    CANCEL_TERM_WAIT_S,
    cancel_script,
    leaders_script,
    parse_leaders,
    parse_status,
    parse_statuses,
    release_script,
    status_script,
)

__all__ = [
    "CANCEL_KILL_WAIT_S",
    "CANCEL_TERM_WAIT_S",
    "CHECKPOINT_TIMEOUT_S",
    "CLOCK",
    "FOLLOW_CHUNK_BYTES",
    "FOLLOW_TIMEOUT_S",
    "GROUP_SIGNAL",
    "MANIFEST_OPENSSL_ABOVE",
    "WATCHDOG_PID_FILE",
    "FollowEntry",
    "FollowUpdate",
    "Script",
    "archive_script",
    "cancel_script",
    "check_exclude",
    "check_owner",
    "checkpoint_script",
    "claim_script",
    "follow_script",
    "launcher_script",
    "leaders_script",
    "manifest_script",
    "parse_checkpoints",
    "parse_claim",
    "parse_follow",
    "parse_leaders",
    "parse_put_files",
    "parse_size_answer",
    "parse_status",
    "parse_statuses",
    "put_file_script",
    "put_files_script",
    "quote",
    "read_range_script",
    "release_script",
    "size_script",
    "status_script",
    "unpack_script",
    "watchdog_script",
    "wrapper_script",
]
