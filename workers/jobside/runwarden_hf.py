"""The Hugging Face side of runwarden: a ``TrainerCallback`` that stops a
``transformers.Trainer`` gracefully with a checkpoint and its proof.

STDLIB ONLY AT IMPORT TIME. Launch ships this file into the run directory next to
``runwarden_job.py`` and puts that folder on the job's ``PYTHONPATH``. Importing it
imports neither ``transformers`` nor ``torch``: the callback class is built on first
use (:func:`callback`, or the attribute ``RunwardenCallback``), so a job that never
uses it pays nothing and a job without transformers can still ``import runwarden_hf``.

Use::

    from runwarden_hf import RunwardenCallback, resume_checkpoint

    args = TrainingArguments(output_dir="output", ...)   # the run directory's output/
    trainer = Trainer(model, args, ..., callbacks=[RunwardenCallback()])
    trainer.train(resume_from_checkpoint=resume_checkpoint())

What the callback does:

- ``on_train_begin``: ``begin`` metrics line (``max_steps``, ``first_step``); on every
  rank, installs the preemption signal handlers (see
  ``runwarden_job.install_preemption_signals``: ``$RUNWARDEN_PREEMPT_SIGNALS``,
  default ``TERM,USR1``; the constructor's ``preempt_signals`` overrides it, ``""``
  turns them off).
- ``on_log``: a ``log`` line with the numeric values of the log at the global step.
- ``on_step_end``: world rank 0 reads ``snapshot.request``; every rank adds whether it
  received a preemption signal; under an initialized ``torch.distributed`` with more
  than one rank, these are gathered by every rank, so every rank reaches the same
  decision at the same step: rank 0's file request, else ``preempted`` when any rank
  got a signal. A request seen at or after the last step (``global_step >=
  max_steps``) changes nothing: the run ends normally. On a request it sets
  ``control.should_save`` and ``control.should_training_stop``.
- ``on_save``: the Trainer has saved ``<output_dir>/checkpoint-<global_step>``; a
  ``save`` metrics line says how long that took (from the step's end) and how long
  the step before it took, so runwarden learns how long this job's stops may wait
  for a proof. When a snapshot was requested, after every rank has finished
  saving, rank 0 flushes the checkpoint to disk and writes the proof
  ``snapshot.json`` naming ``output/checkpoint-<step>``. This is only possible when
  ``output_dir`` is the run directory's ``output``; otherwise a warning is logged
  and no proof is written (runwarden then sees a job that ends without a proof).
- ``on_train_end``: ``end`` metrics line (with ``reason`` after a snapshot); on every
  rank, the signal handlers from before ``on_train_begin`` are restored.

Metrics are written by world process zero only.
"""

from __future__ import annotations

import importlib
import logging
import numbers
import os
import signal
import time
from collections.abc import Sequence
from typing import Any, Final, Protocol, cast

# `RunwardenCallback` is left out: a star import must not import transformers.
__all__ = ["callback", "resume_checkpoint"]

_log: Final = logging.getLogger("runwarden_hf")

_RESERVED_KEYS: Final = frozenset({"event", "time", "step"})
_CHECKPOINT_PREFIX: Final = "checkpoint-"
"""transformers' ``PREFIX_CHECKPOINT_DIR`` plus its dash: HF saves to
``<output_dir>/checkpoint-<global_step>``."""


# --- the job-side API, typed -----------------------------------------------------------


class _MetricsApi(Protocol):
    def begin(self, max_steps: int, **extra: object) -> None: ...
    def log(self, step: int, **values: object) -> None: ...
    def save(
        self, step: int, seconds: float, *, step_seconds: float | None = None, **extra: object
    ) -> None: ...
    def end(self, step: int, **extra: object) -> None: ...
    def close(self) -> None: ...


class _JobApi(Protocol):
    """What this module uses of ``runwarden_job`` (its signatures, repeated: the
    sibling module is imported by name, which a type checker cannot follow)."""

    OUTPUT_DIR: str
    RESUME_ENV: str
    REQUEST_ENV: str
    REASONS: tuple[str, ...]
    PREEMPTED: str

    def Metrics(self, path: str | None = None) -> _MetricsApi: ...
    def run_dir(self) -> str: ...
    def snapshot_requested(self, *, path: str | None = None) -> str | None: ...
    def request_snapshot(self, reason: str, *, path: str | None = None) -> str | None: ...
    def report_stop(self, step: int, reason: str, *, rank: int | None = None) -> str | None: ...
    def preemption_pending(self) -> bool: ...
    def install_preemption_signals(
        self, signals: str | Sequence[str | int] | None = None
    ) -> tuple[signal.Signals, ...]: ...
    def restore_preemption_signals(self) -> tuple[signal.Signals, ...]: ...
    def write_proof(self, step: int, reason: str, *, directory: str | None = None) -> str: ...


