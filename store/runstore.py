"""[`RunStore`]: the run store, one object over one Redis client holding one part per
concern of this package (runs, the follow, stops and deadlines, launches, targets,
retrievals, continuations, budgets, the ledger and its metrics, the webhooks'
delivery queue, coordination, health)."""

from __future__ import annotations

from typing import Any

import redis
from redis.backoff import ExponentialBackoff, NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError
from redis.exceptions import TimeoutError as RedisTimeoutError
from redis.retry import Retry
from redis.sentinel import MasterNotFoundError, Sentinel

from schemas import Settings
from schemas.sentinel import SentinelAddress, is_sentinel, parse_sentinel
from schemas.text import error_line

from .base import StoreBase, translated
from .budgets import Budgets
from .continuations import Continuations
from .coordination import Coordination
from .counters import Counters
from .follow import Follow
from .health import Health
from .launches import Launches
from .ledger import Ledger
from .retrievals import Retrievals
from .runs import Runs
from .stops import Stops
from .targets import Targets
from .webhooks import WebhookQueue

__all__ = ["RunStore"]


class RunStore(StoreBase):
    """The run store over one Redis client (keys: `store.keys`): one object per
    concern, each over the same client, keys, Lua scripts and bounds
    (`store.base.StorePart`); the steps that span several of them are the functions
    of `store.steps`.

    - `runs`: run records, their indexes and transitions (`store.runs.Runs`);
    - `follow`: followed runs, read offsets, log and metrics streams, progress
      (`store.follow.Follow`);
    - `stops`: open stops, their history and the deadline table (`store.stops.Stops`);
    - `launches`: launch keys, preparing runs, the start of a run
      (`store.launches.Launches`);
    - `targets`: signed target records (`store.targets.Targets`);
    - `retrievals`, `continuations`: the queues of pending retrievals and of waiting
      continuations (`store.retrievals`, `store.continuations`);
    - `budgets`: save samples and the workers' budget rules (`store.budgets.Budgets`);
    - `ledger`: the stop ledger (`store.ledger.Ledger`), which counts its events'
      metrics with `counters` (`store.counters.Counters`);
    - `webhooks`: the webhooks' delivery queue (`store.webhooks.WebhookQueue`);
    - `locks`: once-markers and token locks between workers
      (`store.coordination.Coordination`);
    - `health`: heartbeats, periodic task runs, Redis's memory and the health
      reading (`store.health.Health`).

    Thread-safe as far as the client is (a `redis.Redis` with its connection pool is);
    use one per process, never shared across fork. Works with `decode_responses`
    either way. Every method raises `StoreError` for a Redis failure; run ids are
    checked with `schemas.validate_run_id` (`InvalidRunId`, a `ValueError`).
    """

    def __init__(self, client: redis.Redis, prefix: str = "rw:", **options: Any) -> None:
        """The store over `client`, its keys under `prefix`; `options` as
        `StoreBase` takes them (caps, bounds, attempts)."""
        super().__init__(client, prefix, **options)
        self.runs = Runs(self)
        self.follow = Follow(self, self.runs)
        self.stops = Stops(self, self.runs)
        self.launches = Launches(self, self.follow)
        self.targets = Targets(self)
        self.retrievals = Retrievals(self)
        self.continuations = Continuations(self)
        self.budgets = Budgets(self, self.runs)
        self.webhooks = WebhookQueue(self)
        self.locks = Coordination(self)
        self.counters = Counters(self)
        self.ledger = Ledger(self, self.counters)
        self.health = Health(self)

    @classmethod
    def from_url(
        cls, url: str, prefix: str = "rw:", *, timeout_s: float | None = None, **options: Any
    ) -> RunStore:
        """A store on the Redis at `url` (`redis://`, `rediss://`, `unix://`, or
        `sentinel://`: the primary its sentinels name, `schemas.sentinel`), with
        bounded timeouts and one retry without backoff: a down Redis is a
        `StoreError` within seconds, never a hang. Behind Sentinel the retries wait
        for a failover (about 6 s, backing off: the sentinels see the primary down,
        then promote a replica; each new connection asks them where the primary is,
        each sentinel once, in turn, and a primary none names is a `StoreError`
        saying what each said). With `timeout_s`, every connect and every reply
        waits at most that long, without a retry (a health check, a heartbeat);
        behind Sentinel that is also each sentinel's connect and reply. `url` may
        hold a password: it is never logged. `options` go to the constructor (caps,
        bounds, replicas).

        Raises:
            ValueError: a `sentinel://` URL that does not parse.
        """
        if timeout_s is not None:
            bounded: dict[str, Any] = {
                "socket_timeout": timeout_s,
                "socket_connect_timeout": timeout_s,
                "retry": Retry(NoBackoff(), 0),
            }
        elif is_sentinel(url):
            bounded = {
                "socket_timeout": 10,
                "socket_connect_timeout": 2,
                "retry": Retry(ExponentialBackoff(cap=1.0, base=0.1), 10),
                "health_check_interval": 30,
            }
        else:
            bounded = {
                "socket_timeout": 10,
                "socket_connect_timeout": 5,
                "retry": Retry(NoBackoff(), 1),
                "health_check_interval": 30,
            }
        if is_sentinel(url):
            return cls(_sentinel_client(parse_sentinel(url), bounded), prefix, **options)
        return cls(redis.Redis.from_url(url, **bounded), prefix, **options)

    @classmethod
    def from_settings(cls, settings: Settings, prefix: str = "rw:") -> RunStore:
        """[`from_url`] on the settings' Redis, with their bounds: the line cap, the
        per-run byte budgets of the log and metrics streams, and the retention; and
        the replicas a deadline's write waits for (`Settings.min_replicas`)."""
        return cls.from_url(
            settings.store_url(),
            prefix,
            line_bytes=settings.log_line_bytes,
            log_bytes=settings.log_bytes_per_run,
            metrics_bytes=settings.metrics_bytes_per_run,
            retention_s=settings.retention_s,
            min_replicas=settings.min_replicas,
            wait_s=settings.redis_wait_s,
        )

    @translated
    def ping(self) -> None:
        """Returns when Redis answers; raises `StoreError` otherwise."""
        self._r.ping()


