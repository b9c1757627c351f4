"""Flower against the real broker: the in-flight stop's countdown task is visible
with its ETA, and a non-Python service can enqueue a stop through its API."""

from __future__ import annotations

import base64
import json
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from bench.harness.pipeline import Pipeline, running_pipeline, signed, toy
from bench.harness.ports import free_port
from producers.service import FLOWER_CONFIG
from schemas import RunState, SnapshotReason
from schemas.auth import new_task_id
from schemas.budget import StopTimeouts
from schemas.events import (
    TASK_FOLLOW_TICK,
    TASK_POLICY_TARGET,
    TASK_POLICY_TICK,
    TASK_RECONCILE,
    TASK_WATCH_TARGET,
    LaunchSpec,
)

from ...conftest import ROOT, wait_for

pytestmark = pytest.mark.slow
AUTH = "ops:fl0wer-pw"


class Flower:
    def __init__(self, port: int) -> None:
        self.base = f"http://127.0.0.1:{port}"

    def call(self, path: str, body: dict[str, Any] | None = None, auth: str | None = AUTH) -> Any:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(  # noqa: S310 - http on our loopback only
            self.base + path, data=data, method="POST" if data else "GET"
        )
        request.add_header("Content-Type", "application/json")
        if auth is not None:
            request.add_header("Authorization", "Basic " + base64.b64encode(auth.encode()).decode())
        with urllib.request.urlopen(request, timeout=10) as response:  # noqa: S310 - our loopback
            return json.loads(response.read() or b"null")


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Pipeline, Flower]]:
    tmp: Path = tmp_path_factory.mktemp("flower")
    with running_pipeline(tmp) as pipeline:
        port = free_port()
        log = (tmp / "flower.log").open("ab")
        # As `runwarden serve --flower` runs it: the credentials in a file, on no
        # command line.
        auth_file = tmp / "flower-basic-auth"
        auth_file.write_text(AUTH + "\n")
        auth_file.chmod(0o600)
        proc = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "workers.app", "flower",
             f"--conf={FLOWER_CONFIG}", f"--port={port}", "--address=127.0.0.1"],
            cwd=ROOT, env={**pipeline.env, "RUNWARDEN_FLOWER_AUTH_FILE": str(auth_file)},
            stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
        flower = Flower(port)
        deadline = time.monotonic() + 30
        while True:
            try:
                flower.call("/api/workers")
                break
            except (urllib.error.URLError, ConnectionError):
                if time.monotonic() > deadline:
                    raise AssertionError((tmp / "flower.log").read_text()) from None
                time.sleep(0.3)
        try:
            yield pipeline, flower
        finally:
            proc.terminate()
            proc.wait(timeout=15)


@pytest.mark.parametrize("path", ["/api/workers", "/metrics", "/", "/tasks", "/api/tasks"])
def test_flower_needs_its_password(setup: tuple[Pipeline, Flower], path: str) -> None:
    """Every page, `/metrics` too (Flower 2.2 serves it openly by itself)."""
    _, flower = setup
    with pytest.raises(urllib.error.HTTPError) as raised:
        urllib.request.urlopen(flower.base + path, timeout=10)  # noqa: S310 - our loopback
    assert raised.value.code == 401


def test_flower_s_metrics_answer_with_the_password(setup: tuple[Pipeline, Flower]) -> None:
    _, flower = setup
    request = urllib.request.Request(flower.base + "/metrics")  # noqa: S310 - our loopback
    request.add_header("Authorization", "Basic " + base64.b64encode(AUTH.encode()).decode())
    with urllib.request.urlopen(request, timeout=10) as response:  # noqa: S310 - our loopback
        assert b"flower_" in response.read()


