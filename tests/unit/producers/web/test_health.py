"""The web view's `/health` and `/api/health` (producers/web/health.py) through
FastAPI's TestClient, reading the session's real redis-server through
`Runwarden.health()`, and a Redis that is down."""

from __future__ import annotations

import base64
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from pydantic import SecretStr

from bench.harness.redis_server import RedisServer
from producers.api import Runwarden
from producers.web import create_app
from schemas import Settings
from schemas.health import Heartbeat, periodic_tasks
from store import RunStore

USER, PASSWORD = "ops", "pw"
HOSTILE = "<script>alert(1)</script>\x1b[31mred"


def client_for(settings: Settings) -> TestClient:
    app = create_app(Runwarden(settings), user=USER, password=PASSWORD)
    token = base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
    return TestClient(app, headers={"Authorization": f"Basic {token}"})


@pytest.fixture
def store(redis_server: RedisServer) -> Iterator[RunStore]:
    client = redis_server.client()
    client.flushall()
    yield RunStore(client)
    client.close()


@pytest.fixture
def settings(redis_server: RedisServer, tmp_path: Path) -> Settings:
    return Settings(redis_url=SecretStr(redis_server.url), state_dir=tmp_path)


def beating(store: RunStore, settings: Settings, hostname: str = "h") -> None:
    queues = ("runwarden", "runwarden.retrieve", "runwarden.watch")
    worker = Heartbeat(name="w1@h", hostname=hostname, pid=7, queues=queues)
    store.health.heartbeat("worker", worker, 60)
    store.health.heartbeat("beat", Heartbeat(name="beat@h", hostname=hostname, pid=8), 60)
    for task in periodic_tasks(settings):
        store.health.record_tick(task)


def test_the_health_page_shows_the_report(store: RunStore, settings: Settings) -> None:
    beating(store, settings, hostname=HOSTILE)
    store.health.heartbeat("worker", Heartbeat(name=HOSTILE, hostname="x", pid=9), 0.001)
    page = client_for(settings).get("/health")
    assert page.status_code == 200
    html = page.text
    assert 'data-verdict="ok"' in html
    assert '<a href="/health" aria-current="page">Health</a>' in html
    assert "w1@h" in html
    assert "runwarden.reconcile" in html
    assert "<script>alert" not in html
    assert "\x1b" not in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;red" in html  # cleaned, then escaped


def test_the_health_page_lists_the_problems(store: RunStore, settings: Settings) -> None:
    html = client_for(settings).get("/health").text
    assert 'data-verdict="down"' in html
    assert "<li>beat: no live beat (periodic tasks are not sent)</li>" in html


def test_api_health_is_the_report_with_200_when_ok(store: RunStore, settings: Settings) -> None:
    beating(store, settings)
    answer = client_for(settings).get("/api/health")
    assert answer.status_code == 200
    data = answer.json()
    assert data["ok"] is True
    assert [w["name"] for w in data["workers"]] == ["w1@h"]


def test_api_health_is_503_when_something_is_down(store: RunStore, settings: Settings) -> None:
    answer = client_for(settings).get("/api/health")
    assert answer.status_code == 503
    assert answer.json()["ok"] is False


def test_a_redis_that_is_down_is_shown_not_a_server_error(tmp_path: Path) -> None:
    settings = Settings(redis_url=SecretStr(f"unix://{tmp_path}/none.sock"), state_dir=tmp_path)
    client = client_for(settings)
    page = client.get("/health")
    assert page.status_code == 200
    assert "redis: unreachable at unix://" in page.text
    answer = client.get("/api/health")
    assert answer.status_code == 503
    assert answer.json()["redis"]["reachable"] is False


def test_health_is_behind_the_login(settings: Settings) -> None:
    app = create_app(Runwarden(settings), user=USER, password=PASSWORD)
    for path in ("/health", "/api/health"):
        assert TestClient(app).get(path).status_code == 401
