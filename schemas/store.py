"""The run store: the event pipeline's state in Redis (DESIGN.md §3, §4; issue 4).

[`RunStore`] wraps a synchronous `redis.Redis` client. Everything it stores is JSON
(pydantic `model_dump_json` / `model_validate_json` for models, `json` for plain
dicts); nothing is ever pickled. Secrets never reach it: target configs holding
secret-looking keys are refused.

Guarantees:

- Every change that must not be lost or applied twice is a compare-and-set: run
  records through WATCH/MULTI (bounded retries), stops through one Lua script that
  writes only if the stored JSON is byte for byte the one the decision was made on,
  together with the stop's deadlines. A late or duplicate task therefore changes
  nothing, and two workers racing get one winner.
- A terminal run state is never overwritten by a later, different one.
- A run has at most one open stop, and an open stop has at most one pending deadline
  of each kind. A stop's deadlines are added and removed in the same script that
  changes its state, so a deadline is never lost between the two (only
  `remove_deadline`, the reconciler's, touches one alone).
- Every Redis failure is raised as [`StoreError`] (`raise ... from` the Redis
  error). The operation may then have been applied or not (the reply was lost):
  retrying never corrupts anything, since every write is a compare-and-set or
  idempotent, but a retried `create_run` / `open_stop` may report the item as
  already there (`False`), and a retried `append_log` / `append_metrics` may append
  twice (`record_tail` never does). A stop opened that way still has its deadline
  in the sorted set, so `reconcile` fires it even if no countdown was scheduled.

Key layout (`P` is the prefix, default `rw:`; `<id>` a run id, only `[a-z0-9_.-]`
as `schemas.ids` checks it, so never `:` or `|`; `<target>` a target name):

| key | type | holds |
| --- | --- | --- |
| `P targets` | hash | target name -> target config (JSON object) |
| `P run:<id>` | string | the run record (`RunRecord` JSON) |
| `P runs` | sorted set | run ids, score = `created` (unix seconds) |
| `P runs:t:<target>` | sorted set | the same, for one target |
| `P follow:targets` | set | targets with at least one followed run |
| `P follow:t:<target>` | set | ids of the followed runs of a target |
| `P offsets:<id>` | hash | `log`, `metrics`: byte offsets the follower has read to |
| `P stop:<id>` | string | the run's open stop (`StopState` JSON); absent when none |
| `P stops` | set | ids of the runs with an open stop |
| `P stops:h:<id>` | list | closed stops of the run (`StopState` JSON), newest first, capped |
| `P deadlines` | sorted set | `run_id|stop_id|kind`, score = due (unix seconds) |
| `P lease:<run_id|stop_id|kind>` | string | worker id holding a deadline (expires) |
| `P log:<id>` | stream | `l` = one line of `job.log` (capped, approximate) |
| `P metrics:<id>` | stream | `m` = one metrics record, JSON (capped, approximate) |
| `P progress:<id>` | hash | `Progress` fields, each a JSON value |
| `P once:<key>` | string | marker of an effect done once (expires) |
| `P retrievals` | sorted set | ids of runs with `artifacts` pending, score = next attempt |
| `P lock:<key>` | string | a lock holder's token (expires; its holder extends, releases) |

Units: durations are seconds (float) unless the name says `_ms`; datetimes are
timezone-aware UTC (a naive one is taken as UTC); sorted-set scores are unix
seconds. Needs Redis >= 6.2 (exclusive XRANGE ranges); the Lua scripts run on a
real server and on fakeredis with `lupa` installed.
"""

from __future__ import annotations

import functools
import json
import logging
import math
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any, Final, NamedTuple, ParamSpec, TypeVar

import redis
from pydantic import BaseModel, ValidationError
from redis.backoff import NoBackoff
from redis.exceptions import (
    AuthenticationError,
    RedisError,
    ResponseError,
    WatchError,
)
from redis.exceptions import (
    ConnectionError as RedisConnectionError,
)
from redis.exceptions import (
    TimeoutError as RedisTimeoutError,
)
from redis.retry import Retry

from .errors import Conflict, NotFound, NotRunning, StoreError, UnknownTarget
from .ids import validate_run_id
from .job import JobId
from .run import TERMINAL_STATES, Artifacts, ArtifactsPhase, RunRecord, RunState
from .snapshot import Snapshot, SnapshotReason
from .stops import Deadline, Progress, StopPhase, StopState, new_stop_id

__all__ = [
    "HISTORY_CAP",
    "LOG_CAP",
    "METRICS_CAP",
    "LogEntry",
    "MetricsEntry",
    "Offsets",
    "RunStore",
]

log = logging.getLogger(__name__)

LOG_CAP: Final = 10_000
"""Lines of `job.log` kept per run (approximately: Redis trims whole stream nodes, so
up to about 100 more may stay)."""
METRICS_CAP: Final = 5_000
"""Metrics records kept per run (approximately, as [`LOG_CAP`])."""
HISTORY_CAP: Final = 20
"""Closed stops kept per run."""
MAX_ATTEMPTS: Final = 64
"""Compare-and-set attempts before a write gives up with `Conflict`."""

_P = ParamSpec("_P")
_T = TypeVar("_T")
_M = TypeVar("_M", bound=BaseModel)

_RANK: Final = {RunState.PREPARING: 0, RunState.RUNNING: 1} | dict.fromkeys(TERMINAL_STATES, 2)
_PHASE_RANK: Final = {
    StopPhase.WAITING_PROOF: 0,
    StopPhase.WAITING_END: 1,
    StopPhase.CANCELLING: 2,
    StopPhase.DONE: 3,
}
_SECRET_KEY = re.compile(r"password|passphrase|secret|token|private_key", re.IGNORECASE)
_TARGET_KINDS: Final = frozenset({"local", "ssh"})


class LogEntry(NamedTuple):
    """One line of a run's log stream."""

    id: str
    """Stream entry id (`<ms>-<seq>`); pass it as `after_id` to read on."""
    line: str


class MetricsEntry(NamedTuple):
    """One metrics record of a run's metrics stream."""

    id: str
    record: dict[str, Any]


class Offsets(NamedTuple):
    """How far the follower has read a run's files on its target, in bytes."""

    log: int
    metrics: int


# --- Lua scripts ------------------------------------------------------------------
# Each one is atomic on the server. Scripts take every key they touch in KEYS.

