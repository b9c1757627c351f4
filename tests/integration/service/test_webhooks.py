"""Webhooks end to end, with real redis-server, Celery worker and beat, real jobs and
a real HTTP receiver on loopback: every delivery signed and timestamped, one run's
events in the order of its ledger, a 500 retried and delivered later, the Slack
format; and a receiver that never answers delays no stop: its outcome is recorded
on time."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest

from bench.harness.pipeline import CLOCKS, Pipeline, running_pipeline, state_dir_of, toy
from bench.harness.webhook_receiver import Receiver, receiver, silent_listener
from schemas import RunLimits, RunState
from schemas.events import LaunchSpec
from schemas.ledger import CancelDecided, StopOpened
from schemas.secrets import SecretsDir

from .test_cli import refused, run_cli

pytestmark = pytest.mark.slow

SECRET = "whsec 'quoted' $(not run) \\ end"
SECRET_VAR = "RUNWARDEN_TEST_WEBHOOK_SECRET"
PROOF_S = float(CLOCKS["RUNWARDEN_PROOF_TIMEOUT_S"])
HANG_S = 10.0
"""How long each attempt to the receiver that never answers takes: a stop that waited
for one delivery would be this late."""
ON_TIME_S = float(CLOCKS["RUNWARDEN_RECONCILE_S"]) + 3.0
"""How late a deadline may be acted on here: a reconcile period and this shared
machine's noise, well under one hang."""


@pytest.fixture
def got() -> Iterator[Receiver]:
    with receiver() as running:
        yield running


@pytest.fixture
def pipeline(tmp_path: Path, got: Receiver) -> Iterator[Pipeline]:
    # ops's secret in the secrets directory the pipeline's processes use.
    SecretsDir(state_dir_of(tmp_path) / "secrets").ensure("webhook.ops.secret", SECRET)
    with silent_listener() as hang_url:
        hooks = [
            {"name": "ops", "url": f"{got.url}/ops", "backoff_s": 1, "attempts": 5},
            {"name": "chat", "url": f"{got.url}/chat", "format": "slack",
             "events": ["stop_opened", "run_ended"]},
            # Never answers: each attempt takes its whole timeout. Its secret comes
            # from the workers' environment.
            {"name": "hang", "url": hang_url, "secret_env": SECRET_VAR,
             "timeout_s": HANG_S, "attempts": 2, "backoff_s": 1},
        ]  # fmt: skip
        env = {"RUNWARDEN_WEBHOOKS": json.dumps(hooks), SECRET_VAR: SECRET}
        with running_pipeline(tmp_path, extra_env=env) as started:
            try:
                yield started
            finally:
                started.kill_jobs()


def launch(pipeline: Pipeline, *args: str) -> str:
    spec = LaunchSpec(target="local", command=toy("--steps", "100000", "--step-time", "0.05",
                                                  *args), limits=RunLimits(disk=False))  # fmt: skip
    return pipeline.api.launch(spec, wait_s=60).id


