"""`workers.heartbeat` and `workers.beat`: the heartbeat writer (over fakeredis, and a
Redis that is down), its thread, the worker's Celery signals (over the session's real
redis-server), and beat's scheduler writing on its ticks. The whole service with
killed workers and beat is in tests/integration/service/test_status.py."""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import fakeredis
import pytest
import redis
from celery import Celery, signals
from redis.backoff import NoBackoff
from redis.retry import Retry

from bench.harness.redis_server import RedisServer
from schemas import Settings
from schemas.health import HEARTBEAT_INTERVAL_S, HEARTBEAT_TTL_S, periodic_tasks
from store import RunStore
from workers import heartbeat
from workers.beat import HeartbeatScheduler
from workers.heartbeat import HeartbeatThread, HeartbeatWriter

from ...conftest import wait_for

QUEUES = ("runwarden", "runwarden.retrieve")


def fake_store() -> RunStore:
    return RunStore(fakeredis.FakeRedis(server=fakeredis.FakeServer()))


def alive(store: RunStore, role: str = "worker") -> dict[str, tuple[str, ...]]:
    """Name -> queues of every live process of `role`."""
    reading = store.health.read_health(QUEUES, ())
    processes = reading.workers if role == "worker" else reading.beats
    return {p.name: p.heartbeat.queues for p in processes if p.heartbeat is not None}


def writer(store: RunStore, tmp_path: Path, **kwargs: object) -> HeartbeatWriter:
    settings = Settings(state_dir=tmp_path)
    return HeartbeatWriter(settings, "worker", "w1@h", store=store, **kwargs)  # type: ignore[arg-type]


def test_a_write_is_a_live_heartbeat_with_the_queues_as_they_stand(tmp_path: Path) -> None:
    store = fake_store()
    queues = [("runwarden",)]
    beats = writer(store, tmp_path, queues=lambda: queues[-1])
    assert beats.write()
    assert alive(store) == {"w1@h": ("runwarden",)}
    queues.append(QUEUES)
    assert beats.write()
    assert alive(store) == {"w1@h": QUEUES}
    (seen,) = store.health.read_health(QUEUES, ()).workers
    assert seen.heartbeat is not None
    assert seen.heartbeat.started is not None
    assert seen.heartbeat.started < seen.heartbeat.at
    beats.end()
    assert alive(store) == {}
    assert store.health.read_health(QUEUES, ()).workers == ()


def test_the_heartbeat_lives_its_time_to_live(tmp_path: Path) -> None:
    store = fake_store()
    assert writer(store, tmp_path, ttl_s=0.2).write()
    assert alive(store)
    time.sleep(0.4)
    assert alive(store) == {}


def test_write_due_writes_once_per_interval(tmp_path: Path) -> None:
    beats = writer(fake_store(), tmp_path)
    assert beats.write_due(0.2)
    assert not beats.write_due(0.2)
    time.sleep(0.25)
    assert beats.write_due(0.2)


def test_a_redis_that_is_down_fails_a_write_without_raising_logged_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # Without retries, as the store builds its bounded clients (redis-py 8 retries
    # three times by default).
    down = redis.Redis(
        unix_socket_path=str(tmp_path / "none.sock"), socket_timeout=1, retry=Retry(NoBackoff(), 0)
    )
    beats = writer(RunStore(down), tmp_path)
    with caplog.at_level(logging.WARNING, logger="runwarden.heartbeat"):
        started = time.monotonic()
        assert not beats.write()
        assert not beats.write()
        beats.end()
        assert time.monotonic() - started < 5
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1, lines
    assert "heartbeat of worker w1@h: writing failed" in lines[0]


def test_the_default_store_is_settings_redis_with_bounded_waits(tmp_path: Path) -> None:
    settings = Settings(state_dir=tmp_path, redis_url=f"unix://{tmp_path}/none.sock")  # type: ignore[arg-type]
    beats = HeartbeatWriter(settings, "worker", "w1@h")
    started = time.monotonic()
    assert not beats.write()
    assert time.monotonic() - started < 3


def test_the_thread_beats_until_stopped_then_ends_the_heartbeat(tmp_path: Path) -> None:
    store = fake_store()
    thread = HeartbeatThread(writer(store, tmp_path, ttl_s=0.3), interval_s=0.05)
    thread.start()
    wait_for(lambda: alive(store), timeout_s=5)
    time.sleep(0.6)  # two time-to-lives: still there, so it was written again
    assert alive(store)
    thread.stop()
    assert alive(store) == {}
    assert store.health.read_health(QUEUES, ()).workers == ()
    thread.stop()  # twice is harmless


