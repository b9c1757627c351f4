"""The PyTorch Lightning side of runwarden: a ``Callback`` that stops a
``Trainer.fit`` gracefully with a checkpoint and its proof.

STDLIB ONLY AT IMPORT TIME. Launch ships this file into the run directory next to
``runwarden_job.py`` and ``runwarden_loop.py`` and puts that folder on the job's
``PYTHONPATH``. Importing it imports neither Lightning nor torch: the callback class
is built on first use (:func:`callback`, or the attribute ``RunwardenCallback``), on
``lightning.pytorch.Callback`` (or ``pytorch_lightning.Callback`` when that is the
package the job imported).

Use (every rank runs the same code; run from the run directory)::

    from runwarden_lightning import RunwardenCallback, resume_checkpoint

    trainer = lightning.pytorch.Trainer(..., callbacks=[RunwardenCallback()])
    trainer.fit(model, data, ckpt_path=resume_checkpoint())

What the callback does (the decision and the proof are ``runwarden_loop.StopPoint``'s,
shared with loops of one's own):

- ``on_train_start``: on every rank, installs the preemption signal handlers
  (``runwarden_job.install_preemption_signals``: ``$RUNWARDEN_PREEMPT_SIGNALS``,
  default ``TERM,USR1``; the constructor's ``preempt_signals`` overrides it, ``""``
  turns them off). Not at ``on_fit_start``: Lightning registers its own SIGTERM
  handler after that hook, and it would run first (a collective inside the handler,
  then ``SIGTERMException`` at the next batch: the fit ends without a checkpoint);
  installed at ``on_train_start`` ours replace it for the training, and Lightning's
  come back at its end. World rank 0 writes the ``begin`` metrics line
  (``max_steps``: ``trainer.estimated_stepping_batches``; ``first_step``).
- ``on_train_batch_end``, at each batch end where an optimizer step was taken
  (``trainer.global_step`` advanced: with ``accumulate_grad_batches`` the batches
  that only accumulate are skipped, so a checkpoint never holds half an accumulated
  step): rank 0 writes a ``log`` line (the batch's ``loss``); every rank calls
  ``StopPoint.reached(global_step, last_step=...)``: rank 0 reads
  ``snapshot.request``, every rank adds whether it got a preemption signal, and under
  ``torch.distributed`` the ranks gather these, so every rank stops at the same step
  with the same reason (rank 0's request, else ``preempted`` when any rank got a
  signal). A request at or after the last step changes nothing. On a request, every
  rank calls ``trainer.save_checkpoint(<run_dir>/output/checkpoint-<step>/
  lightning.ckpt)`` (a collective: the strategy decides which ranks write what), then
  ``StopPoint.prove``: after a barrier, rank 0 fsyncs the checkpoint directory and
  writes the proof ``snapshot.json``; rank 0 writes a ``save`` line; then
  ``trainer.should_stop = True``: the fit ends after this batch (its
  ``on_train_epoch_end`` and validation hooks still run; ``min_epochs``/``min_steps``
  not yet met keep it going: leave them unset for a job runwarden stops).
- ``on_train_end``: the signal handlers from before ``on_train_start`` are restored
  (every rank); rank 0 writes ``end`` (with ``reason`` after a snapshot).
  ``on_exception`` restores the handlers too.

:func:`resume_checkpoint` is the file a resumed run passes as ``ckpt_path=``: the
Trainer then restores the model, the optimizers, the schedulers, the loops' progress
(the step count goes on) and the state of a train dataloader that has
``state_dict``/``load_state_dict``, the only way a resume mid-epoch keeps the data
order (``examples/lightning_loop.py`` shows one). Lightning saves no RNG state: a
model with dropout keeps its own (``on_save_checkpoint``/``on_load_checkpoint``).
"""

from __future__ import annotations

import errno
import importlib
import logging
import numbers
import os
import sys
import time
from collections.abc import Sequence
from typing import Any, Final, Protocol, cast

# `RunwardenCallback` is left out: a star import must not import Lightning.
__all__ = ["CHECKPOINT_FILE", "callback", "resume_checkpoint"]

_log: Final = logging.getLogger("runwarden_lightning")

CHECKPOINT_FILE: Final = "lightning.ckpt"
"""The file the Trainer saves inside ``output/checkpoint-<step>`` (a directory of that
name for a strategy that saves shards)."""


class _MetricsApi(Protocol):
    def begin(self, max_steps: int, **extra: object) -> None: ...
    def log(self, step: int, **values: object) -> None: ...
    def save(
        self, step: int, seconds: float, *, step_seconds: float | None = None, **extra: object
    ) -> None: ...
    def end(self, step: int, **extra: object) -> None: ...
    def close(self) -> None: ...


