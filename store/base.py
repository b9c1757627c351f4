"""What every part of the run store shares: the Redis client, the key builders, the Lua
scripts (loaded from `store/lua/*.lua`), and the translation of Redis errors.

Every Redis failure leaves a store method as `StoreError`, from the Redis error
(`raise ... from`): the [`translated`] decorator does it at this one edge.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from datetime import UTC, datetime
from importlib import resources
from typing import Any, Final, ParamSpec, TypeVar

import redis
from pydantic import BaseModel, ValidationError
from redis.commands.core import Script
from redis.exceptions import AuthenticationError, RedisError, ResponseError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from schemas import Conflict, StoreError, validation_message
from schemas.bounds import LOG_BYTES_PER_RUN, LOG_LINE_BYTES, METRICS_BYTES_PER_RUN, RETENTION_DAYS
from schemas.errors import NotReplicated

from .keys import Keys

__all__ = [
    "HISTORY_CAP",
    "LOG_CAP",
    "MAX_ATTEMPTS",
    "METRICS_CAP",
    "StoreBase",
    "StorePart",
    "aware",
    "load_model",
    "millis",
    "replace_model",
    "score",
    "seconds",
    "text",
    "translated",
]

LOG_CAP: Final = 10_000
"""Most lines of `job.log` kept per run (exactly; the byte budget may keep fewer)."""
METRICS_CAP: Final = 5_000
"""Most metrics records kept per run (exactly, as [`LOG_CAP`])."""
HISTORY_CAP: Final = 20
"""Closed stops kept per run."""
MAX_ATTEMPTS: Final = 64
"""Compare-and-set attempts before a write gives up with `Conflict`."""

_SCRIPTS: Final = (
    "create_run",
    "open_stop",
    "append_stream",
    "cas_stop",
    "close_stop",
    "claim_deadline",
    "follow",
    "unfollow",
    "extend_lock",
    "release_lock",
    "claim_delivery",
    "end_delivery",
    "retry_delivery",
)

_P = ParamSpec("_P")
_T = TypeVar("_T")
_M = TypeVar("_M", bound=BaseModel)


def lua(name: str) -> str:
    """The source of the store's Lua script `name` (`store/lua/<name>.lua`)."""
    return resources.files(__package__).joinpath("lua", f"{name}.lua").read_text("utf-8")


def _describe(operation: str, error: RedisError) -> str:
    if isinstance(error, AuthenticationError):
        return f"run store: Redis refused the credentials ({operation}): {error}"
    if isinstance(error, RedisTimeoutError):
        return f"run store: Redis did not answer in time ({operation}): {error}"
    if isinstance(error, RedisConnectionError):
        return f"run store: cannot reach Redis ({operation}): {error}"
    if isinstance(error, ResponseError):
        return f"run store: Redis refused {operation}: {error}"
    return f"run store: {operation} failed: {error}"


def translated(method: Callable[_P, _T]) -> Callable[_P, _T]:
    """Raises every Redis error of `method` as `StoreError`, from the Redis error."""
    operation = method.__qualname__

    @functools.wraps(method)
    def wrapper(*args: _P.args, **kwargs: _P.kwargs) -> _T:
        try:
            return method(*args, **kwargs)
        except RedisError as error:
            raise StoreError(_describe(operation, error)) from error

    return wrapper


def text(value: bytes | str) -> str:
    """A Redis reply as text (undecodable bytes replaced)."""
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value


def load_model(model: type[_M], raw: bytes | str, what: str) -> _M:
    """`raw` JSON as a `model`; `StoreError` naming `what` when it does not fit."""
    try:
        return model.model_validate_json(raw)
    except ValidationError as error:
        raise StoreError(
            f"run store: the stored {what} is unreadable ({validation_message(error)})"
        ) from error


def replace_model(model: _M, **changes: Any) -> _M:
    """A validated copy of `model` with `changes` (unlike `model_copy`, validates)."""
    return type(model).model_validate({**model.model_dump(), **changes})


def aware(moment: datetime) -> datetime:
    """`moment` in UTC; a naive datetime is taken to be UTC already."""
    return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)


def score(moment: datetime) -> float:
    """The sorted-set score of `moment`: unix seconds."""
    return moment.timestamp()


def seconds(value: float, what: str) -> float:
    """`value` when it is a finite, positive number of seconds, else `ValueError`."""
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not (math.isfinite(value) and value > 0)
    ):
        raise ValueError(f"{what} must be a positive number of seconds, not {value!r}")
    return float(value)


def millis(value: float, what: str) -> int:
    """[`seconds`] as whole milliseconds, rounded up, at least 1."""
    return max(1, math.ceil(seconds(value, what) * 1000))


