"""Processes that die with their parent: Linux's parent-death signal
(`prctl(PR_SET_PDEATHSIG)`), which the kernel sends to a process when the *thread*
that forked it ends, however it ends (`kill -9` included), and which an `exec` keeps.

`python -I -m workers.deathsig PARENT_PID -- CMD [ARG...]` (`producers/children.py`
builds it for serve) arms SIGTERM as its own parent-death signal, checks that its
parent is still `PARENT_PID` (when it is not, the parent died before the signal was
armed: exit 1 at once, nothing run), then execs CMD in its place. `runwarden serve`
starts each of its processes so (from its main thread, which lives as long as serve),
so that no process of the service outlives serve: a `kill -9` of serve, or of its
process group, leaves none behind. SIGTERM is what every one of them stops on
cleanly (Redis writes its append-only file, a worker ends the tasks it runs). Off
Linux the signal cannot be armed and CMD runs without it.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
from typing import Final

__all__ = ["die_with_parent", "main"]

_PR_SET_PDEATHSIG: Final = 1
# Loaded at import, never between fork and exec: the symbols of the running program,
# libc's among them (no library search, which would start processes).
_LIBC: Final = ctypes.CDLL(None, use_errno=True) if sys.platform.startswith("linux") else None


def die_with_parent(signum: int = signal.SIGTERM) -> bool:
    """Arms `signum` as this process's parent-death signal; returns whether it worked
    (False off Linux). Safe between fork and exec of a single-threaded parent."""
    if _LIBC is None:
        return False
    return int(_LIBC.prctl(_PR_SET_PDEATHSIG, signum, 0, 0, 0)) == 0


def main(argv: list[str] | None = None) -> int:
    """`PARENT_PID -- CMD [ARG...]`: arms SIGTERM, checks the parent, execs CMD; returns
    only on a failure (1: the parent is gone; 2: usage; 127: CMD cannot be run)."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) < 3 or args[1] != "--" or not args[0].isdigit():
        print("usage: deathsig.py PARENT_PID -- CMD [ARG...]", file=sys.stderr)
        return 2
    die_with_parent(signal.SIGTERM)
    if os.getppid() != int(args[0]):
        return 1  # the parent ended before the signal was armed: it would never come
    command = args[2:]
    try:
        os.execvp(command[0], command)  # noqa: S606 - argv as given, no shell
    except OSError as error:
        print(f"deathsig: cannot run {command[0]}: {error}", file=sys.stderr)
    return 127


if __name__ == "__main__":
    sys.exit(main())