def _job_module() -> _JobApi:
    """``runwarden_job``: the sibling in this package when this file is imported as part
    of one (``workers.jobside.runwarden_hf``), else the top-level module on
    ``PYTHONPATH`` (the shipped copy in a run directory)."""
    name = f"{__package__}.runwarden_job" if __package__ else "runwarden_job"
    return cast(_JobApi, importlib.import_module(name))


_job: Final = _job_module()


def _loop_module() -> Any:
    """``runwarden_loop`` (the helpers a stop point shares with this callback), found
    as ``runwarden_job`` is."""
    name = f"{__package__}.runwarden_loop" if __package__ else "runwarden_loop"
    return importlib.import_module(name)


_loop: Final = _loop_module()
resume_checkpoint = _loop.resume_checkpoint
_distributed = _loop._distributed
_fsync_tree = _loop._fsync_tree
_agreed = _loop._agreed


# --- duck types of the transformers objects the callback reads -------------------------


class _Args(Protocol):
    output_dir: str | None


class _State(Protocol):
    global_step: int
    max_steps: int
    is_world_process_zero: bool


class _Control(Protocol):
    should_save: bool
    should_training_stop: bool


# --- helpers ------------------------------------------------------------------------


def _numeric(logs: object) -> dict[str, object]:
    """The values of an HF log dict that a metrics line takes: real numbers (not
    ``bool``) under string keys other than ``event``, ``time`` and ``step``."""
    if not isinstance(logs, dict):
        return {}
    return {
        key: value
        for key, value in logs.items()
        if isinstance(key, str)
        and key not in _RESERVED_KEYS
        and isinstance(value, numbers.Real)
        and not isinstance(value, bool)
    }


# --- the callback ---------------------------------------------------------------------


