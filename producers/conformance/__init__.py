"""`runwarden check-trainer`: whether a training command honours runwarden's stop
protocol, checked on this machine under a private service (docs/job-side.md,
"Checking a training script").

    verdict    the checks, judged from what was observed (pure)
    observe    bounded reads of the run directory
    session    one check: launch, warm up, stop, watch, load, resume
    loadcheck  a script the job's interpreter runs to load the checkpoint
"""

from __future__ import annotations

from .session import Report, TrainerCheck, run_check
from .verdict import CHECKS, Check

__all__ = ["CHECKS", "Check", "Report", "TrainerCheck", "run_check"]
