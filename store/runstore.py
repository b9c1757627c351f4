"""[`RunStore`]: the run store, one object over one Redis client, composed of the
parts in this package (targets, runs, the follow, stops and deadlines, the end of a
run, launches, retrievals, coordination, the ledger and its metrics, the webhooks'
delivery queue, save samples)."""

from __future__ import annotations

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from .base import translated
from .budgets import BudgetsMixin
from .continuations import ContinuationsMixin
from .coordination import CoordinationMixin
from .ending import EndingMixin
from .launches import LaunchesMixin
from .ledger import LedgerMixin
from .retrievals import RetrievalsMixin
from .targets import TargetsMixin
from .webhooks import WebhooksMixin

__all__ = ["RunStore"]


class RunStore(
    TargetsMixin,
    EndingMixin,
    LaunchesMixin,
    RetrievalsMixin,
    ContinuationsMixin,
    CoordinationMixin,
    LedgerMixin,
    WebhooksMixin,
    BudgetsMixin,
):
    """The run store over one Redis client (keys: `store.keys`).

    Thread-safe as far as the client is (a `redis.Redis` with its connection pool is);
    use one per process, never shared across fork. Works with `decode_responses`
    either way. Every method raises `StoreError` for a Redis failure; run ids are
    checked with `schemas.validate_run_id` (`InvalidRunId`, a `ValueError`).
    """

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

    @translated
    def ping(self) -> None:
        """Returns when Redis answers; raises `StoreError` otherwise."""
        self._r.ping()
