"""The job side of runwarden: what a training loop needs to be stopped gracefully.

STDLIB ONLY. Launch copies this file into the run directory and puts it on the job's
``PYTHONPATH``; it must import nothing but the standard library, so that any job,
in any environment, can ``import runwarden_job``.

The contract with runwarden (and with overbrainer, whose file names are kept):

- **Request.** Anyone who wants the job to stop with a checkpoint writes
  ``snapshot.request`` in the run directory, holding the reason (``requested``,
  ``deadline``, ``cost``, ``disk`` or ``preempted``). launch sets
  ``RUNWARDEN_SNAPSHOT_REQUEST`` to its absolute path. The job calls
  :func:`snapshot_requested` at the end of every step; an empty or missing file is
  no request, and any other content is a request (unknown text reads as
  ``requested``, so a newer reason is still a request to an older reader).
- **Preemption signals (opt-in).** After :func:`install_preemption_signals` (default
  ``$RUNWARDEN_PREEMPT_SIGNALS``, else ``TERM,USR1``) such a signal is a request too:
  its handler only records it; the next :func:`snapshot_requested` returns
  ``preempted`` (a file request's reason wins) and writes it to ``snapshot.request``
  when none exists. runwarden's own cancel (``cancelling`` written first) still ends
  the job at once. The contract: ``runwarden_preempt.py``, shipped next to this file.
- **Checkpoint, then proof.** On a request the job saves its checkpoint to
  ``output/checkpoint-<step>`` in the run directory, and only then calls
  :func:`write_proof`, which refuses to run before that directory exists. The proof,
  ``snapshot.json``, is replaced atomically (temp file, fsync, rename, directory
  fsync): a reader sees no file or a complete proof, never a part of one, and a
  proof that is seen names a checkpoint that exists. Then the job ends; if it does
  not end in time, runwarden cancels it.
- **Metrics.** :class:`Metrics` (``runwarden_metrics.py``, shipped next to this
  file) appends one JSON object a line to the file named by ``RUNWARDEN_METRICS``:
  ``begin`` (``max_steps``), ``log`` (``step`` and values such as ``loss``),
  ``save`` (``step``, ``seconds``: how long a checkpoint save took, and
  ``step_seconds``: how long a step takes), ``end`` (``step``). Every line is one
  ``write`` on an ``O_APPEND`` descriptor, so lines of concurrent writers never
  interleave.
- **Save times.** runwarden learns how long this job's stops may wait for a proof
  from how long its saves take: the stops it measures itself, and the ``save`` lines
  (:meth:`Metrics.save`, :meth:`Metrics.saving`). A job that reports its periodic
  saves is never cancelled for a save slower than the configured proof timeout
  once one such save was seen.

Everything here is safe to call from a job that was not launched by runwarden: the
request is then looked for in the current directory and metrics are not written.
"""

from __future__ import annotations

import contextlib
import errno
import importlib
import json
import os
import secrets
import signal
import sys
import time
from collections.abc import Sequence
from typing import Final, cast

__all__ = [
    "CANCELLING_FILE",
    "METRICS_ENV",
    "METRICS_FILE",
    "OUTPUT_DIR",
    "PREEMPTED",
    "RANK_REPORT_ENV",
    "REASONS",
    "REQUEST_ENV",
    "RESUME_ENV",
    "SNAPSHOT_FILE",
    "SNAPSHOT_REQUEST",
    "Metrics",
    "checkpoint_path",
    "install_preemption_signals",
    "parse_reason",
    "preemption_pending",
    "report_stop",
    "request_path",
    "request_snapshot",
    "restore_preemption_signals",
    "run_dir",
    "snapshot_requested",
    "write_proof",
]

# These names are the on-target protocol (schemas/protocol.py); they are repeated,
# not imported, because this file runs where `schemas` is not installed.
SNAPSHOT_REQUEST: Final = "snapshot.request"
"""The request file in the run directory; holds the reason."""
SNAPSHOT_FILE: Final = "snapshot.json"
"""The proof file in the run directory, written by :func:`write_proof`."""
OUTPUT_DIR: Final = "output"
"""Where checkpoints are saved, relative to the run directory."""
METRICS_FILE: Final = "metrics.jsonl"
"""The metrics file in the run directory, appended by :class:`Metrics`."""
CANCELLING_FILE: Final = "cancelling"
"""Written in the run directory by runwarden's cancel before it signals the job."""

