"""Who sent a message: every task that changes something carries a signature by its
producer's key, so a worker knows who asked (a stop's `asked_by` comes from it) and
refuses anyone else. Target records are signed by the operator with another kind of
key (Ed25519, `schemas.target_sig`), so no message, no write to Redis and no worker
can define one.

The signed form, in the task's keyword arguments beside `body`:

    "auth": {"producer": "<name>", "id": "<the message's task id>", "at": <unix seconds>,
             "sig": "<hex>"}

where `sig` is HMAC-SHA256 with the producer's key (the UTF-8 bytes of its key file's
text without its final line end) over the UTF-8 bytes of

    "runwarden/2\\n" + <task name> + "\\n" + <task id> + "\\n" + <at, as a decimal
    integer> + "\\n" + <canonical body>

and the canonical body is the body as JSON with sorted keys, no whitespace, and every
non-ASCII character escaped (Python: `json.dumps(body, sort_keys=True,
separators=(",", ":"), ensure_ascii=True)`). The message is sent with that task id
(`send_task(..., task_id=...)`; a fresh UUID: [`new_task_id`]).

A signature older than the allowed age, or more than `FUTURE_SKEW_S` in the future,
is refused, and so is one made for another message than the one carrying it (its task
id): a signed body sent again under a new id is refused, so a launch captured from a
queue or Flower cannot start a second run. The same message delivered again (a
redelivery keeps its id) changes nothing more: every task is idempotent, and a launch
is keyed by its idempotency key, else by that id.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import math
import uuid
from collections.abc import Mapping
from typing import Any, Final

from pydantic import SecretStr

from .errors import BadRequest
from .secrets import PRODUCER_NAME

__all__ = [
    "FUTURE_SKEW_S",
    "OPERATOR",
    "WORKER",
    "Unauthenticated",
    "asked_by",
    "canonical",
    "new_task_id",
    "sign",
    "verify",
]

OPERATOR: Final = "operator"
"""The producer who runs the service: the CLI on its machine. Its key also signs
targets."""
WORKER: Final = "worker"
"""The workers and beat themselves: countdowns, fan-outs, the policies' requests."""
FUTURE_SKEW_S: Final = 300.0
"""How far in the future a signature's time may be (clocks differ), in seconds."""
_VERSION: Final = "runwarden/2"
_MAX_TASK_ID: Final = 200
"""Longest task id a signature may name (Celery's are 36-character UUIDs)."""


class Unauthenticated(BadRequest):
    """A message or a target record is not signed by a known producer (missing, a
    producer without a key here, a signature that does not match, too old)."""


def canonical(value: Any) -> str:
    """`value` as canonical JSON: sorted keys, no whitespace, ASCII only.

    Raises:
        ValueError, TypeError: for a value that is not plain JSON.
    """
    return json.dumps(
        value, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False
    )


def _mac(key: SecretStr, text: str) -> str:
    secret = key.get_secret_value().encode("utf-8")
    return hmac.new(secret, text.encode("utf-8"), hashlib.sha256).hexdigest()


def new_task_id() -> str:
    """A fresh task id for a message to sign and send (a random UUID, as Celery's)."""
    return str(uuid.uuid4())


def _text(task: str, task_id: str, at: int, body: Any) -> str:
    return f"{_VERSION}\n{task}\n{task_id}\n{at}\n{canonical(body)}"


def sign(
    task: str, body: Any, producer: str, key: SecretStr, *, at: float, task_id: str
) -> dict[str, Any]:
    """The `auth` argument of the message of task `task` with `body` and task id
    `task_id` (send it with that id), signed by `producer` with `key` at unix time
    `at`."""
    moment = math.floor(at)
    sig = _mac(key, _text(task, task_id, moment, body))
    return {"producer": producer, "id": task_id, "at": moment, "sig": sig}


def verify(
    task: str,
    body: Any,
    auth: Any,
    keys: Mapping[str, SecretStr],
    *,
    now: float,
    max_age_s: float,
    task_id: str | None,
) -> str:
    """The producer who signed `body` for `task` in the message `task_id`, after
    checking `auth` against its key in `keys`, that it was made for that message (its
    `id`), and the signature's age against `now` (at most `max_age_s` old, at most
    `FUTURE_SKEW_S` ahead).

    Raises:
        Unauthenticated: saying why, never the key or the signature.
    """
    if not isinstance(auth, Mapping):
        raise Unauthenticated(f"{task}: the message is not signed (no 'auth')")
    producer, at, sig = auth.get("producer"), auth.get("at"), auth.get("sig")
    if not isinstance(producer, str) or PRODUCER_NAME.fullmatch(producer) is None:
        raise Unauthenticated(f"{task}: 'auth.producer' is not a producer's name")
    if isinstance(at, bool) or not isinstance(at, int) or not isinstance(sig, str):
        raise Unauthenticated(f"{task}: 'auth' needs an integer 'at' and a string 'sig'")
    signed_id = auth.get("id")
    if not isinstance(signed_id, str) or not 0 < len(signed_id) <= _MAX_TASK_ID:
        raise Unauthenticated(
            f"{task}: 'auth' needs the message's task id ('id', {_VERSION}): sign it and "
            "send the message with it"
        )
    if signed_id != task_id:
        raise Unauthenticated(
            f"{task}: the signature of {producer!r} was made for another message "
            "(its task id): a signed message sent again under a new id is refused"
        )
    key = keys.get(producer)
    if key is None:
        raise Unauthenticated(f"{task}: producer {producer!r} has no key on this worker")
    if at < now - max_age_s or at > now + FUTURE_SKEW_S:
        raise Unauthenticated(f"{task}: the signature of {producer!r} is too old or in the future")
    try:
        text = _text(task, signed_id, at, body)
    except (TypeError, ValueError) as error:
        raise Unauthenticated(f"{task}: the body is not plain JSON") from error
    if not hmac.compare_digest(_mac(key, text), sig):
        raise Unauthenticated(f"{task}: the signature of {producer!r} does not match")
    return producer


def asked_by(producer: str, claimed: str) -> str:
    """Who asked for a stop, as recorded: the producer's own name, with what the body
    claims after it when that says more (`billing/nightly-cap`); the workers' own
    requests (a policy, a request found on the target) keep theirs."""
    if producer == WORKER:
        return claimed
    if claimed in ("", "api", producer):
        return producer
    return f"{producer}/{claimed}"[:100]
