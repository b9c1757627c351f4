"""The executors' script tests run each script under the shells a target may have: the
`sh` fixture and its helpers (tests/shells.py)."""

from ....shells import sh

__all__ = ["sh"]