def wait_ledger(pipeline: Pipeline, run_id: str, kind: str, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while not any(e.kind == kind for e in pipeline.api.ledger(run_id)):
        assert time.monotonic() < deadline, pipeline.logs()
        time.sleep(0.2)


def test_deliveries_are_signed_in_order_retried_and_never_slow_a_stop(
    pipeline: Pipeline, got: Receiver
) -> None:
    got.statuses_for["/ops"] = [500]  # ops's first delivery (a stop_opened) fails once
    proving = launch(pipeline)
    ignoring = launch(pipeline, "--ignore-requests")
    pipeline.wait_step(proving, 3)
    pipeline.wait_step(ignoring, 3)
    pipeline.api.stop(proving)
    asked = time.time()
    stop = pipeline.api.stop(ignoring)
    answered = time.time() - asked
    wait_ledger(pipeline, proving, "retrieval_done")
    wait_ledger(pipeline, ignoring, "retrieval_done")

    # A receiver that never answers (every attempt held HANG_S, on every worker
    # process) did not delay the stop: the request answered at once, cancelled at
    # its proof deadline, its end right after.
    assert answered < ON_TIME_S
    (cancel,) = [e for e in pipeline.api.ledger(ignoring) if isinstance(e, CancelDecided)]
    assert cancel.cause == "proof_timeout"
    late = cancel.at - stop.proof_deadline
    assert timedelta(0) <= late < timedelta(seconds=ON_TIME_S), cancel
    run = pipeline.api.get_run(ignoring)
    assert run.state is RunState.CANCELLED
    assert run.ended is not None
    assert run.ended.timestamp() - stop.proof_deadline.timestamp() < ON_TIME_S + 2.0

    # ops: every event of each run, in the ledger's order, each signed and fresh.
    for run_id in (proving, ignoring):
        ledger = pipeline.api.ledger(run_id)
        done = got.wait_for(len(ledger), path="/ops", timeout_s=60)
        mine = [r for r in done if r.json()["run_id"] == run_id]
        deadline = time.monotonic() + 60
        while len(mine) < len(ledger) and time.monotonic() < deadline:
            time.sleep(0.2)
            mine = [r for r in got.wait_for(0, path="/ops") if r.json()["run_id"] == run_id]
        assert [r.json()["id"] for r in mine] == [e.id for e in ledger], pipeline.logs()
        assert [r.headers["x-runwarden-event"] for r in mine] == [e.kind for e in ledger]
        for request in mine:
            assert request.signature_ok(SECRET.encode(), now=request.at, tolerance_s=30)
            assert not request.signature_ok(b"another secret", now=request.at)
            assert request.headers["x-runwarden-delivery"] == request.json()["id"]
            assert request.json() == json.loads(
                next(e for e in ledger if e.id == request.json()["id"]).model_dump_json()
            )

    # The 500: the same delivery again, at least the backoff later, then the rest.
    first = next(r for r in got.got if r.path == "/ops")
    assert first.status == 500
    again = [r for r in got.got if r.path == "/ops" and r.json()["id"] == first.json()["id"]]
    assert [r.status for r in again] == [500, 200]
    assert again[1].at - again[0].at >= 0.9
    assert isinstance(next(e for e in pipeline.api.ledger(first.json()["run_id"])), StopOpened)

    # chat: Slack's {"text": ...}, only the events it asked for.
    chat = got.wait_for(4, path="/chat", timeout_s=60)
    texts = [r.json()["text"] for r in chat]
    assert all(set(r.json()) == {"text"} for r in chat)
    assert sum("stop opened" in t for t in texts) == 2, texts
    assert any(t.startswith(f"runwarden: run {proving}: run ended stopped") for t in texts)
    assert any(t.startswith(f"runwarden: run {ignoring}: run ended cancelled") for t in texts)
    assert not any("proof seen" in t for t in texts)

    # hang: given up after its attempts, recorded; nothing lost for the others.
    deadline = time.monotonic() + 90
    while not pipeline.api.webhook_failures() and time.monotonic() < deadline:
        time.sleep(0.5)
    failures = pipeline.api.webhook_failures()
    assert failures, pipeline.logs()
    assert {f["webhook"] for f in failures} == {"hang"}
    assert all(f["attempts"] == 2 for f in failures)
    # The secret is in no log of any process and nowhere in Redis.
    assert SECRET not in pipeline.logs()
    client = pipeline.api.store.client
    for key in client.scan_iter(count=1000):
        kind = client.type(key)
        if kind == b"string":
            assert SECRET.encode() not in client.get(key)
        elif kind == b"list":
            assert not any(SECRET.encode() in v for v in client.lrange(key, 0, -1))


def test_serve_refuses_a_webhook_configuration_that_does_not_fit(tmp_path: Path) -> None:
    env = {"PATH": "/usr/bin:/bin", "RUNWARDEN_STATE_DIR": str(tmp_path / "state"),
           "RUNWARDEN_WEBHOOKS": json.dumps([{"name": "ops", "url": "ftp://x/y"}])}  # fmt: skip
    refused(run_cli(env, "serve"), 2, "RUNWARDEN_WEBHOOKS", "http:// or https://")
