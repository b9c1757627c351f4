"""A stop point for a training loop of one's own: plain PyTorch, a DDP loop under
``torchrun``, Accelerate around a custom loop.

STDLIB ONLY AT IMPORT TIME. Launch ships this file into the run directory next to
``runwarden_job.py`` and puts that folder on the job's ``PYTHONPATH``. It never
imports torch: under ``torch.distributed`` it uses the module the job has already
imported and initialized.

Use (every rank runs the same code)::

    from runwarden_loop import StopPoint, resume_checkpoint

    start = load(resume_checkpoint()) if resume_checkpoint() else 0   # step, RNG, data position
    with StopPoint() as stop:          # installs the preemption signals (every rank)
        for step in range(start + 1, max_steps + 1):
            train_one_step()
            if stop.reached(step, last_step=max_steps):    # the same answer on every rank
                save(stop.checkpoint(step))   # every rank saves its part, completely
                stop.prove(step)              # then the proof: rank 0, after every rank
                break

The contract:

- :meth:`StopPoint.reached` is called by every rank at the end of every step, with
  the step just completed. Rank 0 reads ``snapshot.request``; every rank adds whether
  it received a preemption signal (``runwarden_job.install_preemption_signals``);
  under an initialized ``torch.distributed`` with more than one rank these are
  gathered by every rank (``all_gather_object``, one collective per step), so every
  rank stops at the same step with the same reason: rank 0's file request, else
  ``preempted`` when any rank got a signal. Without it, the one process decides
  alone. A request seen at ``last_step`` or after changes nothing: the loop ends
  normally. Once it returned a reason it returns that reason again.
- :meth:`StopPoint.checkpoint` is where the checkpoint of a step goes: the run
  directory's ``output/checkpoint-<step>`` (absolute), the only place a proof may
  name; the loop saves everything a faithful resume needs there (model, optimizer,
  scheduler, RNG states, the data loader's position).
- :meth:`StopPoint.prove` after the save: a barrier (every rank has saved), then rank
  0 flushes the checkpoint directory to disk (every file and directory, then its
  parent) and writes the proof ``snapshot.json``; the other ranks write nothing. A
  proof is never written for a step :meth:`reached` did not stop at, nor before the
  checkpoint directory exists.
- :meth:`StopPoint.close` (or leaving the ``with`` block) restores the signal
  handlers from before.
- :func:`resume_checkpoint`: the checkpoint a resumed run starts from.
"""

from __future__ import annotations

import errno
import importlib
import os
import sys
from collections.abc import Sequence
from types import TracebackType
from typing import Any, Final, Protocol, cast

__all__ = ["StopPoint", "resume_checkpoint"]


class _JobApi(Protocol):
    PREEMPTED: str
    REASONS: tuple[str, ...]
    RESUME_ENV: str

    def snapshot_requested(self, *, path: str | None = None) -> str | None: ...
    def request_snapshot(self, reason: str, *, path: str | None = None) -> str | None: ...
    def preemption_pending(self) -> bool: ...
    def install_preemption_signals(
        self, signals: str | Sequence[str | int] | None = None
    ) -> tuple[Any, ...]: ...
    def restore_preemption_signals(self) -> tuple[Any, ...]: ...
    def checkpoint_path(self, step: int) -> str: ...
    def run_dir(self) -> str: ...
    def write_proof(self, step: int, reason: str, *, directory: str | None = None) -> str: ...
    def report_stop(self, step: int, reason: str, *, rank: int | None = None) -> str | None: ...


def _job_module() -> _JobApi:
    """``runwarden_job``: the sibling in this package when this file is imported as part
    of one, else the top-level module on ``PYTHONPATH`` (the shipped copy)."""
    name = f"{__package__}.runwarden_job" if __package__ else "runwarden_job"
    return cast(_JobApi, importlib.import_module(name))


_job: Final = _job_module()


def resume_checkpoint() -> str | None:
    """The checkpoint to resume from: the absolute path of ``$RUNWARDEN_RESUME_FROM``
    (set by runwarden when a run is resumed; relative paths are taken from the current
    directory, the run directory) when it is set and not empty, else ``None``.

    Raises:
        FileNotFoundError: the variable names something that is not a directory
            (better now than deep inside the loop's own loading).
    """
    value = os.environ.get(_job.RESUME_ENV)
    if not value:
        return None
    path = os.path.abspath(value)
    if not os.path.isdir(path):
        raise FileNotFoundError(
            errno.ENOENT, f"${_job.RESUME_ENV} is not a checkpoint directory", path
        )
    return path


def _distributed() -> Any | None:
    """``torch.distributed`` when it is initialized with more than one rank, else
    ``None``. Never imports torch: a job that uses it has imported it already."""
    dist = sys.modules.get("torch.distributed")
    if dist is None:
        return None
    if not (dist.is_available() and dist.is_initialized()):
        return None
    return dist if dist.get_world_size() > 1 else None


def _fsync_path(path: str, *, directory: bool) -> None:
    """fsyncs one file or directory; filesystems that cannot (``EINVAL``, ``EBADF``,
    ``EACCES``, ``ENOTSUP``, ``EROFS``) are tolerated, other errors raise ``OSError``."""
    flags = os.O_RDONLY | getattr(os, "O_CLOEXEC", 0)
    if directory:
        flags |= getattr(os, "O_DIRECTORY", 0)
    try:
        fd = os.open(path, flags)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError as error:
        tolerated = {errno.EINVAL, errno.EBADF, errno.EACCES, errno.EROFS}
        tolerated.add(getattr(errno, "ENOTSUP", errno.EINVAL))
        if error.errno not in tolerated:
            raise
    finally:
        os.close(fd)


