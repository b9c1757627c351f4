"""The `sh` fixture (tests/shells.py) for a test here that still runs a script under a
real shell. Such a test starts processes: its place is
tests/integration/workers/executors/ (docs/development.md)."""

from ....shells import (
    DEAD_PID,
    EXPECTED_BINARY,
    HOSTILE_DIR,
    HOSTILE_NAMES,
    SHELLS,
    Shell,
    crafted,
    group_alive,
    no_pwned,
    sh,
)

__all__ = [
    "DEAD_PID",
    "EXPECTED_BINARY",
    "HOSTILE_DIR",
    "HOSTILE_NAMES",
    "SHELLS",
    "Shell",
    "crafted",
    "group_alive",
    "no_pwned",
    "sh",
]
