"""The Prometheus endpoint end to end, with real redis-server, Celery worker and beat
and real jobs: scraped during and after stops (`producers.metrics.serve_metrics`,
parsed with prometheus_client's parser), its numbers move as the runs do: a stop in
flight shows in the gauge, a proof gives the latency histogram a sample, a cancel at
the proof deadline counts by its cause, follow ticks are timed per target."""

from __future__ import annotations

import base64
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from bench.harness.pipeline import CLOCKS, Pipeline, running_pipeline, toy
from producers.metrics import serve_metrics
from schemas import RunLimits, RunState, StopPhase
from schemas.events import LaunchSpec
from schemas.secrets import FLOWER_AUTH

pytestmark = pytest.mark.slow

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]
PROOF_S = float(CLOCKS["RUNWARDEN_PROOF_TIMEOUT_S"])


@pytest.fixture
def pipeline(tmp_path: Path) -> Iterator[Pipeline]:
    with running_pipeline(tmp_path) as started:
        try:
            yield started
        finally:
            started.kill_jobs()


@dataclass(frozen=True)
class Endpoint:
    """A running endpoint, and its credentials as a scraper holds them (base64 of
    `user:password`)."""

    port: int
    auth: str


@pytest.fixture
def endpoint(pipeline: Pipeline) -> Iterator[Endpoint]:
    server = serve_metrics(pipeline.api.settings, "127.0.0.1", 0)
    held = pipeline.api.settings.secrets.read(FLOWER_AUTH)
    assert held is not None
    yield Endpoint(server.port, base64.b64encode(held.get_secret_value().encode()).decode())
    server.close()


def scrape(endpoint: Endpoint) -> Samples:
    url = f"http://127.0.0.1:{endpoint.port}/metrics"
    request = urllib.request.Request(url, headers={"Authorization": f"Basic {endpoint.auth}"})
    with urllib.request.urlopen(request, timeout=10) as answer:  # noqa: S310 - our loopback
        text = answer.read().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def settled(endpoint: Endpoint, name: str, want: float, timeout_s: float = 30, **labels: str
            ) -> Samples:  # fmt: skip
    """A scrape once `name{labels}` is `want`: the workers tell what happened just
    after they record it."""
    deadline = time.monotonic() + timeout_s
    while True:
        samples = scrape(endpoint)
        if value(samples, name, **labels) == want or time.monotonic() > deadline:
            return samples
        time.sleep(0.2)


def launch(pipeline: Pipeline, *args: str) -> str:
    spec = LaunchSpec(target="local", command=toy("--steps", "100000", "--step-time", "0.05",
                                                  *args), limits=RunLimits(disk=False))  # fmt: skip
    return pipeline.api.launch(spec, wait_s=60).id


def test_the_numbers_move_with_the_runs(pipeline: Pipeline, endpoint: Endpoint) -> None:
    before = scrape(endpoint)
    assert value(before, "runwarden_store_up") == 1.0
    assert value(before, "runwarden_stops_in_flight", phase="waiting_proof") == 0.0
    assert value(before, "runwarden_proof_latency_seconds_count") == 0.0
    proving = launch(pipeline)
    ignoring = launch(pipeline, "--ignore-requests")
    pipeline.wait_step(proving, 3)
    pipeline.wait_step(ignoring, 3)
    running = scrape(endpoint)
    assert value(running, "runwarden_runs", state="running") == 2.0
    # Follow ticks of the target `local` were timed, by the workers.
    assert value(running, "runwarden_follow_tick_seconds_count", target="local") > 0

    # During: the ignored stop waits for its proof, and shows.
    stop = pipeline.api.stop(ignoring)
    pipeline.wait_phase(ignoring, StopPhase.WAITING_PROOF)
    during = scrape(endpoint)
    assert value(during, "runwarden_stops_in_flight", phase="waiting_proof") == 1.0
    assert value(during, "runwarden_cancels_total", cause="proof_timeout") == 0.0

    # The proved stop: one sample of proof latency, between the request and its deadline.
    asked = time.time()
    pipeline.api.stop(proving)
    assert pipeline.wait_state(proving).state is RunState.STOPPED
    proved = settled(endpoint, "runwarden_runs_ended_total", 1.0, state="stopped")
    assert value(proved, "runwarden_proof_latency_seconds_count") == 1.0
    latency = value(proved, "runwarden_proof_latency_seconds_sum")
    assert 0.0 < latency < time.time() - asked + 0.5
    assert value(proved, "runwarden_proof_latency_seconds_bucket", le="+Inf") == 1.0
    assert value(proved, "runwarden_runs_ended_total", state="stopped") == 1.0

    # After: cancelled at the proof deadline, counted by cause, its lateness observed.
    assert pipeline.wait_state(ignoring, timeout_s=PROOF_S + 30).state is RunState.CANCELLED
    after = settled(endpoint, "runwarden_runs_ended_total", 1.0, state="cancelled")
    assert value(after, "runwarden_cancels_total", cause="proof_timeout") == 1.0
    assert value(after, "runwarden_cancels_total", cause="manual") == 0.0
    assert value(after, "runwarden_deadline_lateness_seconds_count", deadline="proof") == 1.0
    # Acted on within a reconcile period and this shared machine's noise.
    assert value(after, "runwarden_deadline_lateness_seconds_bucket", deadline="proof",
                 le="5.0") == 1.0  # fmt: skip
    for phase in ("waiting_proof", "waiting_end", "cancelling"):
        assert value(after, "runwarden_stops_in_flight", phase=phase) == 0.0
    assert value(after, "runwarden_runs", state="cancelled") == 1.0
    assert value(after, "runwarden_runs", state="stopped") == 1.0
    assert value(after, "runwarden_runs", state="running") == 0.0
    assert stop.stop_id  # the gauge counted this one

    # Retrievals: both runs' artifacts came home, their bytes counted.
    deadline = time.monotonic() + 60
    while value(scrape(endpoint), "runwarden_retrievals_total", outcome="done") < 2:
        assert time.monotonic() < deadline, pipeline.logs()
        time.sleep(0.3)
    done = scrape(endpoint)
    stored = sum(pipeline.api.get_run(r).artifacts.bytes for r in (proving, ignoring))  # type: ignore[union-attr]
    assert value(done, "runwarden_retrieved_bytes_total") == stored > 0
