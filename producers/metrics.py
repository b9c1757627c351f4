"""The Prometheus endpoint of runwarden (`runwarden serve --metrics-port PORT`):
`GET /metrics` in the text exposition format, on loopback only, behind HTTP basic
auth with the credentials of Flower and the web view (the secrets directory's
`flower-basic-auth`, `user:password`): a process of this machine that does not hold
them gets 401, never the runs' states, targets and counts.

How the numbers are collected: the Celery workers are separate prefork processes,
so none of them holds them. Everything is read from the run store when the endpoint
is scraped:

- the counters and histograms that the workers keep there (`store.counters`, moved
  by the event seam `workers.notify` in the transaction that records each ledger
  event, and by the follow tick): cancels by cause, proof latency, deadline
  lateness, follow tick duration per target, retrievals by outcome and their bytes,
  runs ended, policy decisions, webhook deliveries, ledger events;
- the gauges, computed from the state itself: stops in flight by phase, runs by
  state (the sizes of the sets of runs by state, `Runs.count_by_state`: one round
  trip, no record read, however many runs), webhook deliveries waiting.

So the numbers survive a worker's restart and agree between scrapers; no
`prometheus_client` multiprocess directory is needed. When the store cannot be read,
a scrape answers `runwarden_store_up 0` and nothing else.
"""

from __future__ import annotations

import ipaddress
import logging
import secrets
import threading
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Final
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, make_wsgi_app
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.exposition import ThreadingWSGIServer
from prometheus_client.registry import Collector

from schemas import RunError, RunState, Settings, StopPhase
from schemas.metrics import METRICS, RUNS, STOPS_IN_FLIGHT, WEBHOOK_PENDING
from schemas.secrets import FLOWER_AUTH
from store import RunStore

from .basic_auth import credentials_match

__all__ = ["DEFAULT_METRICS_PORT", "MetricsServer", "StoreCollector", "serve_metrics"]

log = logging.getLogger("runwarden")

DEFAULT_METRICS_PORT: Final = 9464


def _bound(value: float) -> str:
    return "+Inf" if value == float("inf") else repr(float(value))


class StoreCollector(Collector):
    """Collects runwarden's metrics from `store` at each scrape."""

    def __init__(self, store: RunStore) -> None:
        self.store = store

    def collect(self) -> Iterator[Metric]:
        up = GaugeMetricFamily("runwarden_store_up", "Whether the run store could be read.")
        try:
            series = self.store.counters.series()
            stops = self.store.stops.in_progress()
            runs = self.store.runs.count_by_state()
            pending = self.store.webhooks.pending()
        except (RunError, ValueError) as error:
            log.warning("metrics: the run store cannot be read: %s", error)
            up.add_metric([], 0.0)
            yield up
            return
        up.add_metric([], 1.0)
        yield up
        for spec in METRICS:
            mine = [s for s in series if s.spec is spec]
            if spec.kind == "counter":
                counter = CounterMetricFamily(spec.name, spec.help, labels=spec.labels)
                for s in mine:
                    counter.add_metric(list(s.labels), s.value)
                if not spec.labels and not mine:
                    counter.add_metric([], 0.0)
                yield counter
                continue
            histogram = HistogramMetricFamily(spec.name, spec.help, labels=spec.labels)
            bounds = [*spec.buckets, float("inf")]
            for s in mine:
                cumulative, total = [], 0.0
                for bound, count in zip(bounds, s.buckets, strict=True):
                    total += count
                    cumulative.append((_bound(bound), total))
                histogram.add_metric(list(s.labels), cumulative, sum_value=s.sum)
            if not spec.labels and not mine:
                histogram.add_metric([], [(_bound(b), 0.0) for b in bounds], sum_value=0.0)
            yield histogram
        phases = Counter(str(stop.phase) for stop in stops)
        in_flight = GaugeMetricFamily(STOPS_IN_FLIGHT.name, STOPS_IN_FLIGHT.help, labels=["phase"])
        for phase in StopPhase:
            if phase.is_open:
                in_flight.add_metric([str(phase)], float(phases[str(phase)]))
        yield in_flight
        by_state = GaugeMetricFamily(RUNS.name, RUNS.help, labels=["state"])
        for state in RunState:
            by_state.add_metric([str(state)], float(runs.get(state, 0)))
        yield by_state
        yield GaugeMetricFamily(WEBHOOK_PENDING.name, WEBHOOK_PENDING.help, value=float(pending))


@dataclass
class MetricsServer:
    """A running metrics endpoint: where it listens, and how to stop it."""

    server: WSGIServer
    thread: threading.Thread
    host: str
    port: int

    def close(self) -> None:
        """Stops serving and closes the socket."""
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=5)


_Wsgi = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]


def _guarded(app: _Wsgi, credentials: str) -> _Wsgi:
    """`app` behind HTTP basic auth with `credentials` (`user:password`,
    `basic_auth.credentials_match`); anything else is answered 401 with a challenge."""
    user, _, password = credentials.encode().partition(b":")

    def guarded(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        header = environ.get("HTTP_AUTHORIZATION")
        if credentials_match(header if isinstance(header, str) else None, user, password):
            return app(environ, start_response)
        start_response(
            "401 Unauthorized",
            [("Content-Type", "text/plain"), ("WWW-Authenticate", 'Basic realm="runwarden"')],
        )
        return [b"authentication required\n"]

    return guarded


class _Quiet(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        """Scrapes are not logged."""


def serve_metrics(
    settings: Settings, host: str = "127.0.0.1", port: int = DEFAULT_METRICS_PORT
) -> MetricsServer:
    """Serves runwarden's metrics on `http://host:port/metrics` from a daemon thread
    of this process, and returns at once, behind the credentials of Flower and the
    web view (the secrets directory's `flower-basic-auth`, made when missing). `host`
    is a loopback address; port 0 picks a free port (see the returned `port`).

    Raises:
        ValueError: `host` is not a loopback address, or `port` is out of range.
        OSError: the port cannot be bound.
        SecretsError: the Redis password or the credentials cannot be read (or made)
            in the secrets directory.
    """
    try:
        loopback = ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = False
    if not loopback:
        raise ValueError(f"the metrics endpoint listens on loopback only, not {host[:80]!r}")
    if not 0 <= port <= 65535:
        raise ValueError(f"invalid port {port}")
    credentials, _ = settings.secrets.ensure(FLOWER_AUTH, f"runwarden:{secrets.token_urlsafe(24)}")
    registry = CollectorRegistry(auto_describe=False)
    registry.register(StoreCollector(RunStore.from_url(settings.store_url())))
    app = _guarded(make_wsgi_app(registry), credentials.get_secret_value())
    server = make_server(host, port, app, ThreadingWSGIServer, handler_class=_Quiet)
    thread = threading.Thread(target=server.serve_forever, name="metrics", daemon=True)
    thread.start()
    return MetricsServer(server, thread, host, server.server_port)