class _Sentinel(Sentinel):
    """redis-py's `Sentinel`, its [`discover_master`] failing with a message for
    people: which sentinel said what, without the clients' reprs."""

    def discover_master(self, service_name: str) -> tuple[str, int]:
        """The address of the primary of `service_name` as the first sentinel that
        names one up gives it (that sentinel is asked first next time). Each sentinel
        is asked once, in turn.

        Raises:
            MasterNotFoundError: no sentinel names a primary of `service_name` up:
                the message says, per sentinel, that it could not be reached (and
                why), answered with an error, knows no such master, or sees it
                down.
        """
        said: list[str] = []
        for number, sentinel in enumerate(self.sentinels):
            kwargs = sentinel.get_connection_kwargs()
            where = f"{kwargs.get('host')}:{kwargs.get('port')}"
            try:
                masters: dict[str, dict[str, Any]] = sentinel.sentinel_masters()  # type: ignore[assignment]
            except (RedisConnectionError, RedisTimeoutError) as error:
                said.append(f"{where} unreachable ({error_line(error)})")
                continue
            except RedisError as error:  # not a sentinel's answer: a proxy, a server
                said.append(f"{where} answered no sentinel's reply ({error_line(error)})")
                continue
            state = masters.get(service_name)
            if not state:
                said.append(f"{where} monitors no master {service_name!r}")
                continue
            if not self.check_master_state(state, service_name):  # type: ignore[no-untyped-call]
                said.append(f"{where} sees {service_name!r} down ({state.get('flags', '?')})")
                continue
            self.sentinels[0], self.sentinels[number] = sentinel, self.sentinels[0]
            return str(state["ip"]), int(state["port"])
        raise MasterNotFoundError(
            f"no sentinel names a primary for {service_name!r}: " + "; ".join(said)
        )


def _sentinel_client(address: SentinelAddress, bounded: dict[str, Any]) -> redis.Redis:
    """redis-py's client of the primary the sentinels of `address` name (asked again
    on each new connection, and when the one it holds turns out to be a replica),
    with `bounded`'s waits for the data servers and the sentinels alike.

    Finding the primary asks each sentinel once, in turn, until one names it: a
    sentinel that is down costs one failed connect (at most `socket_connect_timeout`),
    never a retry with backoff of its own; `bounded`'s retry (of the connection to the
    primary) is the only one, and asks the sentinels again each time. So with no
    retry, a primary nobody names is a `MasterNotFoundError` (a `ConnectionError`)
    after at most one connect and one reply per sentinel."""
    sentinel_kwargs: dict[str, Any] = {
        "socket_timeout": min(float(bounded["socket_timeout"]), 2.0),
        "socket_connect_timeout": bounded["socket_connect_timeout"],
        "retry": Retry(NoBackoff(), 0),
    }
    if address.sentinel_password is not None:
        sentinel_kwargs["password"] = address.sentinel_password
    sentinel = _Sentinel(list(address.sentinels), sentinel_kwargs=sentinel_kwargs)  # type: ignore[no-untyped-call]
    client: redis.Redis = sentinel.master_for(  # type: ignore[no-untyped-call]
        address.master,
        username=address.username,
        password=address.password,
        db=address.db,
        **bounded,
    )
    return client
