"""The idempotency key of a launch: the name a producer gives one launch, so that the
same launch delivered again (a redelivered message, a producer that publishes again)
finds the run it started instead of starting a second job.

A key ends up in a Redis key name (`store.keys`), in the `.claim` file of the run
directory on the target, and in logs, so it is one safe token: 1 to
[`LAUNCH_KEY_MAX_LEN`] ASCII letters, digits, `_`, `.` and `-`, starting with a
letter or a digit. Never `:`, `|`, `/`, a space, a quote, a newline or a shell
metacharacter. It is not a secret: anyone who can read the store can see it.

Keys belong to their producer: the key a launch is stored and locked under is the
producer's own ([`owned_launch_key`], from the producer who signed the message, never
from the body), so no producer can reach a run another launched, or launch into a key
the service derives for itself (a preempted run's continuation, `continue.<run id>`,
is the workers' own: `worker_continue.<run id>`).
"""

from __future__ import annotations

import hashlib
import re
import secrets
from typing import Annotated, Final

from pydantic import AfterValidator

from .errors import SchemaError
from .secrets import PRODUCER_NAME

__all__ = [
    "LAUNCH_KEY_MAX_LEN",
    "LaunchKey",
    "adopt_key",
    "new_launch_key",
    "owned_launch_key",
    "task_launch_key",
    "validate_launch_key",
]

LAUNCH_KEY_MAX_LEN: Final = 128
_KEY: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")
_TASK_PREFIX: Final = "task-"


def validate_launch_key(text: str) -> str:
    """Returns `text` when it is a valid launch key (module docstring), else raises.

    Raises:
        SchemaError: (a `ValueError`) naming the offending text (repr, cut to 80
            characters).
    """
    if not isinstance(text, str):
        raise SchemaError(f"a launch key is a string, not {type(text).__name__}")
    if len(text) > LAUNCH_KEY_MAX_LEN or _KEY.fullmatch(text) is None:
        raise SchemaError(
            f"invalid launch key {text[:80]!r}: use 1-{LAUNCH_KEY_MAX_LEN} ASCII letters, "
            "digits, '_', '.' or '-', starting with a letter or digit"
        )
    return text


LaunchKey = Annotated[str, AfterValidator(validate_launch_key)]
"""A string validated by [`validate_launch_key`] wherever a model holds a launch key."""


def new_launch_key() -> str:
    """A fresh random launch key (128 random bits, hex): what a producer uses when its
    caller gave none."""
    return secrets.token_hex(16)


def adopt_key(task_id: str) -> str:
    """The key of the adoption (`runwarden.follow` of a directory) in the message
    `task_id`, as [`task_launch_key`] makes a launch's but `adopt-...`: a redelivered
    adoption finds the run it made, and no launch's key is ever one.

    Raises:
        SchemaError: for an empty task id.
    """
    return _derived("adopt-", task_id)


def task_launch_key(task_id: str) -> str:
    """The launch key of a launch message that carries none, derived from the message's
    own task id (a redelivered message keeps its id, so it gets the same key):
    `task-<id>` when that is a valid key, else `task-<sha256 of the id, hex>` (Celery
    accepts any string as a task id).

    Raises:
        SchemaError: for an empty task id (no message to derive a key from).
    """
    return _derived(_TASK_PREFIX, task_id)


def _derived(prefix: str, task_id: str) -> str:
    if not isinstance(task_id, str) or not task_id:
        raise SchemaError("a launch key needs a task id to derive it from")
    key = prefix + task_id
    if len(key) <= LAUNCH_KEY_MAX_LEN and _KEY.fullmatch(key) is not None:
        return key
    return prefix + hashlib.sha256(task_id.encode("utf-8", "surrogatepass")).hexdigest()


def owned_launch_key(producer: str, key: str) -> str:
    """The key the launch with idempotency key `key`, signed by `producer`, is stored
    and locked under: `<producer>_<key>`, or `<producer>_sha256-<hex of key>` when that
    would be longer than [`LAUNCH_KEY_MAX_LEN`]. A producer's name holds no `_` (`[a-z]
    [a-z0-9-]{0,31}`, `schemas.secrets.PRODUCER_NAME`), so its first `_` says whose a
    stored key is, and two producers never share one.

    Raises:
        SchemaError: for a `key` that is no launch key, or a `producer` that is no
            producer's name.
    """
    validate_launch_key(key)
    if not isinstance(producer, str) or PRODUCER_NAME.fullmatch(producer) is None:
        raise SchemaError(f"invalid producer name {str(producer)[:40]!r}")
    owned = f"{producer}_{key}"
    if len(owned) <= LAUNCH_KEY_MAX_LEN:
        return owned
    return f"{producer}_sha256-{hashlib.sha256(key.encode()).hexdigest()}"
