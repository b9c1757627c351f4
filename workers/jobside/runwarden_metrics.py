"""The metrics half of runwarden's job side: :class:`Metrics`, which appends the
lines of ``metrics.jsonl`` a follower reads (docs/protocol.md, "Metrics").

STDLIB ONLY, like ``runwarden_job.py``, which ships it and re-exports
:class:`Metrics`: a job uses ``runwarden_job.Metrics``.

Lines: ``begin`` (``max_steps``), ``log`` (``step`` and values such as ``loss``),
``save`` (``step``, ``seconds``: how long a checkpoint save took, and optionally
``step_seconds``: how long a step takes; runwarden learns how long this job's stops
may wait for a proof from them), ``end`` (``step``).
"""

from __future__ import annotations

import contextlib
import json
import math
import numbers
import os
import threading
import time
from collections.abc import Iterator
from types import TracebackType
from typing import Final

__all__ = ["METRICS_ENV", "Metrics"]

# Repeated from `runwarden_job` (which imports this module, never the reverse).
METRICS_ENV: Final = "RUNWARDEN_METRICS"
"""Environment variable holding the absolute path of ``metrics.jsonl``."""

_STEP_MAX: Final = 2**64 - 1
_RESERVED_KEYS: Final = frozenset({"event", "time"})


def _check_step(step: object, name: str = "step") -> int:
    """``step`` when it is an ``int`` (not a ``bool``) in ``0 ..= 2**64 - 1``; else
    ``ValueError``."""
    if isinstance(step, bool) or not isinstance(step, int):
        raise ValueError(f"{name} must be an int, not {type(step).__name__}")
    if not 0 <= step <= _STEP_MAX:
        raise ValueError(f"{name} must be between 0 and 2**64 - 1, not {step}")
    return step


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


