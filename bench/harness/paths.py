"""Where the repository's files are."""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
"""The repository's top level."""
JOBSIDE = ROOT / "workers" / "jobside"
TOY_TRAINER = ROOT / "examples" / "toy_trainer.py"
"""The job of the tests and benches: `examples/toy_trainer.py`."""
