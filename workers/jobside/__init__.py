"""Job-side files: stdlib-only modules that launch copies into each run directory
(under `.runwarden/`, see `schemas.protocol.JOBSIDE_DIR`) and puts on the job's
`PYTHONPATH`, so a training loop can `import runwarden_job` (any loop) or
`import runwarden_hf` (the Hugging Face `TrainerCallback`; transformers is imported
only when the callback is used) or `import runwarden_loop` (a stop point for a loop
of one's own: plain PyTorch, DDP, Accelerate) or `import runwarden_lightning` (the
PyTorch Lightning `Callback`; Lightning is imported only when the callback is used).

The files listed in `JOBSIDE_FILES` import nothing but the standard library (at
import time) and each other: they run in the job's environment, not the
worker's.
This `__init__` is not shipped.
"""

from __future__ import annotations

import pathlib
from typing import Final

__all__ = ["JOBSIDE_FILES", "jobside_dir", "jobside_files"]

JOBSIDE_FILES: Final[tuple[str, ...]] = (
    "runwarden_job.py",
    "runwarden_metrics.py",
    "runwarden_preempt.py",
    "runwarden_loop.py",
    "runwarden_hf.py",
    "runwarden_lightning.py",
)
"""The names of the files to ship, relative to `jobside_dir()`."""


def jobside_dir() -> pathlib.Path:
    """The absolute path of the folder holding the job-side files (this package's
    folder, also inside an installed wheel: the files are package data)."""
    return pathlib.Path(__file__).resolve().parent


def jobside_files() -> list[pathlib.Path]:
    """The absolute paths of the files to ship, in the order of `JOBSIDE_FILES`.

    Raises:
        FileNotFoundError: one of them is missing (a broken installation); better
            now than as an `ImportError` in a job hours later.
    """
    folder = jobside_dir()
    files = [folder / name for name in JOBSIDE_FILES]
    missing = [str(path) for path in files if not path.is_file()]
    if missing:
        raise FileNotFoundError(f"job-side files missing: {', '.join(missing)}")
    return files
