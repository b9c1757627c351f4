"""The web view connected as its own Redis user, `web` (store/acl.py, `web_rules`), over
the whole service: a real redis-server, Celery worker and beat (bench/harness/pipeline.py,
the workers as `worker`), the toy trainer as the job, the view through FastAPI's
TestClient. Everything the view does works and Redis refuses it nothing (its ACL log
stays empty); what it has no business doing, through the same user, is refused by Redis:
deleting or writing a store key, the dangerous commands, Celery's remote control."""

from __future__ import annotations

import base64
import re
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from celery import Celery
from fastapi.testclient import TestClient

from bench.harness.pipeline import Pipeline, running_pipeline, toy
from producers.api import Runwarden
from producers.web import create_app
from schemas import RunState, Settings
from schemas.events import LaunchSpec
from schemas.secrets import service_redis_password_file
from store.acl import WEB_USER, set_web_user

from ...conftest import wait_for

pytestmark = pytest.mark.slow

USER, PASSWORD = "ops", "web-user-pw"
STEPS = ("--steps", "300", "--step-time", "0.25")


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pipeline]:
    """The service, with the web view's user made as an operator of their own Redis
    would (`set_web_user`, through the operator's connection)."""
    with running_pipeline(tmp_path_factory.mktemp("web-user")) as pipeline:
        settings = pipeline.api.settings
        password, _ = settings.secrets.ensure(service_redis_password_file(WEB_USER))
        admin = pipeline.redis.client()
        set_web_user(admin, password)
        admin.close()
        yield pipeline


def as_web(pipeline: Pipeline) -> Settings:
    return pipeline.api.settings.model_copy(update={"redis_user": WEB_USER})


def web_refusals(admin: redis.Redis) -> list[Any]:
    """What Redis refused the web user (its ACL log)."""
    return [e for e in admin.acl_log() if e.get("username") == WEB_USER]


def csrf_of(page: str) -> str:
    match = re.search(r'name="csrf" value="([^"]+)"', page)
    assert match, "no CSRF token on the page"
    return match.group(1)


def act(client: TestClient, run_id: str, action: str) -> Any:
    """The action confirmed, as a person does it from the run page."""
    form = {"csrf": csrf_of(client.get(f"/runs/{run_id}").text), "confirmed": "yes"}
    return client.post(f"/runs/{run_id}/{action}", data=form, follow_redirects=False)


def test_the_web_view_does_all_it_does_as_its_own_user(pipeline: Pipeline) -> None:
    admin = pipeline.redis.client()
    admin.acl_log_reset()
    stopped = pipeline.api.launch(LaunchSpec(target="local", command=toy(*STEPS)), wait_s=60).id
    cancelled = pipeline.api.launch(LaunchSpec(target="local", command=toy(*STEPS)), wait_s=60).id
    pipeline.wait_step(stopped, 2)
    pipeline.wait_step(cancelled, 2)
    api = Runwarden(as_web(pipeline))
    token = base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
    client = TestClient(
        create_app(api, user=USER, password=PASSWORD),
        headers={"Authorization": f"Basic {token}"},
    )
    for path in ("/", "/stops", f"/runs/{stopped}", "/api/runs", f"/api/runs/{stopped}",
                 "/api/stops", "/health"):  # fmt: skip
        assert client.get(path).status_code == 200, path
    assert {r["id"] for r in client.get("/api/runs").json()} >= {stopped, cancelled}
    log = client.get(f"/api/runs/{stopped}/log").json()
    assert log["lines"], log
    health = client.get("/api/health").json()
    assert health["redis"]["reachable"], health
    assert health["redis"]["used_memory"], health  # INFO allowed
    assert act(client, stopped, "stop").status_code == 303
    assert act(client, cancelled, "cancel").status_code == 303
    assert pipeline.api.get_run(cancelled).state is RunState.CANCELLED
    assert pipeline.wait_terminal(stopped)[0].state is RunState.STOPPED
    assert client.get(f"/runs/{stopped}").status_code == 200
    assert web_refusals(admin) == []  # Redis refused the view nothing
    admin.close()


def test_the_web_user_cannot_change_the_store_or_command_the_workers(
    pipeline: Pipeline,
) -> None:
    """Through the web view's user: a key cannot be deleted, a store key it only reads
    cannot be written (a run's record, a target), `ACL`, `CONFIG`, `SHUTDOWN` are
    refused, and Celery's remote control (shutdown, revoke) too; the workers and the
    run are untouched."""
    run_id = pipeline.api.launch(LaunchSpec(target="local", command=toy(*STEPS)), wait_s=60).id
    try:
        pipeline.wait_step(run_id, 1)
        settings = as_web(pipeline)
        web = redis.Redis.from_url(settings.store_url(), socket_timeout=5)
        assert web.get(f"rw:run:{run_id}")
        for command in (
            ("DEL", f"rw:run:{run_id}"),
            ("SET", f"rw:run:{run_id}", "{}"),
            ("HSET", "rw:targets", "evil", "{}"),
            ("DEL", "runwarden"),
            ("ACL", "SETUSER", "web", "+@all"),
            ("CONFIG", "SET", "dir", "/tmp"),
            ("SHUTDOWN", "NOSAVE"),
        ):
            with pytest.raises(redis.exceptions.NoPermissionError):
                web.execute_command(*command)
        web.close()
        admin = pipeline.redis.client()
        assert web_refusals(admin)  # the log the other test finds empty holds these
        admin.close()
        app = Celery(broker=settings.broker_url(), backend=settings.broker_url())
        with pytest.raises(Exception, match="no permissions"):
            app.control.shutdown()
        with pytest.raises(Exception, match="no permissions"):
            app.control.revoke(run_id)
        assert wait_for(lambda: pipeline.api.app.control.ping(timeout=1))
        assert pipeline.api.get_run(run_id).state is RunState.RUNNING
    finally:
        pipeline.api.cancel(run_id)