def _fsync_tree(root: str) -> None:
    """Makes the checkpoint ``root`` durable before its proof is: every regular file
    and directory under it (symlinks not followed), then its parent directory, which
    holds its name. The proof is fsynced by ``write_proof``; without this a crash
    could keep the proof and lose the checkpoint's data still in the page cache."""
    for current, dirs, files in os.walk(root):
        dirs.sort()
        for name in sorted(files):
            path = os.path.join(current, name)
            if os.path.isfile(path) and not os.path.islink(path):
                _fsync_path(path, directory=False)
        _fsync_path(current, directory=True)
    _fsync_path(os.path.dirname(os.path.abspath(root)), directory=True)


def _agreed(gathered: Sequence[object]) -> str | None:
    """The decision of every rank from what each contributed at a step end (index =
    rank): rank 0's reason (its file request, or ``preempted``), else ``preempted``
    when any other rank got a preemption signal, else ``None``."""
    first = gathered[0] if gathered else None
    if isinstance(first, str) and first in _job.REASONS:
        return first
    return _job.PREEMPTED if _job.PREEMPTED in gathered[1:] else None


class StopPoint:
    """The stop point of a custom training loop (see the module for the contract).
    ``preempt_signals`` as ``runwarden_job.install_preemption_signals`` takes them
    (default ``$RUNWARDEN_PREEMPT_SIGNALS``, else ``TERM,USR1``; ``""``: none); they
    are installed when the stop point is made, in the main thread.

    Raises:
        ValueError, RuntimeError: as ``install_preemption_signals`` (nothing changed).
    """

    def __init__(self, preempt_signals: str | Sequence[str | int] | None = None) -> None:
        self.reason: str | None = None
        """The reason the loop stops for, once :meth:`reached` returned one."""
        self.stop_step: int | None = None
        """The step :meth:`reached` stopped at."""
        self.proof_path: str | None = None
        """Where rank 0 wrote the proof (None elsewhere, or before :meth:`prove`)."""
        self._installed = bool(_job.install_preemption_signals(preempt_signals))

    @staticmethod
    def _rank() -> int:
        dist = _distributed()
        return int(dist.get_rank()) if dist is not None else 0

    def reached(self, step: int, *, last_step: int | None = None) -> str | None:
        """Whether the loop stops after ``step``, the step just completed: the reason
        (the same on every rank), or ``None``. Called by every rank at every step end
        (a collective under ``torch.distributed``)."""
        if self.reason is not None:
            return self.reason
        dist = _distributed()
        rank = int(dist.get_rank()) if dist is not None else 0
        mine: str | None = None
        if last_step is None or step < last_step:
            if rank == 0:
                mine = _job.snapshot_requested()
            elif _job.preemption_pending():
                mine = _job.PREEMPTED
        reason = mine
        if dist is not None:
            gathered: list[object] = [None] * int(dist.get_world_size())
            dist.all_gather_object(gathered, mine)
            reason = _agreed(gathered)
        if reason is None:
            return None
        if rank == 0 and reason == _job.PREEMPTED and mine is None:
            # Another rank got the signal: rank 0 owns the run directory's files.
            _job.request_snapshot(reason)
        self.reason, self.stop_step = reason, step
        _job.report_stop(step, reason, rank=rank)
        if rank == 0:
            print(
                f"runwarden: snapshot requested ({reason}) at step {step}: "
                "saving a checkpoint and stopping",
                flush=True,
            )
        return reason

    def checkpoint(self, step: int) -> str:
        """The absolute directory the checkpoint of ``step`` goes to (``output/
        checkpoint-<step>`` of the run directory), not made yet.

        Raises:
            ValueError: ``step`` is not a non-negative ``int``.
        """
        return os.path.join(_job.run_dir(), _job.checkpoint_path(step))

    def prove(self, step: int) -> str | None:
        """After every rank saved the checkpoint of ``step``: waits for every rank
        (a barrier under ``torch.distributed``), then rank 0 flushes the checkpoint to
        disk and writes the proof; its path on rank 0, ``None`` on the others.

        Raises:
            RuntimeError: :meth:`reached` did not stop at ``step``.
            FileNotFoundError: (rank 0) the checkpoint directory does not exist.
        """
        if self.reason is None or self.stop_step != step:
            raise RuntimeError(f"no snapshot was requested at step {step}: nothing to prove")
        dist = _distributed()
        if dist is not None:
            dist.barrier()
        if self._rank() != 0:
            return None
        checkpoint = self.checkpoint(step)
        if not os.path.isdir(checkpoint):
            raise FileNotFoundError(errno.ENOENT, "the checkpoint was not saved", checkpoint)
        _fsync_tree(checkpoint)
        self.proof_path = _job.write_proof(step, self.reason)
        print(f"runwarden: checkpoint {checkpoint} saved; proof written", flush=True)
        return self.proof_path

    def close(self) -> None:
        """Restores the signal handlers from before (once; nothing on a later call)."""
        if self._installed:
            self._installed = False
            _job.restore_preemption_signals()

    def __enter__(self) -> StopPoint:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()