REQUEST_ENV: Final = "RUNWARDEN_SNAPSHOT_REQUEST"
"""Environment variable holding the absolute path of ``snapshot.request``."""
METRICS_ENV: Final = "RUNWARDEN_METRICS"
"""Environment variable holding the absolute path of ``metrics.jsonl``."""
RESUME_ENV: Final = "RUNWARDEN_RESUME_FROM"
"""Environment variable naming a checkpoint directory to resume from, when set."""
RANK_REPORT_ENV: Final = "RUNWARDEN_RANK_REPORT"
"""Environment variable naming a directory where every rank reports the step it
stopped at (:func:`report_stop`): set by ``runwarden check-trainer`` only."""

REASONS: Final[tuple[str, ...]] = ("requested", "deadline", "cost", "disk", "preempted")
"""Every reason a request or a proof may hold; the first is the default."""
PREEMPTED: Final = "preempted"
"""The reason of a request made by a preemption signal."""

_DEFAULT_REASON: Final = REASONS[0]
_REQUEST_LIMIT: Final = 4 * 1024
_STEP_MAX: Final = 2**64 - 1
# The signal half of the job side, shipped next to this file: a sibling in this
# package when imported as part of one, else a top-level module on PYTHONPATH.
_PREEMPT_MODULE: Final = f"{__package__}.runwarden_preempt" if __package__ else "runwarden_preempt"
# The metrics half, shipped next to this file the same way.
_METRICS_MODULE: Final = f"{__package__}.runwarden_metrics" if __package__ else "runwarden_metrics"

Metrics = importlib.import_module(_METRICS_MODULE).Metrics
"""Appends metrics lines (``begin``, ``log``, ``save``, ``end``): the class of
``runwarden_metrics.py``, shipped next to this file."""


def request_path() -> str:
    """The absolute path of the request file: ``$RUNWARDEN_SNAPSHOT_REQUEST`` when set
    and not empty, else ``snapshot.request`` in the current directory. Never raises
    except when the current directory no longer exists (``OSError``)."""
    configured = os.environ.get(REQUEST_ENV)
    if configured:
        return os.path.abspath(configured)
    return os.path.join(os.getcwd(), SNAPSHOT_REQUEST)


def run_dir() -> str:
    """The absolute path of the run directory: the directory of
    ``$RUNWARDEN_SNAPSHOT_REQUEST`` when set and not empty, else the current
    directory (a job launched by runwarden starts there). Raises ``OSError`` only when
    the current directory no longer exists and is needed."""
    return os.path.dirname(request_path())


def parse_reason(text: str | bytes | None) -> str:
    """The reason ``text`` names, surrounding whitespace ignored; anything else,
    including empty text, undecodable bytes or ``None``, is ``"requested"``. Never
    raises: a request is written by anyone, and any request is a request. The result
    is always one of :data:`REASONS`."""
    if isinstance(text, bytes):
        text = text.decode("utf-8", "replace")
    name = (text or "").strip()
    return name if name in REASONS else _DEFAULT_REASON


