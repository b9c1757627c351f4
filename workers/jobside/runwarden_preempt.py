"""Preemption notices: signals turned into a pending ``preempted`` snapshot request.

STDLIB ONLY, shipped next to ``runwarden_job.py``, which uses it: a training loop
calls ``runwarden_job.install_preemption_signals()`` (the same function as here)
once, in the main thread, before training. It imports nothing of runwarden's.

Why: schedulers warn a job before they end it. Kubernetes sends SIGTERM to the pod,
then SIGKILL after ``terminationGracePeriodSeconds``; Slurm sends the signal of
``--signal=USR1@300`` before the time limit; a systemd shutdown sends SIGTERM. Saving
a checkpoint inside a signal handler fails in practice (the handler interrupts the
step at any bytecode, holding who knows what). Here the handler only records the
notice; the loop acts on it at its next step end, through the same path as a file
request: ``runwarden_job.snapshot_requested()`` then returns ``"preempted"``.

The contract:

- **Which signals.** Only those named: the argument, else ``$RUNWARDEN_PREEMPT_SIGNALS``
  (comma-separated names such as ``TERM,USR1``; ``SIG`` prefix and case optional;
  empty or blank: none), else ``TERM,USR1``. Only ``HUP``, ``TERM``, ``USR1``,
  ``USR2`` and ``XCPU`` may be named (notices schedulers send; all end a process by
  default); anything else, an empty item or an unknown name is a ``ValueError`` from
  :func:`install_preemption_signals`, before any handler changes. SIGINT is never
  touched: Ctrl-C still raises ``KeyboardInterrupt``.
- **The handler** does no I/O but one ``os.path.exists`` of the run directory's
  ``cancelling`` marker. Python runs a signal handler in the main thread between two
  bytecodes (never inside the C-level signal context), so that ``stat`` is safe; a
  main thread blocked in a long C call (a big matrix product, a collective) runs it
  when the call returns. Without the marker, the first signal records a
  :class:`Preemption` (which signal, ``time.time()`` and ``time.monotonic()``); any
  later one, of any installed kind, is ignored while that notice is pending: the job
  is already going to save and stop at its next step end. Only SIGKILL (or
  runwarden's cancel) ends a job whose loop never reaches a step end.
- **runwarden's own cancel still ends the job.** Cancel writes ``cancelling`` in the
  run directory before it signals the job's process group. A signal that finds that
  marker restores the disposition the signal had before :func:`install_preemption_signals`
  (normally the default action, which ends the process) and delivers the signal
  again to this process: the job ends exactly as it would have without the handler
  (a signal that was ignored before stays ignored; cancel then SIGKILLs after its
  10 s).
- **Threads.** Python only lets the main thread set signal handlers:
  :func:`install_preemption_signals` and :func:`restore_preemption_signals` raise
  ``RuntimeError`` elsewhere (nothing is installed then; a restore with nothing
  installed does nothing anywhere). The notice itself is process-wide: any thread
  may read it.
- **Children.** A process forked without ``exec`` after the install (a DataLoader or
  multiprocessing worker) inherits the handler: a signal sent to the whole process
  group (systemd, Slurm) does not kill it in the middle of a batch, so the main
  process can finish its step and save, then shut its workers down as usual.
  runwarden's cancel still ends them. ``exec`` (a subprocess) resets the handler.
- The run directory (where ``cancelling`` is looked for) is fixed at install: the
  directory of ``$RUNWARDEN_SNAPSHOT_REQUEST`` when set, else the current directory.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable, Sequence
from types import FrameType
from typing import Final, NamedTuple, TypeAlias

__all__ = [
    "ALLOWED_SIGNALS",
    "DEFAULT_PREEMPT_SIGNALS",
    "PREEMPT_SIGNALS_ENV",
    "Preemption",
    "clear_preemption",
    "install_preemption_signals",
    "installed_signals",
    "parse_signals",
    "preemption_notice",
    "restore_preemption_signals",
]

PREEMPT_SIGNALS_ENV: Final = "RUNWARDEN_PREEMPT_SIGNALS"
"""Environment variable naming the signals installed by default (``TERM,USR1``)."""
DEFAULT_PREEMPT_SIGNALS: Final = "TERM,USR1"
"""The signals installed when neither the argument nor the variable names any."""
ALLOWED_SIGNALS: Final[tuple[str, ...]] = ("HUP", "TERM", "USR1", "USR2", "XCPU")
"""The signals that may be turned into a notice, without their ``SIG`` prefix."""

# Repeated from runwarden_job / schemas.protocol (this file imports neither); a test
# checks they agree.
_REQUEST_ENV: Final = "RUNWARDEN_SNAPSHOT_REQUEST"
_CANCELLING_FILE: Final = "cancelling"

_Handler: TypeAlias = Callable[[int, FrameType | None], object] | int | signal.Handlers | None


class Preemption(NamedTuple):
    """A preemption notice: the first installed signal received while none was
    pending."""

    signal: str
    """Its name, e.g. ``"SIGTERM"``."""
    number: int
    """Its number."""
    time: float
    """When it was handled, unix seconds (``time.time()``)."""
    monotonic: float
    """When it was handled, ``time.monotonic()`` seconds (for durations)."""


_notice: Preemption | None = None
_previous: dict[int, _Handler] = {}
"""Signal number -> the disposition it had before this module's handler."""
_cancel_marker: str | None = None