def test_signal_stop_ends_the_heartbeat_from_the_thread(tmp_path: Path) -> None:
    store = fake_store()
    thread = HeartbeatThread(writer(store, tmp_path), interval_s=0.05)
    thread.start()
    wait_for(lambda: alive(store), timeout_s=5)
    thread.signal_stop()
    wait_for(lambda: not alive(store), timeout_s=5)


@pytest.fixture
def installed(redis_server: RedisServer, tmp_path: Path) -> Iterator[RunStore]:
    """The worker's signal handlers installed for the session's real Redis (emptied);
    afterwards, those of `workers.app` again when it is loaded."""
    client = redis_server.client()
    client.flushall()
    heartbeat.install(Settings(redis_url=redis_server.url, state_dir=tmp_path))  # type: ignore[arg-type]
    yield RunStore(client)
    signals.worker_shutdown.send(sender=None)
    app = sys.modules.get("workers.app")
    if app is not None:
        heartbeat.install(app.settings)
    client.close()


class Consumer:
    """What the handlers read of Celery's consumer (a signal's sender is hashable)."""

    def __init__(self, hostname: str, queues: tuple[str, ...]) -> None:
        self.hostname = hostname
        self.task_consumer = SimpleNamespace(queues=[SimpleNamespace(name=q) for q in queues])


def test_worker_ready_starts_the_heartbeat_and_shutdown_ends_it(installed: RunStore) -> None:
    signals.worker_ready.send(sender=Consumer("t1@h", ("runwarden.retrieve", "runwarden")))
    wait_for(lambda: alive(installed), timeout_s=5)
    assert alive(installed) == {"t1@h": ("runwarden", "runwarden.retrieve")}
    (seen,) = installed.health.read_health(QUEUES, ()).workers
    assert seen.heartbeat is not None
    assert seen.heartbeat.pid > 1
    time.sleep(HEARTBEAT_TTL_S + HEARTBEAT_INTERVAL_S)  # outlives one time to live: rewritten
    assert alive(installed)
    signals.worker_shutdown.send(sender=None)
    assert alive(installed) == {}
    assert installed.health.read_health(QUEUES, ()).workers == ()


def test_a_warm_shutdown_ends_the_heartbeat_when_it_begins(installed: RunStore) -> None:
    signals.worker_ready.send(sender=Consumer("t2@h", QUEUES))
    wait_for(lambda: alive(installed), timeout_s=5)
    signals.worker_shutting_down.send(sender="t2@h", sig="SIGTERM", how="Warm", exitcode=0)
    wait_for(lambda: not alive(installed), timeout_s=5)


def test_beat_s_scheduler_writes_its_heartbeat_on_its_ticks(tmp_path: Path) -> None:
    app = Celery("t", set_as_current=False)
    app.conf.update(beat_schedule={}, beat_max_loop_interval=HEARTBEAT_INTERVAL_S)
    scheduler = HeartbeatScheduler(app=app, schedule_filename=str(tmp_path / "schedule"))
    store = fake_store()
    scheduler._writer = HeartbeatWriter(  # the test's own store
        Settings(state_dir=tmp_path), "beat", "beat@h", store=store
    )
    assert scheduler.tick() <= HEARTBEAT_INTERVAL_S
    assert alive(store, "beat") == {"beat@h": ()}
    scheduler.close()
    assert alive(store, "beat") == {}
    assert store.health.read_health(QUEUES, ()).beats == ()


def test_beat_is_configured_to_beat() -> None:
    from workers.app import app, celery_config

    assert app.conf.beat_scheduler == "workers.beat:HeartbeatScheduler"
    # Beat sleeps at most this long between ticks: it writes at least once an interval,
    # well within the heartbeat's time to live.
    assert app.conf.beat_max_loop_interval == HEARTBEAT_INTERVAL_S
    assert HEARTBEAT_INTERVAL_S * 2 < HEARTBEAT_TTL_S
    settings = Settings(follow_poll_s=1.5, policy_s=3.5, reconcile_s=4.5)
    schedule = celery_config(settings)["beat_schedule"]
    sent = {entry["task"]: entry["schedule"] for entry in schedule.values()}
    assert sent == periodic_tasks(settings)
