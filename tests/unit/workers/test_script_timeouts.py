"""A script past its deadline is ended and counted: the worker's transports tell
their listener (`Transport.on_timeout`), which `Context.executor_for` sets to count
`runwarden_script_timeouts_total{target, action}`; a count the store refuses never
changes the error the operation gets."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from schemas import StoreError
from schemas.metrics import SCRIPT_TIMEOUTS
from workers.executors import ScriptExecutor, ScriptTimeout

from .conftest import policy_worker


def test_a_script_past_its_deadline_is_killed_and_counted(tmp_path: Path) -> None:
    ctx, store, _ = policy_worker(tmp_path)
    executor = ctx.executor("local")
    assert isinstance(executor, ScriptExecutor)
    started = time.monotonic()
    with pytest.raises(ScriptTimeout, match=r"^status failed: timed out after 0\.2 s$"):
        executor.transport.run("sleep 30", action="status", timeout_s=0.2)
    with pytest.raises(ScriptTimeout, match=r"^cancel failed"):
        executor.transport.run_to_end("sleep 30", action="cancel", timeout_s=0.2)
    assert time.monotonic() - started < 5  # killed, not waited for
    executor.transport.run("true", action="status")  # in time: not counted
    counted = {s.labels: s.value for s in store.counters.series() if s.spec is SCRIPT_TIMEOUTS}
    assert counted == {("local", "status"): 1.0, ("local", "cancel"): 1.0}


def test_a_count_the_store_refuses_changes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ctx, store, _ = policy_worker(tmp_path)
    executor = ctx.executor("local")
    assert isinstance(executor, ScriptExecutor)

    def refuse(*_: object) -> None:
        raise StoreError("Counters.add: the store is down")

    monkeypatch.setattr(store.counters, "add", refuse)
    with pytest.raises(ScriptTimeout, match="timed out"):
        executor.transport.run("sleep 30", action="follow", timeout_s=0.2)