class StoreBase:
    """The state every part of the store shares. Thread-safe as far as the client is
    (a `redis.Redis` with its connection pool is); one per process, never shared
    across fork. Works with `decode_responses` either way."""

    def __init__(
        self,
        client: redis.Redis,
        prefix: str = "rw:",
        *,
        log_cap: int = LOG_CAP,
        metrics_cap: int = METRICS_CAP,
        history_cap: int = HISTORY_CAP,
        max_attempts: int = MAX_ATTEMPTS,
        line_bytes: int = LOG_LINE_BYTES,
        log_bytes: int = LOG_BYTES_PER_RUN,
        metrics_bytes: int = METRICS_BYTES_PER_RUN,
        retention_s: float = RETENTION_DAYS * 86400.0,
        min_replicas: int = 0,
        wait_s: float = 1.0,
    ) -> None:
        """`log_cap` / `metrics_cap` entries and `log_bytes` / `metrics_bytes` bytes
        are kept of each run's log and metrics streams, each line at most
        `line_bytes` bytes; an ended run's follow data is kept `retention_s` seconds
        (`store.streams`, `store.ending`). With `min_replicas` above 0, each write a
        deadline depends on waits up to `wait_s` seconds for that many replicas
        ([`replicated`]).

        Raises:
            ValueError: a cap below 1, a line cap below 64 bytes, or a byte budget
                that does not hold two longest lines.
        """
        if min_replicas < 0:
            raise ValueError("min_replicas is 0 or more")
        if min(log_cap, metrics_cap, history_cap, max_attempts) < 1:
            raise ValueError("caps and attempts must be at least 1")
        if line_bytes < 64 or min(log_bytes, metrics_bytes) < 2 * line_bytes:
            raise ValueError(
                "the line cap is at least 64 bytes, and each byte budget holds two longest lines"
            )
        self.client = client
        self.prefix = prefix
        self.keys = Keys(prefix)
        # redis-py types every reply as `Awaitable[Any] | Any` (sync and async share
        # the command mixins); the replies are handled as Any here.
        self._r: Any = client
        self._log_cap = log_cap
        self._metrics_cap = metrics_cap
        self._history_cap = history_cap
        self._attempts = max_attempts
        self._line_bytes = line_bytes
        self._log_bytes = log_bytes
        self._metrics_bytes = metrics_bytes
        self._retention_ms = millis(retention_s, "retention")
        self._min_replicas = min_replicas
        self._wait_ms = millis(wait_s, "wait")
        self._scripts: dict[str, Script] = {
            name: client.register_script(lua(name)) for name in _SCRIPTS
        }

    def compare_and_set(
        self, keys: list[str], step: Callable[[Any], _T], conflict: str, run_id: str | None = None
    ) -> tuple[_T, list[Any]]:
        """Runs `step` as one optimistic transaction over `keys` (redis-py's
        `transaction`: WATCH `keys`, `step(pipe)` reads through the pipeline, then calls
        `pipe.multi()` and queues its writes, EXEC), again from the start while another
        writer changed a watched key in between, at most `max_attempts` times. A
        `step` that writes nothing calls `pipe.unwatch()` (or queues nothing) and
        returns. Returns what `step` returned (of its last, successful attempt) and
        EXEC's replies (empty when it queued nothing).

        `step` may run several times, so it must have no effect outside the pipeline.

        Raises:
            Conflict: `conflict` (about `run_id`), still losing to other writers after
                the bounded attempts; nothing was changed.
            Whatever `step` raises, nothing changed.
        """
        attempts = 0
        result: list[_T] = []

        def attempt(pipe: Any) -> None:
            nonlocal attempts
            attempts += 1
            if attempts > self._attempts:
                raise Conflict(conflict, run_id=run_id)
            result[:] = [step(pipe)]

        replies: list[Any] = self._r.transaction(attempt, *keys)
        return result[0], replies

    def replicated(self, what: str) -> None:
        """Returns once `min_replicas` replicas hold every write this process made
        before the call (nothing to wait for with `min_replicas` 0): one round trip
        of a write of its own (`P replicated`, incremented) and Redis's `WAIT` on the
        same connection, since `WAIT` counts only its own connection's writes, and
        the replication stream is in order, so a replica that acknowledged the
        later write holds the earlier ones. Call it after a write a deadline depends
        on (`what` names it, for the error).

        Raises:
            NotReplicated: fewer replicas acknowledged within `wait_s`, or Redis
                could not be asked (the write was done on the primary: it may or may
                not survive a failover; the caller takes it as failed and tries
                again).
        """
        if self._min_replicas == 0:
            return
        pipe = self._r.pipeline(transaction=False)
        pipe.incr(self.keys.replicated)
        pipe.wait(self._min_replicas, self._wait_ms)
        try:
            _, acknowledged = pipe.execute()
        except RedisError as error:
            raise NotReplicated(
                f"run store: {what}: its replication could not be checked: {error}"
            ) from error
        if int(acknowledged) < self._min_replicas:
            raise NotReplicated(
                f"run store: {what}: {acknowledged} of {self._min_replicas} replica(s) "
                f"acknowledged it within {self._wait_ms / 1000:g} s; it may be lost in a "
                "failover: try again"
            )

    def _script(self, name: str, keys: list[str], args: list[Any], client: Any = None) -> Any:
        """Runs the Lua script `name` (EVALSHA, loading it on first use); with a
        pipeline as `client`, queues it there."""
        return self._scripts[name](keys=keys, args=args, client=client)


class StorePart:
    """One concern of the store as an object of its own (`RunStore.runs`, ...), over
    what every concern shares with the others: the `shared` store's Redis client, its
    keys, its Lua scripts, its bounds and its compare-and-set. Thread-safe as far as
    the client is."""

    def __init__(self, shared: StoreBase) -> None:
        self.keys = shared.keys
        self._r: Any = shared._r
        self._script = shared._script
        self._compare_and_set = shared.compare_and_set
        self._replicated = shared.replicated
        self._log_cap = shared._log_cap
        self._metrics_cap = shared._metrics_cap
        self._history_cap = shared._history_cap
        self._attempts = shared._attempts
        self._line_bytes = shared._line_bytes
        self._log_bytes = shared._log_bytes
        self._metrics_bytes = shared._metrics_bytes
        self._retention_ms = shared._retention_ms
