"""The command lines of the processes `runwarden serve` starts, each of which dies
with serve: run through `workers/deathsig.py` (`python -I -m workers.deathsig PID --
CMD...`), which arms Linux's parent-death signal (SIGTERM), checks that its parent is
still `PID`, and execs CMD. Named as a module to run, never imported: producers do not
import workers (docs/architecture.md, "Layers")."""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

__all__ = ["dying_with_parent"]


def dying_with_parent(command: Sequence[str], parent_pid: int | None = None) -> list[str]:
    """`command` as a command line that arms the parent-death signal and execs it, for
    a child of `parent_pid` (default: this process). Isolated (`-I`): neither the
    working directory nor the user's site can put another `workers` on the path."""
    parent = os.getpid() if parent_pid is None else parent_pid
    return [sys.executable, "-I", "-m", "workers.deathsig", str(parent), "--", *command]
