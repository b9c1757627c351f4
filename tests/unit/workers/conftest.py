"""What the tests of the worker's operations share: a `Context` over a fakeredis store
with a real local executor (fast; the pipeline tests run the same code with real
Redis, Celery and jobs), the tasks it sends, and runs in a temporary directory."""

from __future__ import annotations

import json
import os
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import fakeredis

from bench.harness.users import as_the_worker
from schemas import JobId, RunRecord, Settings
from store import RunStore
from workers.context import Context

from ...conftest import put_signed_target
from ..conftest import record


def fresh_store() -> RunStore:
    return RunStore(fakeredis.FakeRedis(server=fakeredis.FakeServer()))


class Sent:
    def __init__(self) -> None:
        self.calls: list[tuple[str, dict[str, Any], float]] = []

    def __call__(self, name: str, kwargs: dict[str, Any], countdown_s: float) -> None:
        self.calls.append((name, kwargs, countdown_s))

    def named(self, name: str) -> list[dict[str, Any]]:
        return [k["body"] for n, k, _ in self.calls if n == name]


def policy_worker(tmp_path: Path, **settings: Any) -> tuple[Context, RunStore, Sent]:
    store = fresh_store()
    sent = Sent()
    # The countdown horizon past the configured timeouts: these tests see each stop's
    # countdown sent at its opening (the horizon itself: test_budgets.py).
    options: dict[str, Any] = {
        "state_dir": tmp_path / "state", "disk_probe_s": 60, "countdown_horizon_s": 3600,
    }  # fmt: skip
    options.update(settings)
    config = Settings(**options)
    local = {"name": "local", "kind": "local", "workdir": str(tmp_path), **as_the_worker()}
    put_signed_target(store, config, local)
    return Context(store, config, sent, "w"), store, sent


def running_run(store: RunStore, tmp_path: Path, run_id: str, **changes: Any) -> RunRecord:
    run_dir = tmp_path / run_id
    run_dir.mkdir()
    base: dict[str, Any] = {
        "id": run_id,
        "remote_dir": str(run_dir),
        "job": JobId(dir=str(run_dir), pid=os.getpid()),
        "started": datetime.now(UTC) - timedelta(hours=1),
    }
    base.update(changes)
    run = record(**base)
    assert store.runs.create(run)
    store.follow.add(run_id)
    return run


def ended_run(store: RunStore, tmp_path: Path, run_id: str = "e1") -> RunRecord:
    run_dir = tmp_path / run_id
    (run_dir / "output" / "checkpoint-3").mkdir(parents=True)
    (run_dir / "output" / "checkpoint-3" / "weights.bin").write_bytes(os.urandom(5000))
    (run_dir / "job.log").write_text("hello\n")
    snap = {"checkpoint": "output/checkpoint-3", "step": 3, "time": 1.0, "reason": "requested"}
    (run_dir / "snapshot.json").write_text(json.dumps(snap))
    run = record(id=run_id, remote_dir=str(run_dir), job=JobId(dir=str(run_dir), pid=4242))
    assert store.runs.create(run)
    return run