class _JobApi(Protocol):
    RESUME_ENV: str

    def Metrics(self, path: str | None = None) -> _MetricsApi: ...  # the class


def _sibling(name: str) -> Any:
    """A sibling job-side module: from this package when this file is imported as part
    of one (``workers.jobside``), else the top-level module on ``PYTHONPATH`` (the
    shipped copy in a run directory)."""
    return importlib.import_module(f"{__package__}.{name}" if __package__ else name)


_job: Final = cast(_JobApi, _sibling("runwarden_job"))
_loop: Final = _sibling("runwarden_loop")


def resume_checkpoint() -> str | None:
    """The Lightning checkpoint to resume from, for ``Trainer.fit(ckpt_path=...)``:
    ``lightning.ckpt`` in the directory ``$RUNWARDEN_RESUME_FROM`` names (absolute),
    else the one ``*.ckpt`` there; ``None`` when the variable is unset or empty.

    Raises:
        FileNotFoundError: the variable names something that is not a directory, or
            a directory without one Lightning checkpoint.
    """
    directory: str | None = _loop.resume_checkpoint()
    if directory is None:
        return None
    path = os.path.join(directory, CHECKPOINT_FILE)
    if os.path.exists(path):
        return path
    found = sorted(name for name in os.listdir(directory) if name.endswith(".ckpt"))
    if len(found) == 1:
        return os.path.join(directory, found[0])
    raise FileNotFoundError(
        errno.ENOENT, f"${_job.RESUME_ENV} holds no single Lightning checkpoint", path
    )


def _loss(outputs: object) -> float | None:
    """The loss of a training step's outputs (a tensor, or a dict holding ``loss``),
    as a float; ``None`` when there is none."""
    if isinstance(outputs, dict):
        outputs = outputs.get("loss")
    if isinstance(outputs, numbers.Real) and not isinstance(outputs, bool):
        return float(outputs)
    item = getattr(outputs, "item", None)
    if callable(item) and getattr(outputs, "numel", lambda: 0)() == 1:
        value = item()
        return float(value) if isinstance(value, numbers.Real) else None
    return None