class _RunwardenLogic:
    """Stops a ``transformers.Trainer`` with a checkpoint and its proof when runwarden
    asks for a snapshot, and writes the run's metrics.

    The public class, ``RunwardenCallback``, is this class combined with
    ``transformers.TrainerCallback`` (built on first access, see the module docstring).
    Add one instance to a Trainer whose ``output_dir`` is ``output`` (run from the run
    directory) or the absolute ``<run_dir>/output``.

    ``preempt_signals``: the signals turned into a ``preempted`` request on every rank
    (``runwarden_job.install_preemption_signals``): ``None`` (the default) reads
    ``$RUNWARDEN_PREEMPT_SIGNALS`` at train begin (unset: ``TERM,USR1``); a string
    (``"TERM,USR2"``) or a sequence of names names them; ``""`` or ``()`` installs
    none. A bad name raises ``ValueError`` from ``on_train_begin``, before any step.

    Contracts:

    - Every rank decides the same thing at the same step: only rank 0 reads the
      request file; every rank contributes whether it received a preemption signal;
      under an initialized ``torch.distributed`` with more than one rank, every rank
      gathers all contributions at every step end (``all_gather_object``) and reaches
      the same decision: rank 0's file request (its reason wins), else ``preempted``
      if any rank got a signal. So every rank must run this callback (the Trainer
      does). When the decision is ``preempted``, rank 0 writes ``snapshot.request``
      holding it if none exists, so runwarden sees why. A request is acted on once
      per ``train()`` call.
    - Signal handlers are installed at ``on_train_begin`` and the earlier ones restored
      at ``on_train_end``, on every rank (a ``train()`` that raises leaves them: the
      process normally ends then). Only the main thread may install them: a
      Trainer run in another thread logs a warning and runs without them. A signal
      handled while a request is pending does not end the process (runwarden's own
      cancel still does: see ``runwarden_preempt.py``). transformers' own
      ``enable_jit_checkpoint`` also handles SIGTERM: use one or the other.
    - A request seen at or after the last step changes nothing.
    - The proof is written once, by rank 0, after every rank has returned from saving
      the checkpoint (a barrier under ``torch.distributed``) and after the checkpoint's
      files are fsynced, and only when ``output_dir`` resolves to ``<run_dir>/output``;
      else a warning is logged and no proof is written. An error writing the proof
      (disk full, ...) propagates: the job then fails instead of claiming a snapshot.
    - A save that the Trainer would make again at the same step after the proof
      (an epoch-end save) is cancelled, so the proven checkpoint is not rewritten; a
      requested save that the Trainer skipped (``save_strategy="best"``) is asked
      again at the epoch end.
    - Metrics (``begin``, ``log``, ``save``, ``end``) are written by world process
      zero only,
      to ``$RUNWARDEN_METRICS`` (nothing when unset). Opening that file at train begin
      may raise ``OSError``; writing a line never does.
    """

    def __init__(self, preempt_signals: str | Sequence[str | int] | None = None) -> None:
        self.preempt_signals = preempt_signals
        """The signals to install at train begin (``None``: the environment's)."""
        self.installed: tuple[signal.Signals, ...] = ()
        """The signals handled during the current ``train()``."""
        self.reason: str | None = None
        """The reason of the snapshot requested during the current ``train()``, if any."""
        self.stop_step: int | None = None
        """The global step at which training was asked to stop, if it was."""
        self.proof_path: str | None = None
        """The absolute path of the proof once written (rank 0 only)."""
        self._saved_step: int | None = None
        self._metrics: _MetricsApi | None = None
        self._step_end: float | None = None
        """When the last step ended (or training began), on the monotonic clock."""
        self._step_seconds: float | None = None
        """How long the last step took."""

    # Hooks. Their signatures are transformers' (args, state, control, **kwargs); the
    # return value is None: the Trainer keeps its `control`, changed in place.

    def on_train_begin(self, args: _Args, state: _State, control: _Control, **kwargs: Any) -> None:
        """Forgets any earlier request, installs the preemption signals (every rank)
        and, on world process zero, opens the metrics and writes ``begin``
        (``max_steps``, ``first_step`` = the step after the resumed one); warns when a
        proof would be impossible. Raises ``ValueError`` for a bad signal name."""
        self.reason = self.stop_step = self.proof_path = self._saved_step = None
        self._step_end, self._step_seconds = time.monotonic(), None
        try:
            self.installed = _job.install_preemption_signals(self.preempt_signals)
        except RuntimeError as error:
            self.installed = ()
            _log.warning("runwarden: preemption signals not installed: %s", error)
        if not state.is_world_process_zero:
            return
        if self._metrics is not None:
            self._metrics.close()
        self._metrics = _job.Metrics()
        self._metrics.begin(state.max_steps, first_step=state.global_step + 1)
        if os.environ.get(_job.REQUEST_ENV) and not self._output_is_run_output(args):
            _log.warning("%s", self._mismatch_message(args))

    def on_log(
        self,
        args: _Args,
        state: _State,
        control: _Control,
        logs: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        """Writes a ``log`` line at the global step with the numeric values of
        ``logs`` (world process zero)."""
        if self._metrics is not None and state.is_world_process_zero:
            values = _numeric(logs)
            if values:
                self._metrics.log(state.global_step, **values)

    def on_step_end(self, args: _Args, state: _State, control: _Control, **kwargs: Any) -> None:
        """Looks for a request (rank 0: the file or its own signal; other ranks: their
        signal), agrees on the decision (every rank), and on one sets ``should_save``
        and ``should_training_stop``."""
        now = time.monotonic()
        if self._step_end is not None:
            self._step_seconds = now - self._step_end
        self._step_end = now
        if self.reason is not None:
            return
        dist = _distributed()
        reader = dist.get_rank() == 0 if dist is not None else state.is_world_process_zero
        mine: str | None = None
        if state.global_step < state.max_steps:
            if reader:
                mine = _job.snapshot_requested()
            elif _job.preemption_pending():
                mine = _job.PREEMPTED
        reason = mine
        if dist is not None:
            gathered: list[object] = [None] * dist.get_world_size()
            dist.all_gather_object(gathered, mine)
            reason = _agreed(gathered)
        if reason is None:
            return
        if reader and reason == _job.PREEMPTED and mine is None:
            # Another rank got the signal: rank 0 owns the run directory's files.
            _job.request_snapshot(reason)
        self.reason, self.stop_step = reason, state.global_step
        _job.report_stop(state.global_step, reason, rank=dist.get_rank() if dist else None)
        control.should_save = True
        control.should_training_stop = True
        if reader:
            print(
                f"runwarden: snapshot requested ({reason}) at step {state.global_step}: "
                f"saving a checkpoint and stopping",
                flush=True,
            )

    def on_save(self, args: _Args, state: _State, control: _Control, **kwargs: Any) -> None:
        """After the Trainer saved ``<output_dir>/checkpoint-<global_step>``: world
        process zero writes a ``save`` line (the seconds since the step ended, and the
        step's own); when a snapshot was requested, waits for every rank, and rank 0
        fsyncs the checkpoint and writes the proof (see the class contracts)."""
        if self._metrics is not None and state.is_world_process_zero and self._step_end is not None:
            seconds = max(0.0, time.monotonic() - self._step_end)
            self._metrics.save(state.global_step, seconds, step_seconds=self._step_seconds)
        if self.reason is None or self._saved_step is not None:
            return
        self._saved_step = state.global_step
        dist = _distributed()
        if dist is not None:
            dist.barrier()
        if not (dist.get_rank() == 0 if dist is not None else state.is_world_process_zero):
            return
        checkpoint = os.path.join(args.output_dir or "", f"{_CHECKPOINT_PREFIX}{state.global_step}")
        if not self._output_is_run_output(args):
            _log.warning("%s", self._mismatch_message(args))
            return
        _fsync_tree(checkpoint)
        self.proof_path = _job.write_proof(state.global_step, self.reason)
        print(
            f"runwarden: checkpoint {os.path.abspath(checkpoint)} saved; "
            f"proof written to {self.proof_path}",
            flush=True,
        )

    def on_epoch_end(self, args: _Args, state: _State, control: _Control, **kwargs: Any) -> None:
        """After a request: cancels an epoch-end save of the step already saved, or
        asks again for a save the Trainer skipped."""
        if self.reason is None:
            return
        control.should_save = self._saved_step != state.global_step

    def on_train_end(self, args: _Args, state: _State, control: _Control, **kwargs: Any) -> None:
        """Restores the signal handlers (every rank); writes ``end`` (with ``reason``
        after a requested snapshot) and closes the metrics (world process zero); warns
        when a requested snapshot got no proof."""
        if self.installed:
            self.installed = ()
            try:
                _job.restore_preemption_signals()
            except RuntimeError as error:
                _log.warning("runwarden: preemption signals not restored: %s", error)
        if not state.is_world_process_zero:
            return
        if self.reason is not None and self.proof_path is None:
            _log.warning(
                "runwarden: a snapshot was requested (%s) at step %s but no proof was written",
                self.reason,
                self.stop_step,
            )
        if self._metrics is not None:
            extra = {"reason": self.reason} if self.reason is not None else {}
            self._metrics.end(state.global_step, **extra)
            self._metrics.close()
            self._metrics = None

    # --- internals -------------------------------------------------------------------

    @staticmethod
    def _output_is_run_output(args: _Args) -> bool:
        """Whether ``args.output_dir`` (relative to the current directory) is the run
        directory's ``output``, symlinks resolved."""
        if not args.output_dir:
            return False
        expected = os.path.join(_job.run_dir(), _job.OUTPUT_DIR)
        return os.path.realpath(args.output_dir) == os.path.realpath(expected)

    @staticmethod
    def _mismatch_message(args: _Args) -> str:
        expected = os.path.join(_job.run_dir(), _job.OUTPUT_DIR)
        return (
            f"runwarden: TrainingArguments.output_dir is {args.output_dir!r}, not the run "
            f"directory's {expected!r}: checkpoints are saved, but no snapshot proof can "
            f"be written (a proof names output/checkpoint-<step>)"
        )


_callback_class: type[_RunwardenLogic] | None = None


def _build_class() -> type[_RunwardenLogic]:
    """``RunwardenCallback``: :class:`_RunwardenLogic` combined with
    ``transformers.TrainerCallback``, built once. Raises ``ImportError`` without
    transformers."""
    global _callback_class  # noqa: PLW0603 - built once, on first use
    if _callback_class is None:
        base = importlib.import_module("transformers").TrainerCallback
        namespace = {
            "__module__": __name__,
            "__qualname__": "RunwardenCallback",
            "__doc__": _RunwardenLogic.__doc__,
        }
        _callback_class = cast(
            type[_RunwardenLogic],
            type("RunwardenCallback", (_RunwardenLogic, base), namespace),
        )
    return _callback_class


def callback(preempt_signals: str | Sequence[str | int] | None = None) -> _RunwardenLogic:
    """A new ``RunwardenCallback`` (a ``transformers.TrainerCallback``; see its
    ``preempt_signals``): imports transformers. Raises ``ImportError`` without it."""
    return _build_class()(preempt_signals)


def __getattr__(name: str) -> Any:
    """``RunwardenCallback``, built on first access (imports transformers)."""
    if name == "RunwardenCallback":
        return _build_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
