"""The run store: the event pipeline's state in Redis, between `schemas` (pure shapes
and rules) and `workers` / `producers`, which both use it.

Everything it stores is JSON (pydantic `model_dump_json` / `model_validate_json` for
models, `json` for plain dicts); nothing is ever pickled. Secrets never reach it:
target configs holding secret-looking keys are refused. Keys are named in
[`store.keys`](keys.py); the atomic steps are Lua scripts in `store/lua/`.

Guarantees:

- Every change that must not be lost or applied twice is a compare-and-set: run
  records through WATCH/MULTI (redis-py's `transaction`, bounded retries, in one
  helper: `StoreBase.compare_and_set`), stops through one Lua script that
  writes only if the stored JSON is byte for byte the one the decision was made on,
  together with the stop's deadlines. A late or duplicate task therefore changes
  nothing, and two workers racing get one winner.
- A terminal run state is never overwritten by a later, different one.
- A run has at most one open stop, and an open stop has at most one pending deadline
  of each kind, added and removed in the same script that changes the stop.
- Redis stays bounded: each run's log and metrics streams keep at most an entry cap
  and a byte budget (each line at most a line cap), trimmed oldest first in the
  script that appends (`store.streams`); an ended run's follow data expires after
  the retention (`steps.end_run`), while its record and stop history stay. `RunStore.health.memory`
  reads Redis's use against its `maxmemory`.
- Every Redis failure is raised as `StoreError` (`raise ... from` the Redis error).
  The operation may then have been applied or not (the reply was lost): retrying
  never corrupts anything, since every write is a compare-and-set or idempotent, but
  a retried `Runs.create` / `Stops.open` may report the item as already there
  (`False`), and a retried `Follow.append_log` / `Follow.append_metrics` may append twice
  (`Follow.record_tail` never does). A stop opened that way still has its deadline in the
  sorted set, so `reconcile` fires it even if no countdown was scheduled.

Units: durations are seconds (float) unless the name says `_ms`; datetimes are
timezone-aware UTC (a naive one is taken as UTC); sorted-set scores are unix seconds.
Needs Redis >= 6.2 (exclusive XRANGE ranges); the Lua scripts run on a real server
and on fakeredis with `lupa` installed.

`store` imports `schemas`, never `workers` or `producers`.
"""

from __future__ import annotations

from .base import HISTORY_CAP, LOG_CAP, METRICS_CAP
from .budgets import PublishedRule
from .follow import LogEntry, MetricsEntry, Offsets, StreamBytes
from .keys import Keys
from .memory import MEMORY_WARN_FRACTION, MemoryUse
from .runstore import RunStore

__all__ = [
    "HISTORY_CAP",
    "LOG_CAP",
    "MEMORY_WARN_FRACTION",
    "METRICS_CAP",
    "Keys",
    "LogEntry",
    "MemoryUse",
    "MetricsEntry",
    "Offsets",
    "PublishedRule",
    "RunStore",
    "StreamBytes",
]
