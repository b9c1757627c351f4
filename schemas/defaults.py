"""Defaults that `runwarden --help` shows and the models use, in a module that imports
nothing: the command line reads them without building a model."""

from __future__ import annotations

from typing import Final

__all__ = ["DEFAULT_MAX_PREEMPTIONS", "LATE_AFTER_S"]

DEFAULT_MAX_PREEMPTIONS: Final = 3
"""How many preemptions of one chain are resumed when the launch does not say."""
LATE_AFTER_S: Final = 30.0
"""Default lateness of a periodic task past which the service is down, in seconds."""
