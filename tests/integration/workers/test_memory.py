"""`workers.memory.watch_memory` against a real redis-server of the test's own: above
80 % of `maxmemory` the workers log a warning naming what to change, at most once per
period in a process; a Redis that cannot answer is logged, never raised."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench.harness.redis_server import RedisServer, running_redis
from schemas import Settings
from store import RunStore
from workers import memory
from workers.context import Context


@pytest.fixture
def ctx(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Context, RedisServer]]:
    monkeypatch.setattr(memory, "_last", [])  # this process has not looked yet
    with running_redis(tmp_path / "redis") as server:
        store = RunStore(server.client())
        yield Context(store, Settings(state_dir=tmp_path / "state"), lambda *_: None, "w"), server


def test_a_warning_above_80_percent_at_most_once_per_period(
    ctx: tuple[Context, RedisServer], caplog: pytest.LogCaptureFixture
) -> None:
    context, server = ctx
    client = server.client()
    used = context.store.health.memory().used
    client.config_set("maxmemory", used * 10)
    caplog.set_level(logging.INFO, logger="runwarden")
    use = memory.watch_memory(context, every_s=3600)
    assert use is not None
    assert not use.high
    assert "memory" not in caplog.text.lower()

    client.config_set("maxmemory", int(used / 0.9))
    assert memory.watch_memory(context, every_s=3600) is None  # looked within the period
    use = memory.watch_memory(context, every_s=0)
    assert use is not None
    assert use.high
    (warning,) = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert "Redis memory is high" in warning.getMessage()
    assert "RUNWARDEN_REDIS_MAXMEMORY" in warning.getMessage()


def test_a_redis_that_cannot_answer_is_logged(
    ctx: tuple[Context, RedisServer], caplog: pytest.LogCaptureFixture
) -> None:
    context, server = ctx
    server.stop()
    assert memory.watch_memory(context, every_s=0) is None
    assert "cannot read Redis's memory" in caplog.text