def _read_request(target: str) -> str | None:
    """The reason of the request file ``target``, or ``None`` (see
    :func:`snapshot_requested`). Never raises ``OSError``."""
    try:
        # O_NONBLOCK: a FIFO put in place of the file must not stall training.
        fd = os.open(target, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError:
        return None
    try:
        content = os.read(fd, _REQUEST_LIMIT)
    except OSError:
        return None
    finally:
        os.close(fd)
    # Only zero bytes is no request (overbrainer tests `is_empty`); whitespace is one.
    if not content:
        return None
    return parse_reason(content)


def snapshot_requested(*, path: str | None = None) -> str | None:
    """Whether a snapshot is requested, and why: the reason the request file
    (``path``, default :func:`request_path`) holds, one of :data:`REASONS` (see
    :func:`parse_reason`); else ``"preempted"`` when a preemption signal is pending
    (:func:`preemption_pending`); else ``None``.

    Meant to be called at every step: without a pending signal it costs one ``open``
    and one ``read`` of at most 4 KiB, with no ``stat`` beforehand, so a file that
    appears or vanishes between calls cannot make it fail. Never raises ``OSError``:
    a file that is missing, empty, a directory, unreadable (permissions) or otherwise
    broken is no request. A FIFO in its place does not block (opened non-blocking).

    With a signal pending and no file request, it also makes the request visible to
    runwarden, at the step boundary and not in the signal handler: it writes the
    file holding ``preempted`` when none exists (:func:`request_snapshot`; a failure
    is ignored). A request that appears meanwhile wins: the first reason is kept."""
    target = path if path is not None else request_path()
    reason = _read_request(target)
    if reason is not None or not preemption_pending():
        return reason
    return request_snapshot(PREEMPTED, path=target) or PREEMPTED


def request_snapshot(reason: str, *, path: str | None = None) -> str | None:
    """Asks for a snapshot for ``reason`` unless one is asked already: creates the
    request file (``path``, default :func:`request_path`) holding ``reason`` only when
    no file is there, and returns the reason the file holds afterwards (``reason``, or
    the earlier request's), or ``None`` when it holds no request (it could not be
    written, or an empty file is in the way).

    An existing file is never replaced: the reason is written to a complete temp file
    unique to this writer (pid and random) in the same directory, then hard-linked
    into place, which fails when a file exists (as runwarden's on-target watchdog
    does). Only where hard links are not supported and still no file exists is the
    temp file renamed into place (a request written in that instant may be lost). The
    file is not fsynced: the proof is what must survive a crash.

    Raises:
        ValueError: ``reason`` is not one of :data:`REASONS`. Never ``OSError``.
    """
    if not isinstance(reason, str) or reason not in REASONS:
        raise ValueError(f"reason must be one of {', '.join(REASONS)}, not {reason!r}")
    try:
        target = os.path.abspath(path if path is not None else request_path())
    except OSError:
        return None
    directory, name = os.path.split(target)
    temp = os.path.join(directory, f".{name}.{os.getpid()}.{secrets.token_hex(8)}.tmp")
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(temp, flags, 0o644)
    except OSError:
        return _read_request(target)
    try:
        try:
            _write_all(fd, reason.encode("ascii"))
        finally:
            os.close(fd)
        try:
            os.link(temp, target)
        except FileExistsError:
            pass  # asked first by someone else: that reason stays
        except OSError:
            if not os.path.lexists(target):
                os.rename(temp, target)
    except OSError:
        pass  # no request written; the caller still knows its own reason
    finally:
        with contextlib.suppress(OSError):
            os.unlink(temp)
    return _read_request(target)


def preemption_pending() -> bool:
    """Whether a preemption signal was received (and not cleared) since
    :func:`install_preemption_signals`. Cheap, never imports ``runwarden_preempt``
    (no handler exists before it is loaded): call it at every step."""
    module = sys.modules.get(_PREEMPT_MODULE)
    return module is not None and module.preemption_notice() is not None


def install_preemption_signals(
    signals: str | Sequence[str | int] | None = None,
) -> tuple[signal.Signals, ...]:
    """Turns ``signals`` (default ``$RUNWARDEN_PREEMPT_SIGNALS``, comma-separated names
    such as ``TERM,USR1``; ``TERM,USR1`` when unset; empty: none) into preemption
    notices, and returns the signals handled: :func:`snapshot_requested` then returns
    ``preempted`` at the step end after one arrives. Call it once, in the main
    thread, before training; :func:`restore_preemption_signals` undoes it. The full
    contract (allowed signals, the ``cancelling`` marker, threads) is
    ``runwarden_preempt.install_preemption_signals``.

    Raises:
        ValueError: a signal is empty, unknown or not allowed (nothing changed).
        RuntimeError: not called from the main thread (nothing changed).
        ImportError: ``runwarden_preempt.py`` is not next to this file.
    """
    module = importlib.import_module(_PREEMPT_MODULE)
    return cast(tuple[signal.Signals, ...], module.install_preemption_signals(signals))


def restore_preemption_signals() -> tuple[signal.Signals, ...]:
    """Gives the signals :func:`install_preemption_signals` handles back their earlier
    dispositions; returns those restored (none when nothing was installed). A pending
    notice is kept.

    Raises:
        RuntimeError: something is installed and this is not the main thread.
    """
    module = sys.modules.get(_PREEMPT_MODULE)
    if module is None:
        return ()
    return cast(tuple[signal.Signals, ...], module.restore_preemption_signals())


def _check_step(step: object, name: str = "step") -> int:
    """``step`` when it is an ``int`` (not a ``bool``) in ``0 ..= 2**64 - 1``, the
    range a proof may hold; else ``ValueError``."""
    if isinstance(step, bool) or not isinstance(step, int):
        raise ValueError(f"{name} must be an int, not {type(step).__name__}")
    if not 0 <= step <= _STEP_MAX:
        raise ValueError(f"{name} must be between 0 and 2**64 - 1, not {step}")
    return step


def checkpoint_path(step: int) -> str:
    """The checkpoint a snapshot at ``step`` is saved to, relative to the run
    directory: ``output/checkpoint-<step>``, the only path a proof may name.

    Raises ``ValueError`` when ``step`` is not a non-negative ``int`` (a ``bool`` is
    refused) below 2**64."""
    return f"{OUTPUT_DIR}/checkpoint-{_check_step(step)}"


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


def _fsync_directory(directory: str) -> None:
    """Makes a rename in ``directory`` durable. Filesystems that cannot fsync a
    directory (``EINVAL``, ``ENOTSUP``, ``EBADF``, ``EACCES`` on some network mounts) are
    tolerated: the rename itself is already atomic for readers."""
    try:
        fd = os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError as error:
        tolerated = {errno.EINVAL, errno.EBADF, errno.EACCES, getattr(errno, "ENOTSUP", -1)}
        if error.errno not in tolerated:
            raise
    finally:
        os.close(fd)


def write_proof(step: int, reason: str, *, directory: str | None = None) -> str:
    """Writes the proof that a snapshot was saved at ``step`` for ``reason``:
    ``snapshot.json`` in ``directory`` (default :func:`run_dir`), holding
    ``{"checkpoint": "output/checkpoint-<step>", "step": step, "time": <unix seconds,
    float>, "reason": reason}``. Returns the absolute path of the proof.

    Call it only after the checkpoint is saved: a proof never precedes its
    checkpoint, so the checkpoint directory is required to exist.

    The file is replaced atomically: written to a temp file in the same directory
    with a name unique to this writer (pid and random), flushed and fsynced, renamed
    over ``snapshot.json``, and the directory fsynced. A reader sees no proof, the
    previous one, or this one, never a part. On failure the temp file is removed and
    any previous proof is left as it was.

    Raises:
        ValueError: ``step`` is not a non-negative ``int`` below 2**64 (a ``bool`` is
            refused), or ``reason`` is not one of :data:`REASONS`.
        FileNotFoundError: ``<directory>/output/checkpoint-<step>`` is not an existing
            directory.
        OSError: the proof cannot be written (the directory is missing, read-only,
            full, ...), or the directory fsync after the rename failed with an I/O
            error (the proof is then in place but may not survive a crash).
    """
    checkpoint = checkpoint_path(step)
    if not isinstance(reason, str) or reason not in REASONS:
        raise ValueError(f"reason must be one of {', '.join(REASONS)}, not {reason!r}")
    base = os.path.abspath(directory) if directory is not None else run_dir()
    checkpoint_dir = os.path.join(base, *checkpoint.split("/"))
    if not os.path.isdir(checkpoint_dir):
        raise FileNotFoundError(
            errno.ENOENT,
            f"no checkpoint directory for step {step}: save the checkpoint before "
            f"writing its proof",
            checkpoint_dir,
        )
    record = {"checkpoint": checkpoint, "step": step, "time": time.time(), "reason": reason}
    data = (json.dumps(record) + "\n").encode("utf-8")
    final = os.path.join(base, SNAPSHOT_FILE)
    temp = os.path.join(base, f".{SNAPSHOT_FILE}.{os.getpid()}.{secrets.token_hex(8)}.tmp")
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)
    fd = os.open(temp, flags, 0o644)
    try:
        try:
            _write_all(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(temp, final)
    except BaseException:
        # BaseException: a KeyboardInterrupt mid-write must not leave the temp file.
        with contextlib.suppress(OSError):
            os.unlink(temp)
        raise
    _fsync_directory(base)
    return final


def report_stop(step: int, reason: str, *, rank: int | None = None) -> str | None:
    """Tells ``runwarden check-trainer`` that this rank decided to stop after ``step``
    for ``reason``: writes ``rank-<rank>.json`` (``{"rank", "step", "reason", "time"}``,
    unix seconds) in the directory ``$RUNWARDEN_RANK_REPORT`` names, replaced atomically.
    ``rank`` defaults to ``$RANK`` (torchrun's global rank), else 0. The stop points
    (``runwarden_loop.StopPoint``, the Hugging Face and Lightning callbacks) call it on
    every rank; a loop of one's own calls it where each rank breaks out.

    Returns the report's path; ``None`` when the variable is unset or empty (a run of
    the service: nothing is written) or the report could not be written. Never raises
    ``OSError``: a report never stands in the way of a stop.

    Raises:
        ValueError: ``step`` is not a non-negative ``int`` below 2**64, or ``rank``
            (given or from ``$RANK``) is not a non-negative ``int``.
    """
    _check_step(step)
    directory = os.environ.get(RANK_REPORT_ENV)
    if not directory:
        return None
    if rank is None:
        text = os.environ.get("RANK", "0")
        rank = int(text) if text.isdigit() else -1
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 0:
        raise ValueError(f"rank must be an int >= 0, not {rank!r}")
    record = {"rank": rank, "step": step, "reason": str(reason), "time": time.time()}
    final = os.path.join(os.path.abspath(directory), f"rank-{rank}.json")
    temp = f"{final}.{os.getpid()}.{secrets.token_hex(4)}.tmp"
    try:
        with open(temp, "x", encoding="utf-8") as file:
            file.write(json.dumps(record) + "\n")
        os.replace(temp, final)
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(temp)
        return None
    return final