class _RunwardenLogic:
    """Stops a Lightning ``Trainer.fit`` with a checkpoint and its proof when runwarden
    asks for a snapshot, and writes the run's metrics (see the module for the hooks).

    The public class, ``RunwardenCallback``, is this class combined with Lightning's
    ``Callback`` (built on first access). Every rank must run it (the Trainer does):
    the decision is a collective at each optimizer step's batch end.

    ``preempt_signals``: the signals turned into a ``preempted`` request on every rank:
    ``None`` (the default) reads ``$RUNWARDEN_PREEMPT_SIGNALS`` at train start (unset:
    ``TERM,USR1``); a string (``"TERM,USR2"``) or a sequence of names names them;
    ``""`` or ``()`` installs none. A bad name raises ``ValueError`` from
    ``on_train_start``, before any step. A Trainer run in another thread than the
    main one logs a warning and runs without them.

    Contracts: a request is acted on once per ``fit``; the proof is written once, by
    world rank 0, after every rank returned from ``save_checkpoint`` and after the
    checkpoint's files are fsynced (an error writing it propagates: the job fails
    instead of claiming a snapshot); metrics go to ``$RUNWARDEN_METRICS`` (nothing
    when unset), written by world rank 0 only.
    """

    def __init__(self, preempt_signals: str | Sequence[str | int] | None = None) -> None:
        self.preempt_signals = preempt_signals
        """The signals to install at train start (``None``: the environment's)."""
        self.reason: str | None = None
        """The reason of the snapshot taken during the current ``fit``, if any."""
        self.stop_step: int | None = None
        """The global step the fit stopped at for it."""
        self.proof_path: str | None = None
        """The absolute path of the proof once written (world rank 0 only)."""
        self._stop: Any = None
        self._metrics: _MetricsApi | None = None
        self._last_step: int | None = None
        self._seen_step = 0
        self._step_end: float | None = None
        self._step_seconds: float | None = None

    # Hooks: Lightning's signatures (trainer, pl_module, ...); they return None.

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        """Forgets any earlier request, installs the preemption signals (every rank)
        and, on world rank 0, opens the metrics and writes ``begin``."""
        self._close_stop()
        self.reason = self.stop_step = self.proof_path = None
        self._seen_step = int(trainer.global_step)
        self._step_end, self._step_seconds = time.monotonic(), None
        estimated = trainer.estimated_stepping_batches
        finite = isinstance(estimated, int) or (
            isinstance(estimated, float) and estimated.is_integer()
        )
        self._last_step = int(estimated) if finite and estimated >= 0 else None
        try:
            self._stop = _loop.StopPoint(self.preempt_signals)
        except RuntimeError as error:
            _log.warning("runwarden: preemption signals not installed: %s", error)
            self._stop = _loop.StopPoint("")
        if not trainer.is_global_zero:
            return
        if self._metrics is not None:
            self._metrics.close()
        self._metrics = _job.Metrics()
        if self._last_step is not None:
            self._metrics.begin(self._last_step, first_step=self._seen_step + 1)

    def on_train_batch_end(
        self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        """After a batch whose optimizer step was taken: the ``log`` line, the decision
        (every rank), and on a snapshot the save, the proof and the stop."""
        step = int(trainer.global_step)
        if step == self._seen_step or self._stop is None:
            return  # accumulating gradients: no step ended here
        self._seen_step = step
        now = time.monotonic()
        if self._step_end is not None:
            self._step_seconds = now - self._step_end
        self._step_end = now
        if self._metrics is not None:
            loss = _loss(outputs)
            if loss is not None:
                self._metrics.log(step, loss=loss)
        if self.reason is not None:
            # Stopped already, and the Trainer went on (min_epochs / min_steps).
            _log.warning("runwarden: the Trainer did not stop after the snapshot at step "
                         "%s (min_epochs or min_steps not met?)", self.stop_step)  # fmt: skip
            trainer.should_stop = True
            return
        reason = self._stop.reached(step, last_step=self._last_step)
        if reason is None:
            return
        self.reason, self.stop_step = reason, step
        trainer.save_checkpoint(os.path.join(self._stop.checkpoint(step), CHECKPOINT_FILE))
        self.proof_path = self._stop.prove(step)
        if self._metrics is not None:
            seconds = max(0.0, time.monotonic() - now)
            self._metrics.save(step, seconds, step_seconds=self._step_seconds)
        trainer.should_stop = True

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        """Restores the signal handlers (every rank); writes ``end`` (with ``reason``
        after a snapshot) and closes the metrics (world rank 0)."""
        self._close_stop()
        if self._metrics is not None:
            extra = {"reason": self.reason} if self.reason is not None else {}
            self._metrics.end(int(trainer.global_step), **extra)
            self._metrics.close()
            self._metrics = None

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        """Restores the signal handlers and closes the metrics (no ``end`` line)."""
        self._close_stop()
        if self._metrics is not None:
            self._metrics.close()
            self._metrics = None

    def _close_stop(self) -> None:
        if self._stop is not None:
            stop, self._stop = self._stop, None
            try:
                stop.close()
            except RuntimeError as error:
                _log.warning("runwarden: preemption signals not restored: %s", error)


_classes: dict[str, type[_RunwardenLogic]] = {}


def _lightning_name() -> str:
    """The Lightning package the job uses: ``lightning.pytorch`` unless only
    ``pytorch_lightning`` is imported (or installed)."""
    if "lightning.pytorch" in sys.modules or "pytorch_lightning" not in sys.modules:
        try:
            importlib.import_module("lightning.pytorch")
        except ImportError:
            return "pytorch_lightning"
        return "lightning.pytorch"
    return "pytorch_lightning"


def _build_class() -> type[_RunwardenLogic]:
    """``RunwardenCallback``: :class:`_RunwardenLogic` combined with Lightning's
    ``Callback``, built once per Lightning package. Raises ``ImportError`` without
    Lightning."""
    name = _lightning_name()
    if name not in _classes:
        base = importlib.import_module(name).Callback
        namespace = {
            "__module__": __name__,
            "__qualname__": "RunwardenCallback",
            "__doc__": _RunwardenLogic.__doc__,
        }
        _classes[name] = cast(
            type[_RunwardenLogic],
            type("RunwardenCallback", (_RunwardenLogic, base), namespace),
        )
    return _classes[name]


def callback(preempt_signals: str | Sequence[str | int] | None = None) -> _RunwardenLogic:
    """A new ``RunwardenCallback`` (a Lightning ``Callback``; see its
    ``preempt_signals``): imports Lightning. Raises ``ImportError`` without it."""
    return _build_class()(preempt_signals)


def __getattr__(name: str) -> Any:
    """``RunwardenCallback``, built on first access (imports Lightning)."""
    if name == "RunwardenCallback":
        return _build_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