_CREATE_RUN = """
if redis.call('SET', KEYS[1], ARGV[1], 'NX') then
  redis.call('ZADD', KEYS[2], ARGV[2], ARGV[3])
  redis.call('ZADD', KEYS[3], ARGV[2], ARGV[3])
  return 1
end
return 0
"""

# KEYS: stop, stops, deadlines, run. ARGV: stop json, run id, deadline member, score.
_OPEN_STOP = """
local run = redis.call('GET', KEYS[4])
if not run then return -1 end
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
local ok, record = pcall(cjson.decode, run)
if not ok or type(record) ~= 'table' or record['state'] ~= 'running' then return -2 end
redis.call('SET', KEYS[1], ARGV[1])
redis.call('SADD', KEYS[2], ARGV[2])
redis.call('ZADD', KEYS[3], ARGV[4], ARGV[3])
return 1
"""

# KEYS: stop, deadlines. ARGV: expected json, new json, n, n members to remove,
# then optionally a member to add and its score.
_CAS_STOP = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('SET', KEYS[1], ARGV[2])
local n = tonumber(ARGV[3])
for i = 1, n do redis.call('ZREM', KEYS[2], ARGV[3 + i]) end
if #ARGV >= 5 + n then redis.call('ZADD', KEYS[2], ARGV[5 + n], ARGV[4 + n]) end
return 1
"""

# KEYS: stop, stops, deadlines, history. ARGV: expected json, closed json, run id,
# history cap, proof member, end member.
_CLOSE_STOP = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('DEL', KEYS[1])
redis.call('SREM', KEYS[2], ARGV[3])
redis.call('ZREM', KEYS[3], ARGV[5], ARGV[6])
redis.call('LPUSH', KEYS[4], ARGV[2])
redis.call('LTRIM', KEYS[4], 0, tonumber(ARGV[4]) - 1)
return 1
"""

# KEYS: deadlines, lease. ARGV: member, worker id, lease ms.
_CLAIM = """
if not redis.call('ZSCORE', KEYS[1], ARGV[1]) then return 0 end
if redis.call('SET', KEYS[2], ARGV[2], 'NX', 'PX', ARGV[3]) then return 1 end
return 0
"""

# KEYS: followed set of the target, followed targets. ARGV: run id, target.
_FOLLOW = """
redis.call('SADD', KEYS[1], ARGV[1])
redis.call('SADD', KEYS[2], ARGV[2])
return 1
"""

_UNFOLLOW = """
local removed = redis.call('SREM', KEYS[1], ARGV[1])
if redis.call('SCARD', KEYS[1]) == 0 then redis.call('SREM', KEYS[2], ARGV[2]) end
return removed
"""


# KEYS: lock. ARGV: token, ttl ms. Extends the lock only while this token holds it.
_EXTEND_LOCK = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return 1
"""

# KEYS: lock. ARGV: token. Releases the lock only while this token holds it.
_RELEASE_LOCK = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('DEL', KEYS[1])
return 1
"""


# --- helpers ----------------------------------------------------------------------


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


def _translated(method: Callable[_P, _T]) -> Callable[_P, _T]:
    """Raises every Redis error of `method` as `StoreError`, from the Redis error."""
    operation = method.__name__

    @functools.wraps(method)
    def wrapper(*args: _P.args, **kwargs: _P.kwargs) -> _T:
        try:
            return method(*args, **kwargs)
        except RedisError as error:
            raise StoreError(_describe(operation, error)) from error

    return wrapper


def _text(value: bytes | str) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value


def _load(model: type[_M], raw: bytes | str, what: str) -> _M:
    try:
        return model.model_validate_json(raw)
    except ValidationError as error:
        first = error.errors()[0]
        raise StoreError(
            f"run store: the stored {what} is unreadable "
            f"({'.'.join(map(str, first['loc'])) or 'value'}: {first['msg']})"
        ) from error


def _replace(model: _M, **changes: Any) -> _M:
    """A validated copy of `model` with `changes` (unlike `model_copy`, validates)."""
    return type(model).model_validate({**model.model_dump(), **changes})


def _aware(moment: datetime) -> datetime:
    return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)


def _seconds(value: float, what: str) -> float:
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not (math.isfinite(value) and value > 0)
    ):
        raise ValueError(f"{what} must be a positive number of seconds, not {value!r}")
    return float(value)


def _millis(value: float, what: str) -> int:
    return max(1, math.ceil(_seconds(value, what) * 1000))


def _check_target_name(name: str) -> str:
    if not isinstance(name, str) or not 1 <= len(name) <= 64:
        raise ValueError("a target name is 1 to 64 characters")
    if any(ord(c) < 0x21 or ord(c) == 0x7F for c in name):
        raise ValueError(f"a target name cannot hold spaces or control characters: {name!r}")
    return name


def _secret_keys(value: Any, path: str = "") -> list[str]:
    found: list[str] = []
    if isinstance(value, Mapping):
        for key, item in value.items():
            where = f"{path}.{key}" if path else str(key)
            if _SECRET_KEY.search(str(key)):
                found.append(where)
            found += _secret_keys(item, where)
    elif isinstance(value, list | tuple):
        for index, item in enumerate(value):
            found += _secret_keys(item, f"{path}[{index}]")
    return found


def _target_json(config: Mapping[str, Any]) -> str:
    if not isinstance(config, Mapping):
        raise ValueError("a target config is a JSON object")
    if config.get("kind") not in _TARGET_KINDS:
        raise ValueError(f"a target's kind is 'local' or 'ssh', not {config.get('kind')!r}")
    secret = _secret_keys(config)
    if secret:
        raise ValueError(
            f"a target config cannot hold secrets ({', '.join(secret)}): use a key file "
            "or an ssh agent, named by path"
        )
    try:
        return json.dumps(config, allow_nan=False, sort_keys=True, separators=(",", ":"))
    except (TypeError, ValueError) as error:
        raise ValueError(f"a target config must be plain JSON: {error}") from error