def test_the_pending_proof_countdown_is_visible_with_its_eta(
    setup: tuple[Pipeline, Flower],
) -> None:
    pipeline, flower = setup
    spec = LaunchSpec(target="local", command=toy("--steps", "100000", "--ignore-requests"))
    run_id = pipeline.api.launch(spec).id
    stop = pipeline.api.stop(run_id, asked_by="test")
    found: dict[str, Any] | None = None
    deadline = time.monotonic() + 15
    while found is None and time.monotonic() < deadline:
        tasks = flower.call("/api/tasks?taskname=runwarden.proof_timeout")
        for task in tasks.values():
            if run_id in str(task.get("kwargs")) and task.get("eta"):
                found = task
        time.sleep(0.3)
    assert found is not None, "no proof_timeout task with an ETA in Flower"
    assert found["name"] == "runwarden.proof_timeout"
    # Readable for people, and never the signature the message carries.
    assert found["kwargs"] == f"{run_id} · proof deadline · requested", found["kwargs"]
    eta = found["eta"]
    assert eta.startswith(stop.proof_deadline.strftime("%Y-%m-%dT%H:%M")), (eta, stop)
    pipeline.api.cancel(run_id)


QUIET_TASKS = (
    TASK_FOLLOW_TICK, TASK_WATCH_TARGET, TASK_POLICY_TICK,
    TASK_POLICY_TARGET, TASK_RECONCILE,
)  # fmt: skip


def test_the_periodic_tasks_leave_the_task_list_to_the_stops(
    setup: tuple[Pipeline, Flower],
) -> None:
    """The ticks (one every second or so here) never reach Flower's task list, by
    their workers' events or their senders': a countdown shows, with its name."""
    pipeline, flower = setup
    # Its own proof timeout, longer than the test: one countdown, never fired meanwhile.
    spec = LaunchSpec(
        target="local",
        command=toy("--steps", "100000", "--ignore-requests"),
        timeouts=StopTimeouts(proof_timeout_s=100),  # within the countdown horizon
    )
    run_id = pipeline.api.launch(spec).id
    since = time.time()
    pipeline.api.stop(run_id, reason=SnapshotReason.COST, asked_by="test")
    ran: dict[str, float] = {}

    def every_tick_ran_since() -> bool:
        # Each periodic task and its fan-out ran while Flower listened: the run is
        # followed and its target's policies ticked since the stop.
        ran.update(pipeline.api.store.health.read_health((), QUIET_TASKS).ticks)
        periodic = (TASK_FOLLOW_TICK, TASK_POLICY_TICK, TASK_RECONCILE)
        ticked = all(ran.get(t, 0.0) > since for t in periodic)
        return ticked and pipeline.api.store.follow.offsets(run_id).log > 0

    wait_for(every_tick_ran_since, timeout_s=20)
    time.sleep(1.0)  # the events of the last ticks are through Flower's receiver
    tasks = flower.call("/api/tasks?limit=10000")
    names = {task.get("name") for task in tasks.values()}
    assert not names & set(QUIET_TASKS), sorted(n for n in names if n)
    shown = [t for t in tasks.values() if t.get("kwargs") == f"{run_id} · proof deadline · cost"]
    assert [t["name"] for t in shown] == ["runwarden.proof_timeout"], tasks
    pipeline.api.cancel(run_id)


def test_a_stop_enqueued_through_flowers_api(setup: tuple[Pipeline, Flower]) -> None:
    pipeline, flower = setup
    spec = LaunchSpec(target="local", command=toy("--steps", "100000", "--step-time", "0.05"))
    run_id = pipeline.api.launch(spec).id
    pipeline.wait_step(run_id, 3)
    stop = {"run_id": run_id, "reason": "cost", "asked_by": "flower"}
    # Signed as a service does it, with its producer's key (schemas/auth.py).
    task_id = new_task_id()
    kwargs = signed(pipeline.api.settings, "runwarden.snapshot_request", stop, "dashboard", task_id)
    answer = flower.call(
        "/api/task/send-task/runwarden.snapshot_request", {"kwargs": kwargs, "task_id": task_id}
    )
    assert answer["task-id"] == task_id
    assert answer["task-id"]
    run = pipeline.wait_state(run_id)
    assert run.state is RunState.STOPPED
    assert run.snapshot is not None
    assert run.snapshot.reason is SnapshotReason.COST
    (closed,) = pipeline.api.store.stops.history(run_id)
    assert closed.asked_by == "dashboard/flower"