def _duration(value: object, name: str = "seconds") -> float:
    """``value`` as a float when it is a finite real number >= 0 (not a ``bool``), else
    ``ValueError`` naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ValueError(f"{name} must be a number of seconds, not {type(value).__name__}")
    number = float(value)
    if not (math.isfinite(number) and number >= 0):
        raise ValueError(f"{name} must be a finite number >= 0, not {number!r}")
    return number


def _json_value(key: str, value: object) -> object:
    """``value`` as written to a metrics line: ``None``, ``bool``, ``str``, ``int`` or a
    finite ``float`` (NaN and infinities become ``None``). Numbers of other types
    (numpy scalars, ``Fraction``, ...) are converted through the ``numbers`` ABCs.
    Anything else raises ``TypeError`` naming ``key``."""
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        number = float(value)
        return number if math.isfinite(number) else None
    raise TypeError(
        f"metric {key!r} must be a number, a string, a bool or None, not {type(value).__name__}"
    )


class Metrics:
    """Appends metrics lines, one JSON object each, to ``path`` (default
    ``$RUNWARDEN_METRICS``). When neither is given, every method does nothing, so a
    trainer can always use one.

    Every record has ``"event"`` (``"begin"``, ``"log"``, ``"save"`` or ``"end"``) and
    ``"time"`` (unix seconds, float), then the event's own keys and the caller's values. A line
    is ASCII JSON with no raw newline, ends with ``"\\n"``, and is written with a
    single ``os.write`` on a descriptor opened ``O_APPEND | O_CREAT``: lines of
    concurrent writers (threads or processes) never interleave.

    Failure modes: opening the file raises ``OSError`` from the constructor (a
    misconfiguration, seen before training starts). Writing a line never raises
    ``OSError``: metrics must not kill a training whose disk is full; a line that
    cannot be written is lost, counted in :attr:`dropped`, and the error kept in
    :attr:`last_error`. Bad values raise ``TypeError``/``ValueError``. After
    :meth:`close`, writes are ignored.
    """

    def __init__(self, path: str | None = None) -> None:
        """Opens ``path``, else ``$RUNWARDEN_METRICS`` when set and not empty, for
        appending (created with mode 0o644 if missing). Raises ``OSError`` when it
        cannot be opened."""
        chosen = path if path is not None else (os.environ.get(METRICS_ENV) or None)
        self.path: str | None = os.path.abspath(chosen) if chosen is not None else None
        """The file written, or ``None`` when this object writes nothing."""
        self.dropped: int = 0
        """Lines that could not be written."""
        self.last_error: OSError | None = None
        """The error of the last line that could not be written."""
        self._lock = threading.Lock()
        self._fd: int | None = None
        if self.path is not None:
            flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | getattr(os, "O_CLOEXEC", 0)
            self._fd = os.open(self.path, flags, 0o644)

    @property
    def enabled(self) -> bool:
        """Whether lines are written: a file is open and not closed."""
        return self._fd is not None

    def begin(self, max_steps: int, **extra: object) -> None:
        """Records the start of training: ``{"event": "begin", "time": T, "max_steps":
        max_steps, **extra}``. Raises ``ValueError`` for a negative or non-int
        ``max_steps`` or a reserved key (``event``, ``time``), ``TypeError`` for a value
        that is not a JSON scalar."""
        self._emit("begin", {"max_steps": _check_step(max_steps, "max_steps")}, extra)

    def log(self, step: int, **values: object) -> None:
        """Records values at ``step`` (e.g. ``loss``, ``learning_rate``): ``{"event":
        "log", "time": T, "step": step, **values}``. NaN and infinities are written as
        ``null``. Raises like :meth:`begin`."""
        self._emit("log", {"step": _check_step(step)}, values)

    def save(
        self,
        step: int,
        seconds: float,
        *,
        step_seconds: float | None = None,
        **extra: object,
    ) -> None:
        """Records that a checkpoint was saved at ``step`` and took ``seconds``:
        ``{"event": "save", "time": T, "step": step, "seconds": seconds,
        "step_seconds": step_seconds, **extra}`` (``step_seconds`` only when given:
        how long one training step takes, since a request is read at a step's end).
        runwarden budgets this run's stops from these (``schemas/budget.py``).
        Raises ``ValueError`` for a ``seconds`` or ``step_seconds`` that is not a
        finite number >= 0, or as :meth:`begin`."""
        fixed: dict[str, object] = {"step": _check_step(step), "seconds": _duration(seconds)}
        if step_seconds is not None:
            fixed["step_seconds"] = _duration(step_seconds, "step_seconds")
        self._emit("save", fixed, extra)

    @contextlib.contextmanager
    def saving(self, step: int, *, step_seconds: float | None = None) -> Iterator[None]:
        """Times the ``with`` block (a checkpoint save at ``step``) on a monotonic
        clock and, when it ends without an exception, writes its :meth:`save` line::

            with metrics.saving(step, step_seconds=last_step_s):
                save_checkpoint(...)
        """
        started = time.monotonic()
        yield
        self.save(step, time.monotonic() - started, step_seconds=step_seconds)

    def end(self, step: int, **extra: object) -> None:
        """Records the end of training at ``step`` (e.g. ``reason=...`` after a
        snapshot): ``{"event": "end", "time": T, "step": step, **extra}``. Raises like
        :meth:`begin`."""
        self._emit("end", {"step": _check_step(step)}, extra)

    def _emit(self, event: str, fixed: dict[str, object], values: dict[str, object]) -> None:
        # Values are checked even when disabled, so a mistake shows without a file.
        record: dict[str, object] = {"event": event, "time": time.time(), **fixed}
        for key, value in values.items():
            if key in _RESERVED_KEYS or key in fixed:
                raise ValueError(f"metric key {key!r} is reserved")
            record[key] = _json_value(key, value)
        if self._fd is None:
            return
        # ensure_ascii and allow_nan=False: the line is plain JSON without a raw
        # newline, whatever the strings hold.
        line = (json.dumps(record, separators=(",", ":"), allow_nan=False) + "\n").encode()
        with self._lock:
            if self._fd is None:
                return
            try:
                written = os.write(self._fd, line)
                if written < len(line):
                    # Only a full disk or a quota cuts a regular-file append short;
                    # finishing the line keeps the file one record a line.
                    _write_all(self._fd, line[written:])
            except OSError as error:
                self.dropped += 1
                self.last_error = error

    def close(self) -> None:
        """Closes the file; later writes are ignored. Idempotent; never raises."""
        with self._lock:
            fd, self._fd = self._fd, None
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)

    def __enter__(self) -> Metrics:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()
