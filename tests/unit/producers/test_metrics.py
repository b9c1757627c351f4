"""`producers.metrics`: the exposition computed from the run store at scrape time
(the gauges from the state, the counters and histograms the workers keep there),
parsed back with prometheus_client's own parser; the endpoint serves it on loopback
only, and says when the store cannot be read."""

from __future__ import annotations

import base64
import urllib.error
import urllib.request
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import fakeredis
import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from bench.harness.redis_server import RedisServer
from producers.metrics import StoreCollector, serve_metrics
from schemas import JobId, RunRecord, RunState, Settings, SnapshotReason, StopPhase
from schemas.ledger import CancelDecided, ProofSeen, StopOpened
from schemas.metrics import event_samples
from schemas.secrets import FLOWER_AUTH
from store import RunStore

NOW = datetime.now(UTC)


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of an exposition, by name and sorted labels."""
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def scrape(store: RunStore) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(StoreCollector(store))
    return samples(generate_latest(registry).decode())


def running(store: RunStore, run_id: str) -> None:
    assert store.runs.create(RunRecord(id=run_id, target="local", created=NOW,
                                      remote_dir=f"/w/{run_id}"))  # fmt: skip
    store.runs.transition(run_id, RunState.RUNNING, job=JobId(dir=f"/w/{run_id}", pid=4242))


@pytest.fixture
def store() -> Iterator[RunStore]:
    client = fakeredis.FakeRedis(server=fakeredis.FakeServer())
    yield RunStore(client)
    client.close()


def test_the_gauges_are_read_from_the_state_at_scrape_time(store: RunStore) -> None:
    before = scrape(store)
    assert before[("runwarden_store_up", ())] == 1.0
    assert before[("runwarden_stops_in_flight", (("phase", "waiting_proof"),))] == 0.0
    assert before[("runwarden_runs", (("state", "running"),))] == 0.0
    for run_id in ("a", "b", "c"):
        running(store, run_id)
    store.stops.open("a", SnapshotReason.REQUESTED, "cli", NOW, 60)
    stop, _ = store.stops.open("b", SnapshotReason.DISK, "policy:disk", NOW, 60)
    store.stops.advance("b", stop.stop_id, StopPhase.WAITING_PROOF, StopPhase.WAITING_END,
                       end_deadline=NOW + timedelta(seconds=30))  # fmt: skip
    store.runs.transition("c", RunState.FAILED)
    after = scrape(store)
    assert after[("runwarden_stops_in_flight", (("phase", "waiting_proof"),))] == 1.0
    assert after[("runwarden_stops_in_flight", (("phase", "waiting_end"),))] == 1.0
    assert after[("runwarden_stops_in_flight", (("phase", "cancelling"),))] == 0.0
    assert after[("runwarden_runs", (("state", "running"),))] == 2.0
    assert after[("runwarden_runs", (("state", "failed"),))] == 1.0


def test_counters_and_histograms_are_the_stored_ones(store: RunStore) -> None:
    running(store, "a")
    stop, _ = store.stops.open("a", SnapshotReason.REQUESTED, "cli", NOW, 60)
    late = NOW + timedelta(seconds=62)
    for event in (
        StopOpened.of(stop),
        CancelDecided.of(stop, "no proof", late),
        ProofSeen(
            run_id="a",
            stop_id=stop.stop_id,
            at=NOW + timedelta(seconds=7),
            step=4,
            checkpoint="output/checkpoint-4",
            asked_at=NOW,
        ),  # at the run's end
    ):
        store.ledger.record(event, event_samples(event))
    got = scrape(store)
    assert got[("runwarden_cancels_total", (("cause", "proof_timeout"),))] == 1.0
    assert got[("runwarden_ledger_events_total", (("kind", "stop_opened"),))] == 1.0
    assert got[("runwarden_proof_latency_seconds_count", ())] == 1.0
    assert got[("runwarden_proof_latency_seconds_sum", ())] == 7.0
    assert got[("runwarden_proof_latency_seconds_bucket", (("le", "5.0"),))] == 0.0
    assert got[("runwarden_proof_latency_seconds_bucket", (("le", "10.0"),))] == 1.0
    assert got[("runwarden_proof_latency_seconds_bucket", (("le", "+Inf"),))] == 1.0
    lateness = "runwarden_deadline_lateness_seconds_bucket"
    assert got[(lateness, (("deadline", "proof"), ("le", "1.0")))] == 0.0
    assert got[(lateness, (("deadline", "proof"), ("le", "2.0")))] == 1.0
    assert got[("runwarden_retrieved_bytes_total", ())] == 0.0


def test_a_store_that_cannot_be_read_says_so(store: RunStore) -> None:
    store.client.set(store.keys.stop("a"), "not json")
    store.client.sadd(store.keys.stops, "a")
    got = scrape(store)
    assert got == {("runwarden_store_up", ()): 0.0}


def test_the_endpoint_serves_on_loopback_only_behind_the_credentials(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    settings = Settings(redis_url=redis_server.url, state_dir=tmp_path / "state")
    for host in ("0.0.0.0", "192.168.1.1", "example.org", "::"):  # noqa: S104 - refused
        with pytest.raises(ValueError, match="loopback only"):
            serve_metrics(settings, host, 0)
    server = serve_metrics(settings, "127.0.0.1", 0)
    credentials = settings.secrets.read(FLOWER_AUTH)  # made by the endpoint when missing
    assert credentials is not None
    url = f"http://127.0.0.1:{server.port}/metrics"
    try:
        wrong = base64.b64encode(b"runwarden:guess").decode()
        for header in (None, f"Basic {wrong}", "Bearer x", "Basic !!!"):
            request = urllib.request.Request(url)
            if header is not None:
                request.add_header("Authorization", header)
            with pytest.raises(urllib.error.HTTPError) as refused:
                urllib.request.urlopen(request, timeout=10)  # noqa: S310 - our loopback
            assert refused.value.code == 401
            assert refused.value.headers["WWW-Authenticate"] == 'Basic realm="runwarden"'
        right = base64.b64encode(credentials.get_secret_value().encode()).decode()
        request = urllib.request.Request(url, headers={"Authorization": f"Basic {right}"})
        with urllib.request.urlopen(request, timeout=10) as answer:  # noqa: S310 - our loopback
            text = answer.read().decode()
    finally:
        server.close()
    assert samples(text)[("runwarden_store_up", ())] == 1.0