def _finite(value: Any) -> Any:
    """`value` with every NaN or infinity replaced by None (strict JSON, as the job
    side writes them)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, Mapping):
        return {str(k): _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value


def _is_step(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**63


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _progress_fields(records: Sequence[Mapping[str, Any]]) -> dict[str, str]:
    """The `Progress` fields that `records` (in order) set, each as a JSON value."""
    fields: dict[str, Any] = {}
    for record in records:
        event, step = record.get("event"), record.get("step")
        if _is_number(record.get("time")):
            fields["time"] = float(record["time"])
        if event == "begin" and _is_step(record.get("max_steps")):
            fields["max_steps"] = record["max_steps"]
        elif event in ("log", "end") and _is_step(step):
            fields["step"] = step
            if event == "log" and _is_number(record.get("loss")):
                fields["loss"], fields["loss_step"] = float(record["loss"]), step
        if event == "end":
            fields["ended"] = True
    return {name: json.dumps(value) for name, value in fields.items()}


def _entries(reply: Any) -> list[tuple[str, dict[str, str]]]:
    """Stream entries from an XRANGE reply, or from an XREAD reply for one stream."""
    if isinstance(reply, dict):  # RESP3 XREAD
        reply = next(iter(reply.values()), [[]])[0] if reply else []
    elif (
        reply
        and isinstance(reply[0], list | tuple)
        and len(reply[0]) == 2
        and isinstance(reply[0][1], list)
    ):  # RESP2 XREAD: [[stream, entries]]
        reply = reply[0][1]
    out: list[tuple[str, dict[str, str]]] = []
    for entry_id, fields in reply or []:
        out.append((_text(entry_id), {_text(k): _text(v) for k, v in (fields or {}).items()}))
    return out


# --- the store --------------------------------------------------------------------


class RunStore:
    """The run store over one Redis client (see the module docstring for the keys).

    Thread-safe as far as the client is (a `redis.Redis` with its connection pool is);
    use one per process, never shared across fork. Works with `decode_responses`
    either way. Every method raises `StoreError` for a Redis failure; run ids are
    checked with `schemas.validate_run_id` (`InvalidRunId`, a `ValueError`).
    """

    def __init__(
        self,
        client: redis.Redis,
        prefix: str = "rw:",
        *,
        log_cap: int = LOG_CAP,
        metrics_cap: int = METRICS_CAP,
        history_cap: int = HISTORY_CAP,
        max_attempts: int = MAX_ATTEMPTS,
    ) -> None:
        if min(log_cap, metrics_cap, history_cap, max_attempts) < 1:
            raise ValueError("caps and attempts must be at least 1")
        self.client = client
        self.prefix = prefix
        # redis-py types every reply as `Awaitable[Any] | Any` (sync and async share
        # the command mixins); the replies are handled as Any here.
        self._r: Any = client
        self._log_cap = log_cap
        self._metrics_cap = metrics_cap
        self._history_cap = history_cap
        self._attempts = max_attempts
        self._create_run_script = client.register_script(_CREATE_RUN)
        self._open_stop_script = client.register_script(_OPEN_STOP)
        self._cas_stop_script = client.register_script(_CAS_STOP)
        self._close_stop_script = client.register_script(_CLOSE_STOP)
        self._claim_script = client.register_script(_CLAIM)
        self._follow_script = client.register_script(_FOLLOW)
        self._unfollow_script = client.register_script(_UNFOLLOW)
        self._extend_lock_script = client.register_script(_EXTEND_LOCK)
        self._release_lock_script = client.register_script(_RELEASE_LOCK)

    # --- keys -----------------------------------------------------------------------

    def _key(self, *parts: str) -> str:
        return self.prefix + ":".join(parts)

    def _run_key(self, run_id: str) -> str:
        return self._key("run", validate_run_id(run_id))

    def _stop_key(self, run_id: str) -> str:
        return self._key("stop", validate_run_id(run_id))

    @property
    def _deadlines(self) -> str:
        return self._key("deadlines")

    # --- health ---------------------------------------------------------------------

    @classmethod
    def from_url(cls, url: str, prefix: str = "rw:") -> RunStore:
        """A store on the Redis at `url` (`redis://`, `rediss://` or `unix://`), with
        bounded timeouts and one retry without backoff: a down Redis is a
        `StoreError` within seconds, never a hang. `url` may hold a password: it is
        never logged."""
        client = redis.Redis.from_url(
            url,
            socket_timeout=10,
            socket_connect_timeout=5,
            retry=Retry(NoBackoff(), 1),
            health_check_interval=30,
        )
        return cls(client, prefix)

    @_translated
    def ping(self) -> None:
        """Returns when Redis answers; raises `StoreError` otherwise."""
        self._r.ping()

    # --- targets --------------------------------------------------------------------

    @_translated
    def put_target(self, name: str, config: Mapping[str, Any]) -> None:
        """Adds or replaces target `name`.

        `config` is a JSON object: `kind` (`local` or `ssh`), `workdir`, and for ssh
        the destination fields (host, port, user, identity path, known_hosts path...).
        It is stored as given; its meaning belongs to the executors.

        Raises:
            ValueError: for a name that is empty, longer than 64 characters or holds
                spaces or control characters; a config that is not plain JSON, has no
                valid `kind`, or holds a key that looks like a secret (`password`,
                `passphrase`, `secret`, `token`, `private_key`, at any depth).
        """
        self._r.hset(self._key("targets"), _check_target_name(name), _target_json(config))

    @_translated
    def get_target(self, name: str) -> dict[str, Any]:
        """The config of target `name`. Raises `UnknownTarget` when there is none."""
        raw = self._r.hget(self._key("targets"), name)
        if raw is None:
            raise UnknownTarget(name)
        value: dict[str, Any] = json.loads(raw)
        return value

    @_translated
    def list_targets(self) -> dict[str, dict[str, Any]]:
        """Every target and its config, ordered by name."""
        raw = self._r.hgetall(self._key("targets"))
        items = {_text(name): json.loads(config) for name, config in raw.items()}
        return dict(sorted(items.items()))

    @_translated
    def remove_target(self, name: str) -> bool:
        """Forgets target `name`; whether it existed. Runs recorded on it keep its
        name (and stay followed): their target can be added again."""
        return bool(self._r.hdel(self._key("targets"), name))

    # --- runs -----------------------------------------------------------------------

    @_translated
    def create_run(self, record: RunRecord) -> bool:
        """Stores a new run record, atomically with its indexes. False (and nothing
        changed) when a run with this id already exists."""
        score = record.created.timestamp()
        done = self._create_run_script(
            keys=[
                self._run_key(record.id),
                self._key("runs"),
                self._key("runs", "t", record.target),
            ],
            args=[record.model_dump_json(), score, record.id],
        )
        return bool(done)

    @_translated
    def get_run(self, run_id: str) -> RunRecord:
        """The record of run `run_id`. Raises `NotFound` when there is none."""
        raw = self._r.get(self._run_key(run_id))
        if raw is None:
            raise NotFound(run_id)
        return _load(RunRecord, raw, f"record of run {run_id!r}")

    @_translated
    def get_runs(self, run_ids: Sequence[str]) -> list[RunRecord | None]:
        """The records of `run_ids`, in order, in one round trip (MGET); None for a run
        that does not exist. Raises `StoreError` for an unreadable record."""
        if not run_ids:
            return []
        raws = self._r.mget([self._run_key(run_id) for run_id in run_ids])
        return [
            None if raw is None else _load(RunRecord, raw, f"record of run {run_id!r}")
            for run_id, raw in zip(run_ids, raws, strict=True)
        ]

    @_translated
    def list_runs(
        self,
        target: str | None = None,
        states: Iterable[RunState] | None = None,
        limit: int | None = None,
    ) -> list[RunRecord]:
        """Runs, newest `created` first (equal times: by id, descending), of `target`
        when given, in one of `states` when given, at most `limit` of them."""
        index = self._key("runs") if target is None else self._key("runs", "t", target)
        wanted = None if states is None else {RunState(s) for s in states}
        if limit is not None and limit < 1:
            raise ValueError("limit must be at least 1")
        last = limit - 1 if wanted is None and limit is not None else -1
        ids = [_text(i) for i in self._r.zrevrange(index, 0, last)]
        runs: list[RunRecord] = []
        for start in range(0, len(ids), 500):
            chunk = ids[start : start + 500]
            for run_id, raw in zip(
                chunk, self._r.mget([self._run_key(i) for i in chunk]), strict=True
            ):
                if raw is None:
                    continue
                record = _load(RunRecord, raw, f"record of run {run_id!r}")
                if wanted is None or record.state in wanted:
                    runs.append(record)
                    if limit is not None and len(runs) >= limit:
                        return runs
        return runs

    @_translated
    def update_run(self, run_id: str, mutate: Callable[[RunRecord], RunRecord | None]) -> RunRecord:
        """Applies `mutate` to run `run_id` as one optimistic transaction (WATCH/MULTI)
        and returns the record stored after the call.

        `mutate` gets a fresh copy of the stored record and returns the new record,
        or None to leave it unchanged. It may be called several times (once per
        attempt, when another writer changed the record meanwhile), so it must not
        have side effects; an exception it raises propagates, nothing changed. The
        new record is validated; its `id` must not change (a changed `target` or
        `created` moves the run in the indexes).

        Raises:
            NotFound: no such run.
            Conflict: still losing to other writers after the bounded attempts.
            ValueError: the new record is invalid or changes the id.
        """
        return self._update(run_id, mutate)[0]

    def _update(
        self, run_id: str, mutate: Callable[[RunRecord], RunRecord | None]
    ) -> tuple[RunRecord, bool]:
        key = self._run_key(run_id)
        with self._r.pipeline(transaction=True) as pipe:
            for _ in range(self._attempts):
                try:
                    pipe.watch(key)
                    raw = pipe.get(key)
                    if raw is None:
                        raise NotFound(run_id)
                    current = _load(RunRecord, raw, f"record of run {run_id!r}")
                    new = mutate(current.model_copy(deep=True))
                    if new is None or new == current:
                        pipe.unwatch()
                        return current, False
                    new = RunRecord.model_validate_json(new.model_dump_json())
                    if new.id != run_id:
                        raise ValueError("update_run cannot change a run's id")
                    pipe.multi()
                    pipe.set(key, new.model_dump_json())
                    if new.artifacts != current.artifacts:
                        self._index_retrieval(pipe, new)
                    score = new.created.timestamp()
                    if new.target != current.target:
                        pipe.zrem(self._key("runs", "t", current.target), run_id)
                    pipe.zadd(self._key("runs"), {run_id: score})
                    pipe.zadd(self._key("runs", "t", new.target), {run_id: score})
                    pipe.execute()
                    return new, True
                except WatchError:
                    continue
        raise Conflict(
            f"run {run_id!r} is being changed by too many writers at once; try again",
            run_id=run_id,
        )

    def _index_retrieval(self, pipe: Any, record: RunRecord) -> None:
        """Keeps the retrieval queue in step with the record's `artifacts`, in the
        same transaction: pending -> queued at its next attempt; else not queued."""
        queue = self._key("retrievals")
        artifacts = record.artifacts
        if artifacts is not None and artifacts.phase is ArtifactsPhase.PENDING:
            due = artifacts.next_attempt or datetime.now(UTC)
            pipe.zadd(queue, {record.id: _score(_aware(due))})
        else:
            pipe.zrem(queue, record.id)

    @_translated
    def transition(
        self,
        run_id: str,
        to_state: RunState,
        *,
        message: str | None = None,
        snapshot: Snapshot | None = None,
        job: JobId | None = None,
        expect: set[RunState] | None = None,
    ) -> RunRecord:
        """Moves run `run_id` to `to_state` atomically and returns the stored record.
        Same as [`apply_transition`], without saying whether anything changed."""
        return self.apply_transition(
            run_id, to_state, message=message, snapshot=snapshot, job=job, expect=expect
        )[0]

    @_translated
    def apply_transition(
        self,
        run_id: str,
        to_state: RunState,
        *,
        message: str | None = None,
        snapshot: Snapshot | None = None,
        job: JobId | None = None,
        expect: set[RunState] | None = None,
    ) -> tuple[RunRecord, bool]:
        """Moves run `run_id` to `to_state` as one compare-and-set, and returns the
        stored record and whether this call changed it.

        Rules, checked against the stored record inside the transaction:

        1. A terminal record stays as it is: asking for the same terminal state again
           is a no-op (returns the record, False, whatever `expect` says; the first
           outcome's message and snapshot stay); a different state raises `Conflict`.
        2. `expect`, when given: the stored state must be one of these, else
           `Conflict`.
        3. States only move forward (`preparing -> running -> terminal`); going back
           raises `Conflict`.
        4. When the state changes, `message` replaces the message (None clears it);
           when it stays, a given `message` replaces it. `snapshot` and `job`
           replace theirs when given.

        To make an effect happen once ("the outcome is recorded by one worker"), act
        only when this returns True.

        Raises:
            NotFound: no such run.
            Conflict: by the rules above (nothing changed), or too many concurrent
                writers.
        """
        to_state = RunState(to_state)
        wanted = None if expect is None else {RunState(s) for s in expect}

        def mutate(current: RunRecord) -> RunRecord | None:
            if current.state in TERMINAL_STATES:
                if current.state is to_state:
                    return None
                raise Conflict(
                    f"run {run_id!r} already ended as {current.state}; it cannot become {to_state}",
                    run_id=run_id,
                    state=current.state,
                    wanted=to_state,
                )
            if wanted is not None and current.state not in wanted:
                shown = ", ".join(sorted(wanted))
                raise Conflict(
                    f"run {run_id!r} is {current.state}, not {shown}; "
                    f"it was not moved to {to_state}",
                    run_id=run_id,
                    state=current.state,
                    wanted=to_state,
                )
            if _RANK[to_state] < _RANK[current.state]:
                raise Conflict(
                    f"run {run_id!r} is {current.state}; it cannot go back to {to_state}",
                    run_id=run_id,
                    state=current.state,
                    wanted=to_state,
                )
            update: dict[str, Any] = {"state": to_state}
            if to_state is not current.state or message is not None:
                update["message"] = message
            if to_state is not current.state:
                # The policies' clock: a run's hours count from when it ran.
                if to_state is RunState.RUNNING:
                    update["started"] = datetime.now(UTC)
                elif to_state in TERMINAL_STATES:
                    update["ended"] = datetime.now(UTC)
                    if (job or current.job) is not None and current.artifacts is None:
                        # Queued with the end itself, in one transaction: no crash
                        # between the two can leave an ended run never retrieved.
                        update["artifacts"] = Artifacts(next_attempt=update["ended"])
            if snapshot is not None:
                update["snapshot"] = snapshot
            if job is not None:
                update["job"] = job
            return current.model_copy(update=update)

        return self._update(run_id, mutate)

    # --- followed runs ------------------------------------------------------------

    @_translated
    def follow(self, run_id: str) -> None:
        """Adds run `run_id` to the followed runs of its target (idempotent).
        Raises `NotFound` when there is no such run."""
        target = self.get_run(run_id).target
        self._follow_script(
            keys=[self._key("follow", "t", target), self._key("follow", "targets")],
            args=[run_id, target],
        )

    @_translated
    def unfollow(self, run_id: str) -> bool:
        """Stops following run `run_id`; whether it was followed. Its offsets are
        kept (following it again continues where it stopped). Raises `NotFound`
        when there is no such run."""
        target = self.get_run(run_id).target
        removed = self._unfollow_script(
            keys=[self._key("follow", "t", target), self._key("follow", "targets")],
            args=[run_id, target],
        )
        return bool(removed)

    @_translated
    def followed(self, target: str) -> list[str]:
        """Ids of the followed runs of `target`, sorted."""
        return sorted(_text(i) for i in self._r.smembers(self._key("follow", "t", target)))

    @_translated
    def followed_targets(self) -> list[str]:
        """Targets with at least one followed run, sorted."""
        return sorted(_text(t) for t in self._r.smembers(self._key("follow", "targets")))

    @_translated
    def get_offsets(self, run_id: str) -> Offsets:
        """How far the follower has read `job.log` and `metrics.jsonl` of run `run_id`,
        in bytes; (0, 0) before the first read."""
        log_raw, metrics_raw = self._r.hmget(
            self._key("offsets", validate_run_id(run_id)), ["log", "metrics"]
        )
        return Offsets(int(log_raw or 0), int(metrics_raw or 0))

    @_translated
    def get_offsets_many(self, run_ids: Sequence[str]) -> list[Offsets]:
        """[`get_offsets`] of each of `run_ids`, in order, in one round trip."""
        pipe = self._r.pipeline(transaction=False)
        for run_id in run_ids:
            pipe.hmget(self._key("offsets", validate_run_id(run_id)), ["log", "metrics"])
        return [Offsets(int(log or 0), int(metrics or 0)) for log, metrics in pipe.execute()]

    @_translated
    def set_offsets(self, run_id: str, log: int, metrics: int) -> None:
        """Records how far the follower has read (bytes, non-negative). Prefer
        [`record_tail`], which appends and advances at once."""
        offsets = _check_offsets(Offsets(log, metrics))
        self._r.hset(
            self._key("offsets", validate_run_id(run_id)),
            mapping={"log": offsets.log, "metrics": offsets.metrics},
        )

    @_translated
    def record_tail(
        self,
        run_id: str,
        *,
        lines: Sequence[str],
        records: Sequence[Mapping[str, Any]],
        from_offsets: Offsets,
        to_offsets: Offsets,
    ) -> bool:
        """Appends what the follower read and advances its offsets, all in one
        transaction, only if the stored offsets are still `from_offsets`. False (and
        nothing changed) when they are not: another follower already recorded that
        part, so lines are never appended twice.

        Raises:
            ValueError, TypeError: a record is not plain JSON, or an offset is negative.
            Conflict: still losing to other writers after the bounded attempts.
        """
        key = self._key("offsets", validate_run_id(run_id))
        expected, target = _check_offsets(from_offsets), _check_offsets(to_offsets)
        encoded = [_metrics_json(r) for r in records]
        with self._r.pipeline(transaction=True) as pipe:
            for _ in range(self._attempts):
                try:
                    pipe.watch(key)
                    log_raw, metrics_raw = pipe.hmget(key, ["log", "metrics"])
                    if Offsets(int(log_raw or 0), int(metrics_raw or 0)) != expected:
                        pipe.unwatch()
                        return False
                    pipe.multi()
                    self._queue_tail(pipe, run_id, lines, records, encoded)
                    pipe.hset(key, mapping={"log": target.log, "metrics": target.metrics})
                    pipe.execute()
                    return True
                except WatchError:
                    continue
        raise Conflict(f"the offsets of run {run_id!r} keep changing; try again", run_id=run_id)

    # --- stops ----------------------------------------------------------------------

    @_translated
    def open_stop(
        self,
        run_id: str,
        reason: SnapshotReason,
        asked_by: str,
        now: datetime,
        proof_timeout_s: float,
        *,
        replace_reason: bool = False,
    ) -> tuple[StopState, bool]:
        """Opens the stop of run `run_id`, or finds the one already open; returns it
        and whether this call opened it.

        - No open stop: creates one (a new random `stop_id`, phase `waiting_proof`,
          `proof_deadline = now + proof_timeout_s`) and adds its proof deadline to the
          deadlines set, atomically -> (stop, True). Schedule the proof countdown
          only then.
        - An open stop exists: no new stop and no new deadline -> (stop, False). Its
          reason stays the first one asked (DESIGN §7: a request already open is never
          asked twice), unless `replace_reason` is True, which changes only the reason
          (the seeds' "asking again changes nothing but the reason": pass it for a
          person's explicit `stop --reason`).

        Two callers racing get one stop: exactly one sees True. A new stop is opened
        only for a running run, checked in the same script (a caller's own check may
        be stale: the run may have ended since); the caller checks the rest
        (NotStarted / NoSnapshots).

        Raises:
            NotFound: no such run.
            NotRunning: no stop is open and the run is not running.
            ValueError: a bad `asked_by` (1-100 characters, no control characters) or
                a timeout that is not a positive number of seconds.
            Conflict: too many concurrent writers.
        """
        key = self._stop_key(run_id)
        reason = SnapshotReason(reason)
        asked_at = _aware(now)
        fresh = StopState(
            run_id=run_id,
            stop_id=new_stop_id(),
            phase=StopPhase.WAITING_PROOF,
            reason=reason,
            asked_by=asked_by,
            asked_at=asked_at,
            proof_deadline=asked_at + timedelta(seconds=_seconds(proof_timeout_s, "timeout")),
        )
        deadline = Deadline(
            run_id=run_id, stop_id=fresh.stop_id, kind="proof", due=fresh.proof_deadline
        )
        for _ in range(self._attempts):
            raw = self._r.get(key)
            if raw is not None:
                current = _load(StopState, raw, f"stop of run {run_id!r}")
                if not replace_reason or current.reason is reason:
                    return current, False
                changed = _replace(current, reason=reason)
                if self._cas_stop(raw, changed, remove=(), add=None):
                    return changed, False
                continue
            done = self._open_stop_script(
                keys=[key, self._key("stops"), self._deadlines, self._run_key(run_id)],
                args=[fresh.model_dump_json(), run_id, deadline.member, _score(deadline.due)],
            )
            if done == -1:
                raise NotFound(run_id)
            if done == -2:
                raise NotRunning(run_id, self.get_run(run_id).state)
            if done == 1:
                return fresh, True
        raise Conflict(f"the stop of run {run_id!r} keeps changing; try again", run_id=run_id)

    @_translated
    def get_stop(self, run_id: str) -> StopState | None:
        """The open stop of run `run_id`, or None."""
        raw = self._r.get(self._stop_key(run_id))
        return None if raw is None else _load(StopState, raw, f"stop of run {run_id!r}")

    @_translated
    def list_stops(self) -> list[StopState]:
        """Every open stop, oldest request first."""
        ids = sorted(_text(i) for i in self._r.smembers(self._key("stops")))
        if not ids:
            return []
        raws = self._r.mget([self._stop_key(i) for i in ids])
        stops = [
            _load(StopState, raw, f"stop of run {i!r}")
            for i, raw in zip(ids, raws, strict=True)
            if raw is not None
        ]
        return sorted(stops, key=lambda s: (s.asked_at, s.run_id))

    @_translated
    def stop_history(self, run_id: str) -> list[StopState]:
        """The closed stops of run `run_id`, newest first (at most the history cap)."""
        raws = self._r.lrange(self._key("stops", "h", validate_run_id(run_id)), 0, -1)
        return [_load(StopState, raw, f"closed stop of run {run_id!r}") for raw in raws]

    @_translated
    def advance_stop(
        self,
        run_id: str,
        stop_id: str,
        from_phase: StopPhase,
        to_phase: StopPhase,
        *,
        end_deadline: datetime | None = None,
        note: str | None = None,
    ) -> StopState | None:
        """Moves stop `stop_id` of run `run_id` from `from_phase` to `to_phase`, as one
        compare-and-set (a Lua script that writes only if the stored stop is the one
        read), and returns the new state; None, with nothing changed, when the open
        stop is not `stop_id` or not in `from_phase` (a late or duplicate task).

        The stop's deadlines move with it, in the same script: every pending deadline
        of this stop is removed, and when `end_deadline` is given it is recorded and
        added as the stop's `end` deadline. So: `waiting_proof -> waiting_end` with the
        end deadline; `-> cancelling` with an `end_deadline` if a cancel interrupted by
        a dead worker must be retried by `reconcile` (recommended: now + a grace
        period), without one otherwise. `to_phase` `done` closes the stop as
        [`close_stop`] does. `note` (when given) replaces the note.

        Raises:
            ValueError: `to_phase` goes backwards, `from_phase` is done, or
                `to_phase` is `waiting_end` without an `end_deadline`.
            Conflict: too many concurrent writers.
        """
        from_phase, to_phase = StopPhase(from_phase), StopPhase(to_phase)
        if from_phase is StopPhase.DONE or _PHASE_RANK[to_phase] < _PHASE_RANK[from_phase]:
            raise ValueError(f"a stop cannot go from {from_phase} to {to_phase}")
        if to_phase is StopPhase.WAITING_END and end_deadline is None:
            raise ValueError("a stop waiting for the job's end needs its end deadline")
        key = self._stop_key(run_id)
        for _ in range(self._attempts):
            raw = self._r.get(key)
            if raw is None:
                return None
            current = _load(StopState, raw, f"stop of run {run_id!r}")
            if current.stop_id != stop_id or current.phase is not from_phase:
                return None
            changes: dict[str, Any] = {"phase": to_phase}
            if note is not None:
                changes["note"] = note
            if to_phase is StopPhase.DONE:
                closed = _replace(current, closed_at=datetime.now(UTC), **changes)
                if self._archive_stop(raw, closed):
                    return closed
                continue
            add = None
            if end_deadline is not None:
                changes["end_deadline"] = _aware(end_deadline)
                add = Deadline(
                    run_id=run_id, stop_id=stop_id, kind="end", due=changes["end_deadline"]
                )
            changed = _replace(current, **changes)
            if self._cas_stop(raw, changed, remove=_members(current), add=add):
                return changed
        raise Conflict(f"the stop of run {run_id!r} keeps changing; try again", run_id=run_id)

    @_translated
    def close_stop(
        self,
        run_id: str,
        stop_id: str | None = None,
        note: str | None = None,
        *,
        now: datetime | None = None,
    ) -> StopState | None:
        """Closes the open stop of run `run_id` (only if it is `stop_id`, when given):
        phase `done`, `closed_at` = `now` (default: the current time), `note` when
        given; its deadlines removed, the stop archived in the run's stop history and
        no longer open, all in one script. Returns the closed stop; None, with
        nothing changed, when there is no open stop or it is another one.

        Raises:
            Conflict: too many concurrent writers.
        """
        key = self._stop_key(run_id)
        closed_at = _aware(now or datetime.now(UTC))
        for _ in range(self._attempts):
            raw = self._r.get(key)
            if raw is None:
                return None
            current = _load(StopState, raw, f"stop of run {run_id!r}")
            if stop_id is not None and current.stop_id != stop_id:
                return None
            changes: dict[str, Any] = {"phase": StopPhase.DONE, "closed_at": closed_at}
            if note is not None:
                changes["note"] = note
            closed = _replace(current, **changes)
            if self._archive_stop(raw, closed):
                return closed
        raise Conflict(f"the stop of run {run_id!r} keeps changing; try again", run_id=run_id)

    def _cas_stop(
        self,
        expected: bytes | str,
        new: StopState,
        *,
        remove: Sequence[str],
        add: Deadline | None,
    ) -> bool:
        args: list[Any] = [expected, new.model_dump_json(), len(remove), *remove]
        if add is not None:
            args += [add.member, _score(add.due)]
        done = self._cas_stop_script(keys=[self._stop_key(new.run_id), self._deadlines], args=args)
        return bool(done)

    def _archive_stop(self, expected: bytes | str, closed: StopState) -> bool:
        run_id = closed.run_id
        proof, end = _members(closed)
        done = self._close_stop_script(
            keys=[
                self._stop_key(run_id),
                self._key("stops"),
                self._deadlines,
                self._key("stops", "h", run_id),
            ],
            args=[expected, closed.model_dump_json(), run_id, self._history_cap, proof, end],
        )
        return bool(done)

    # --- deadlines ------------------------------------------------------------------

    @_translated
    def due_deadlines(self, now: datetime, limit: int = 100) -> list[Deadline]:
        """Pending deadlines due at or before `now`, earliest first (at most `limit`).
        A deadline stays pending until its stop moves on or closes, or it is
        removed; [`claim_deadline`] keeps two reconcilers from firing it at once."""
        if limit < 1:
            raise ValueError("limit must be at least 1")
        reply = self._r.zrangebyscore(
            self._deadlines, "-inf", _score(_aware(now)), start=0, num=limit, withscores=True
        )
        return self._deadlines_of(reply)

    @_translated
    def pending_deadlines(self, limit: int = 1000) -> list[Deadline]:
        """Every pending deadline, earliest first (at most `limit`)."""
        reply = self._r.zrange(self._deadlines, 0, limit - 1, withscores=True)
        return self._deadlines_of(reply)

    def _deadlines_of(self, reply: Any) -> list[Deadline]:
        deadlines: list[Deadline] = []
        for member, score in reply:
            text = _text(member)
            try:
                deadlines.append(Deadline.from_member(text, datetime.fromtimestamp(score, UTC)))
            except ValueError:
                # Written by something other than this store: it names no stop, and
                # left there it would come back on every call.
                log.warning("dropping malformed deadline member %r", text[:200])
                self._r.zrem(self._deadlines, member)
        return deadlines

    @_translated
    def claim_deadline(self, deadline: Deadline, worker_id: str, lease_s: float) -> bool:
        """Takes the lease on `deadline` for `lease_s` seconds, atomically; True when
        this caller got it. False when the deadline is no longer pending or another
        worker holds a lease on it: only the holder fires it. The lease is not
        released early: it expires (keep `lease_s` short, a little longer than it
        takes to hand the deadline to its task)."""
        if not worker_id:
            raise ValueError("a worker id is not empty")
        done = self._claim_script(
            keys=[self._deadlines, self._key("lease", deadline.member)],
            args=[deadline.member, worker_id, _millis(lease_s, "lease")],
        )
        return bool(done)

    @_translated
    def remove_deadline(self, deadline: Deadline) -> bool:
        """Removes `deadline` from the pending ones; whether it was pending. The stop's
        own state is not changed (use [`advance_stop`] / [`close_stop`] for that)."""
        return bool(self._r.zrem(self._deadlines, deadline.member))

    # --- log and metrics streams ------------------------------------------------------

    @_translated
    def append_log(self, run_id: str, lines: Sequence[str]) -> str | None:
        """Appends `lines` (one stream entry each, in order) to the run's log stream,
        trimmed to about the log cap; returns the last entry id, None for no lines.
        Text that cannot be encoded as UTF-8 (lone surrogates) is replaced by `?`."""
        return self._append(run_id, lines, [], [])

    @_translated
    def append_metrics(self, run_id: str, records: Sequence[Mapping[str, Any]]) -> str | None:
        """Appends metrics `records` (in order) to the run's metrics stream, trimmed to
        about the metrics cap, and updates its [`Progress`] in the same transaction;
        returns the last entry id, None for no records. NaN and infinities are stored
        as null (strict JSON, as the job side writes them).

        Raises:
            ValueError, TypeError: a record is not plain JSON (nothing appended).
        """
        return self._append(run_id, [], records, [_metrics_json(r) for r in records])

    def _append(
        self,
        run_id: str,
        lines: Sequence[str],
        records: Sequence[Mapping[str, Any]],
        encoded: Sequence[str],
    ) -> str | None:
        validate_run_id(run_id)
        if not lines and not records:
            return None
        with self._r.pipeline(transaction=True) as pipe:
            self._queue_tail(pipe, run_id, lines, records, encoded)
            replies = pipe.execute()
        ids = [r for r in replies if isinstance(r, bytes | str)]
        return _text(ids[-1]) if ids else None

    def _queue_tail(
        self,
        pipe: Any,
        run_id: str,
        lines: Sequence[str],
        records: Sequence[Mapping[str, Any]],
        encoded: Sequence[str],
    ) -> None:
        log_key, metrics_key = self._key("log", run_id), self._key("metrics", run_id)
        for line in lines:
            data = line.encode("utf-8", "replace")
            pipe.xadd(log_key, {"l": data}, maxlen=self._log_cap, approximate=True)
        for text in encoded:
            pipe.xadd(metrics_key, {"m": text}, maxlen=self._metrics_cap, approximate=True)
        fields = _progress_fields(records)
        if fields:
            pipe.hset(self._key("progress", run_id), mapping=fields)

    @_translated
    def read_log(
        self,
        run_id: str,
        after_id: str = "0-0",
        count: int = 1000,
        block_ms: int | None = None,
    ) -> list[LogEntry]:
        """Up to `count` log lines after entry `after_id`, oldest first. With
        `block_ms`, waits up to that long for a line when there is none yet (the
        client's `socket_timeout` must be longer). Lines trimmed by the cap are gone."""
        entries = self._read(self._key("log", validate_run_id(run_id)), after_id, count, block_ms)
        return [LogEntry(i, fields.get("l", "")) for i, fields in entries]

    @_translated
    def read_metrics(
        self,
        run_id: str,
        after_id: str = "0-0",
        count: int = 1000,
        block_ms: int | None = None,
    ) -> list[MetricsEntry]:
        """Up to `count` metrics records after entry `after_id`, oldest first; as
        [`read_log`]."""
        key = self._key("metrics", validate_run_id(run_id))
        out: list[MetricsEntry] = []
        for entry_id, fields in self._read(key, after_id, count, block_ms):
            try:
                record = json.loads(fields.get("m", ""))
            except ValueError as error:
                raise StoreError(
                    f"run store: metrics entry {entry_id} of run {run_id!r} is not JSON"
                ) from error
            out.append(MetricsEntry(entry_id, record))
        return out

    def _read(
        self, key: str, after_id: str, count: int, block_ms: int | None
    ) -> list[tuple[str, dict[str, str]]]:
        if count < 1:
            raise ValueError("count must be at least 1")
        if block_ms is not None:
            return _entries(self._r.xread({key: after_id}, count=count, block=block_ms))
        return _entries(self._r.xrange(key, f"({after_id}", "+", count=count))

    @_translated
    def last_metrics(self, run_id: str) -> Progress | None:
        """The run's progress from every metrics record appended so far (kept apart
        from the capped stream, so `max_steps` of the `begin` line survives the
        trimming); None before the first record."""
        raw = self._r.hgetall(self._key("progress", validate_run_id(run_id)))
        if not raw:
            return None
        try:
            data = {_text(k): json.loads(v) for k, v in raw.items()}
            return Progress.model_validate(data)
        except (ValueError, ValidationError) as error:
            raise StoreError(f"run store: the progress of run {run_id!r} is unreadable") from error

    # --- retrievals -------------------------------------------------------------------

    @_translated
    def schedule_retrieval(self, run_id: str, at: datetime) -> None:
        """Marks the artifacts of run `run_id` as to be retrieved at `at` (or moves its
        next attempt there). Durable: [`due_retrievals`] returns it until
        [`drop_retrieval`]."""
        self._r.zadd(self._key("retrievals"), {validate_run_id(run_id): _score(_aware(at))})

    @_translated
    def due_retrievals(self, now: datetime, limit: int = 100) -> list[str]:
        """Ids of the runs whose retrieval is due at or before `now`, earliest first."""
        if limit < 1:
            raise ValueError("limit must be at least 1")
        reply = self._r.zrangebyscore(
            self._key("retrievals"), "-inf", _score(_aware(now)), start=0, num=limit
        )
        return [_text(member) for member in reply]

    @_translated
    def pending_retrievals(self, limit: int = 1000) -> list[tuple[str, datetime]]:
        """Every scheduled retrieval with its next attempt, earliest first."""
        reply = self._r.zrange(self._key("retrievals"), 0, limit - 1, withscores=True)
        return [(_text(m), datetime.fromtimestamp(score, UTC)) for m, score in reply]

    @_translated
    def drop_retrieval(self, run_id: str) -> bool:
        """Removes run `run_id` from the scheduled retrievals; whether it was there."""
        return bool(self._r.zrem(self._key("retrievals"), validate_run_id(run_id)))

    # --- idempotency ------------------------------------------------------------------

    @_translated
    def once(self, key: str, ttl_s: float) -> bool:
        """True for the first caller of `key` within `ttl_s` seconds, False for every
        later one (SET NX with expiry). Guard an effect that must happen once with a
        key naming it ("cancel:<run_id>:<stop_id>"); keep `ttl_s` longer than any
        redelivery of the task. The marker is taken before the effect: if the effect
        then fails, delete nothing and let the caller decide (or use [`forget`])."""
        if not key:
            raise ValueError("a once key is not empty")
        return bool(self._r.set(self._key("once", key), "1", nx=True, px=_millis(ttl_s, "ttl")))

    @_translated
    def lock(self, key: str, token: str, ttl_s: float) -> bool:
        """Takes the lock `key` for the holder `token` (random, one per holder) for
        `ttl_s` seconds; True when taken. Unlike [`once`], only its holder can extend
        ([`extend_lock`]) or release ([`unlock`]) it."""
        if not key or not token:
            raise ValueError("a lock key and token are not empty")
        return bool(self._r.set(self._key("lock", key), token, nx=True, px=_millis(ttl_s, "ttl")))

    @_translated
    def extend_lock(self, key: str, token: str, ttl_s: float) -> bool:
        """Moves the lock's expiry `ttl_s` seconds ahead; False when `token` no longer
        holds it (it lapsed, and maybe another holder took it)."""
        return bool(
            self._extend_lock_script(
                keys=[self._key("lock", key)], args=[token, _millis(ttl_s, "ttl")]
            )
        )

    @_translated
    def unlock(self, key: str, token: str) -> bool:
        """Releases the lock if `token` still holds it; whether it did."""
        return bool(self._release_lock_script(keys=[self._key("lock", key)], args=[token]))

    @_translated
    def forget(self, key: str) -> bool:
        """Removes the marker of [`once`] `key` (so the effect may happen again, e.g.
        after it failed); whether it existed."""
        return bool(self._r.delete(self._key("once", key)))


def _score(moment: datetime) -> float:
    return moment.timestamp()


def _members(stop: StopState) -> tuple[str, str]:
    """The sorted-set members of both deadlines a stop may have."""
    base = f"{stop.run_id}|{stop.stop_id}|"
    return base + "proof", base + "end"


def _check_offsets(offsets: Offsets) -> Offsets:
    for value in offsets:
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"an offset is a non-negative integer, not {value!r}")
    return Offsets(*offsets)


def _metrics_json(record: Mapping[str, Any]) -> str:
    if not isinstance(record, Mapping):
        raise TypeError(f"a metrics record is a JSON object, not {type(record).__name__}")
    return json.dumps(_finite(record), allow_nan=False, separators=(",", ":"))