def _resolve(item: object, source: str) -> signal.Signals:
    """``item`` (a name such as ``"TERM"``/``"sigusr1"``, or a number) as an allowed
    signal; else ``ValueError`` naming ``source``."""
    allowed = ", ".join(ALLOWED_SIGNALS)
    if isinstance(item, bool) or not isinstance(item, (str, int)):
        raise ValueError(f"{source}: {item!r} is not a signal name (use {allowed})")
    try:
        if isinstance(item, int):
            found = signal.Signals(item)
        else:
            name = item.strip().upper()
            found = signal.Signals[name if name.startswith("SIG") else f"SIG{name}"]
    except (KeyError, ValueError):
        raise ValueError(f"{source}: unknown signal {item!r} (use {allowed})") from None
    if found.name.removeprefix("SIG") not in ALLOWED_SIGNALS:
        raise ValueError(f"{source}: {found.name} cannot be a preemption notice (use {allowed})")
    return found


def parse_signals(text: str, *, source: str = PREEMPT_SIGNALS_ENV) -> tuple[signal.Signals, ...]:
    """The signals ``text`` names, comma-separated (``"TERM, usr1"``), in order and
    without repeats; empty or blank ``text`` names none.

    Raises:
        ValueError: an item is empty, unknown or not in :data:`ALLOWED_SIGNALS`; the
            message starts with ``source`` and quotes the item.
    """
    if not text.strip():
        return ()
    found: dict[signal.Signals, None] = {}
    for item in text.split(","):
        if not item.strip():
            raise ValueError(f"{source}: an empty signal name in {text!r}")
        found[_resolve(item, source)] = None
    return tuple(found)


def _chosen(signals: str | Sequence[str | int] | None) -> tuple[signal.Signals, ...]:
    if signals is None:
        configured = os.environ.get(PREEMPT_SIGNALS_ENV)
        return parse_signals(DEFAULT_PREEMPT_SIGNALS if configured is None else configured)
    if isinstance(signals, str):
        return parse_signals(signals, source="signals")
    return tuple(dict.fromkeys(_resolve(item, "signals") for item in signals))


def _require_main_thread(what: str) -> None:
    if threading.current_thread() is not threading.main_thread():
        raise RuntimeError(
            f"{what} must be called from the main thread: Python lets no other thread "
            f"set signal handlers"
        )


def _run_directory() -> str:
    configured = os.environ.get(_REQUEST_ENV)
    if configured:
        return os.path.dirname(os.path.abspath(configured))
    return os.getcwd()


def _handle(signum: int, frame: FrameType | None) -> None:
    """The installed handler: see the module docstring. Runs in the main thread."""
    global _notice  # noqa: PLW0603 - the notice is process-wide by design
    marker = _cancel_marker
    # The one I/O allowed here: a stat. runwarden's cancel wrote the marker before
    # signalling, so its SIGTERM must end the job as if there were no handler.
    if marker is not None and os.path.exists(marker):
        _pass_on(signum)
        return
    if _notice is None:
        _notice = Preemption(signal.Signals(signum).name, signum, time.time(), time.monotonic())


def _pass_on(signum: int) -> None:
    """Gives ``signum`` back its earlier disposition and raises it again: the default
    action ends the process here, a Python handler runs now, an ignored signal stays
    ignored."""
    previous = _previous.pop(signum, signal.SIG_DFL)
    signal.signal(signum, previous if previous is not None else signal.SIG_DFL)
    signal.raise_signal(signum)


def install_preemption_signals(
    signals: str | Sequence[str | int] | None = None,
) -> tuple[signal.Signals, ...]:
    """Turns ``signals`` (default: ``$RUNWARDEN_PREEMPT_SIGNALS``, else ``TERM,USR1``)
    into preemption notices (see the module docstring) and returns the signals now
    handled, in order (empty when none is named). A string is parsed like the
    variable; a sequence holds names or numbers.

    Idempotent: handlers this module installed before are first restored, so the
    disposition restored later is always the one from before the first install. A
    pending notice is kept (see :func:`clear_preemption`).

    Raises:
        ValueError: a signal is empty, unknown, or not one of :data:`ALLOWED_SIGNALS`
            (nothing changed).
        RuntimeError: not called from the main thread (nothing changed).
    """
    chosen = _chosen(signals)
    _require_main_thread("install_preemption_signals")
    marker = os.path.join(_run_directory(), _CANCELLING_FILE)
    restore_preemption_signals()
    global _cancel_marker  # noqa: PLW0603 - read by the handler
    _cancel_marker = marker
    try:
        for sig in chosen:
            _previous[sig] = signal.signal(sig, _handle)
    except BaseException:
        restore_preemption_signals()
        raise
    return chosen


def restore_preemption_signals() -> tuple[signal.Signals, ...]:
    """Gives every signal this module handles back the disposition it had before
    :func:`install_preemption_signals`, and returns those restored. A signal whose
    handler was replaced since by someone else keeps that handler. A pending notice
    is kept. Does nothing when nothing is installed.

    Raises:
        RuntimeError: something is installed and this is not the main thread.
    """
    if not _previous:
        return ()
    _require_main_thread("restore_preemption_signals")
    restored: list[signal.Signals] = []
    for signum, previous in list(_previous.items()):
        if signal.getsignal(signum) is _handle:
            signal.signal(signum, previous if previous is not None else signal.SIG_DFL)
            restored.append(signal.Signals(signum))
        del _previous[signum]
    return tuple(restored)


def installed_signals() -> tuple[signal.Signals, ...]:
    """The signals this module's handler is installed for now."""
    return tuple(signal.Signals(s) for s in _previous if signal.getsignal(s) is _handle)


def preemption_notice() -> Preemption | None:
    """The pending notice, or ``None``. Cheap (one global read): call it at every
    step."""
    return _notice


def clear_preemption() -> None:
    """Forgets the pending notice: the next installed signal records a new one. For a
    loop that handled a notice and goes on, and for tests."""
    global _notice  # noqa: PLW0603 - the notice is process-wide by design
    _notice = None
