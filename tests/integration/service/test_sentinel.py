"""Redis that fails over: the whole service (real Celery workers and beat, the test's
API) on a primary, a replica and three `redis-sentinel` processes on loopback
(bench/harness/sentinel.py), reached by a `sentinel://` URL, every deadline write
waiting for its replica (`RUNWARDEN_REDIS_MIN_REPLICAS`, 1 with Sentinel).

The primary is killed (`kill -9`) in the middle of a batch of stops: stops asked
before the kill wait for their proofs and countdowns, more are asked while the
sentinels promote the replica. Every stop ends with the right state (stopped with
its checkpoint; a job that ignores requests cancelled at its proof deadline; a job
that proves then hangs cancelled at its end deadline, stopped with its snapshot),
each run has exactly one stop, closed, no deadline is left pending or acted on twice
(the stops' cancels, the ledger's cancel and proof events), and the service keeps
working after the failover (a new launch and stop). A producer's Redis user made
before the kill logs in on the new primary: `producers add` writes it on every data
server (Redis does not replicate ACL users), and `producers rm` deletes it from each.

On the same services: `runwarden status` reports the service healthy through the
sentinels (one of them hanging is skipped), and says within its bound, exit 1, that
Redis is unreachable when no sentinel names a primary (a master they do not know,
sentinels nobody answers on); a task goes through Celery past a sentinel that refuses
connections at once; the web view, connected as `runwarden serve --web` connects it,
lists the service's runs.
"""

from __future__ import annotations

import base64
import contextlib
import json
import secrets
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import redis
from fastapi.testclient import TestClient
from pydantic import SecretStr
from typer.testing import CliRunner

from bench.harness.paths import ROOT
from bench.harness.pipeline import Pipeline, running_pipeline, toy
from bench.harness.sentinel import HOST, MASTER_NAME, SentinelCluster, TcpRedisServer
from producers.api import Runwarden
from producers.cli import app
from producers.redis_users import AddedUser
from producers.service import Service, ServiceOptions
from producers.web import create_app
from schemas import NotRunning, RunLimits, RunRecord, RunState, StopState
from schemas.budget import StopTimeouts
from schemas.events import QUEUE, LaunchSpec
from schemas.secrets import producer_redis_password_file
from schemas.sentinel import SENTINEL_PASSWORD, parse_sentinel

# No skip without redis-sentinel: the harness then runs `redis-server --sentinel`.
pytestmark = pytest.mark.slow

NAME = f"sentinel-{secrets.token_hex(3)}"
PROOF_S, END_S = 5.0, 3.0
KINDS = ("honours", "honours", "hangs", "ignores")
"""One batch of runs: two that stop with a checkpoint, one that proves then hangs
(cancelled at its end deadline: stopped with its snapshot), one that ignores the
request (cancelled at its proof deadline)."""
EXPECTED = {"honours": RunState.STOPPED, "hangs": RunState.STOPPED, "ignores": RunState.CANCELLED}
CANCELS = {"honours": 0, "hangs": 1, "ignores": 1}


@dataclass
class Asked:
    run: RunRecord
    kind: str
    attempts: int = 0
    stops: list[StopState] = field(default_factory=list)


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pipeline]:
    tmp = tmp_path_factory.mktemp("sentinel")
    with running_pipeline(tmp, sentinel=True, watch_worker=True) as started:
        try:
            yield started
        finally:
            started.kill_jobs()


def command(kind: str) -> str:
    extra = {"honours": (), "hangs": ("--hang-after-proof",), "ignores": ("--ignore-requests",)}
    return toy("--steps", "100000", "--step-time", "0.1", *extra[kind])


def launch(pipeline: Pipeline, kind: str) -> RunRecord:
    spec = LaunchSpec(
        target="local",
        name=NAME,
        command=command(kind),
        limits=RunLimits(disk=False),
        timeouts=StopTimeouts(proof_timeout_s=PROOF_S, end_timeout_s=END_S),
    )
    return pipeline.api.launch(spec, wait_s=60)


def stop(pipeline: Pipeline, asked: Asked, deadline: float) -> None:
    """Asks the stop, again while it fails (the failover: a write no replica
    acknowledged, a primary not there yet), until `deadline`: the caller's retry."""
    while True:
        asked.attempts += 1
        try:
            asked.stops.append(pipeline.api.stop(asked.run.id, wait_s=10))
            return
        except NotRunning:
            if asked.attempts > 1:
                # An earlier attempt's stop went through on the primary though its
                # answer was lost, and the run has already ended: asked.
                return
            raise
        except Exception:  # any failure during the failover is retried
            if time.monotonic() > deadline:
                raise
            time.sleep(0.3)


def wait_replicas_listed(cluster: SentinelCluster, timeout_s: float = 30.0) -> None:
    """Waits until every sentinel lists every data server but the primary as a replica
    it sees up (no `s_down`, `o_down` or `disconnected` flag): what `producers add`
    writes to."""
    deadline = time.monotonic() + timeout_s
    while True:
        seen: list[int] = []
        try:
            for sentinel in cluster.sentinels:
                client = sentinel.client()
                try:
                    replicas: list[dict[str, Any]] = client.sentinel_slaves(MASTER_NAME)
                finally:
                    client.close()
                up = [
                    r
                    for r in replicas
                    if not (r["is_sdown"] or r["is_odown"] or r["is_disconnected"])
                ]
                seen.append(len(up))
        except redis.RedisError:
            seen = []
        if seen and min(seen) >= len(cluster.servers) - 1:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"the sentinels list {seen} replicas up: " + cluster.logs())
        time.sleep(0.05)


def add_user(pipeline: Pipeline, cluster: SentinelCluster, name: str) -> AddedUser:
    """Producer `name`'s Redis user made through the API, once the sentinels list every
    replica up; checked written (and saved) on each data server."""
    wait_replicas_listed(cluster)
    added = pipeline.api.add_producer_user(name)
    assert added.missed == (), added
    assert added.saved, added
    assert [s.role for s in added.servers] == ["primary", "replica"], added
    assert {s.address for s in added.servers} == {f"{HOST}:{s.port}" for s in cluster.servers}
    return added


def logs_in(server: TcpRedisServer, name: str, pipeline: Pipeline) -> int:
    """Producer `name` logged in to `server` as its own user, over TCP: the length of
    the `runwarden` queue (a read its rules allow)."""
    password = pipeline.api.settings.secrets.read(producer_redis_password_file(name))
    assert password is not None
    client = redis.Redis(
        host=HOST,
        port=server.port,
        username=f"producer-{name}",
        password=password.get_secret_value(),
        socket_timeout=2.0,
        socket_connect_timeout=2.0,
    )
    try:
        return int(client.llen(QUEUE))
    finally:
        client.close()


def acl_user(server: TcpRedisServer, name: str) -> Any:
    """`ACL GETUSER producer-<name>` on `server`, asked on its own client (None when
    it has no such user)."""
    client = server.client(socket_timeout=2.0)
    try:
        return client.acl_getuser(f"producer-{name}")
    finally:
        client.close()


def test_a_failover_in_the_middle_of_stops_loses_no_stop_and_fires_no_deadline_twice(
    pipeline: Pipeline,
) -> None:
    cluster = pipeline.sentinel
    assert cluster is not None
    api = pipeline.api
    # A producer's Redis user, on every data server before the kill.
    producer = f"pub-{secrets.token_hex(3)}"
    add_user(pipeline, cluster, producer)
    before = [Asked(launch(pipeline, kind), kind) for kind in KINDS]
    during = [Asked(launch(pipeline, kind), kind) for kind in KINDS]
    for asked in before + during:
        pipeline.wait_step(asked.run.id, 2)

    # The first batch asked; its proofs, end countdowns and proof countdowns in flight.
    for asked in before:
        stop(pipeline, asked, time.monotonic() + 30)
    old = cluster.kill_primary()
    killed = time.monotonic()
    # The second batch asked while the sentinels promote the replica.
    for asked in during:
        stop(pipeline, asked, time.monotonic() + 30)
    new = cluster.wait_failover(old.port)
    promoted_s = time.monotonic() - killed
    # The promoted replica has the producer's user: it publishes on.
    assert logs_in(new, producer, pipeline) >= 0
    # The old primary comes back; the sentinels make it the new one's replica, and
    # the deadline writes have a replica to wait for again.
    old.start()
    cluster.wait_replicas(new, 1, timeout_s=40)
    replica_back_s = time.monotonic() - killed

    for asked in before + during:
        run = pipeline.wait_state(asked.run.id, timeout_s=40)
        assert run.state is EXPECTED[asked.kind], (asked.kind, run, pipeline.logs())
        if run.state is RunState.STOPPED:
            assert run.snapshot is not None
            assert (Path(run.remote_dir) / run.snapshot.checkpoint).is_dir()
    ended_s = time.monotonic() - killed

    # Every stop accounted for: one per run, closed, the cancels as its job called
    # for; none left open, no deadline left pending.
    counted = 0
    for asked in before + during:
        history = api.store.stops.history(asked.run.id)
        assert len(history) == 1, (asked.kind, history)
        closed = history[0]
        assert closed.closed_at is not None
        assert closed.cancels == CANCELS[asked.kind], (asked.kind, closed)
        assert all(s.stop_id == closed.stop_id for s in asked.stops), (asked.stops, closed)
        kinds = [e.kind for e in api.ledger(asked.run.id)]
        # The ledger tells each deadline's act once at most (an event written in the
        # failover's window may be lost: the ledger tells, the stop decides).
        assert kinds.count("cancel_decided") <= 1, kinds
        assert kinds.count("proof_seen") <= 1, kinds
        assert kinds.count("stop_opened") <= 1, kinds
        counted += 1
    assert counted == len(KINDS) * 2
    assert [s.run_id for s in api.store.stops.in_progress() if s.run_id.find(NAME) >= 0] == []
    pending = [d for d in api.store.stops.pending_deadlines() if NAME in d.run_id]
    assert pending == []

    # The service goes on: a new run launched and stopped with its checkpoint.
    after = Asked(launch(pipeline, "honours"), "honours")
    pipeline.wait_step(after.run.id, 2)
    stop(pipeline, after, time.monotonic() + 10)
    run = pipeline.wait_state(after.run.id, timeout_s=30)
    assert run.state is RunState.STOPPED
    assert len(api.store.stops.history(after.run.id)) == 1
    retried = sum(a.attempts - 1 for a in before + during)
    print(
        f"\nfailover: {counted + 1} stops counted, {retried} asked again during the "
        f"failover; promoted {promoted_s:.1f} s after the kill, replica back at "
        f"{replica_back_s:.1f} s, every stop ended at {ended_s:.1f} s"
    )


def test_producers_add_and_rm_write_every_data_server(pipeline: Pipeline) -> None:
    """`Runwarden.add_producer_user` writes the user on the primary and the replica
    (each asked on its own client), the producer logs in on both, and
    `remove_producer_user` deletes it from both. Either before or after the failover
    test: the primary is whichever the sentinels name."""
    cluster = pipeline.sentinel
    assert cluster is not None
    name = f"pub-{secrets.token_hex(3)}"
    added = add_user(pipeline, cluster, name)
    assert added.servers[0].address == f"{HOST}:{cluster.primary().port}"
    for server in cluster.servers:
        assert acl_user(server, name) is not None, server.port
        assert logs_in(server, name, pipeline) >= 0
    again = add_user(pipeline, cluster, name)  # idempotent: the same password
    assert again.password_file == added.password_file

    removed = pipeline.api.remove_producer_user(name)
    assert removed.existed
    assert removed.missed == ()
    assert len(removed.servers) == len(cluster.servers)
    for server in cluster.servers:
        assert acl_user(server, name) is None, server.port
    assert not added.password_file.exists()


# --- status and the web view over Sentinel ----------------------------------------------

STATUS_TIMEOUT_S = 0.5
"""`runwarden status --timeout` in these tests: a hanging sentinel costs this long."""


@contextlib.contextmanager
def dead_sentinels() -> Iterator[tuple[int, int]]:
    """Two loopback ports, held for the block, where no sentinel answers: the first
    refuses every connection (bound, not listening), the second takes connections
    into its backlog and never answers (a hanging sentinel)."""
    refusing = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    hanging = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    with refusing, hanging:
        refusing.bind((HOST, 0))
        hanging.bind((HOST, 0))
        hanging.listen(8)
        yield refusing.getsockname()[1], hanging.getsockname()[1]


def sentinel_url(
    cluster: SentinelCluster, *, before: tuple[int, ...] = (), master: str = ""
) -> str:
    """The cluster's URL with the sentinels at ports `before` listed first, and
    `master` for the master's name when given."""
    address = parse_sentinel(cluster.url)
    hosts = [f"{HOST}:{port}" for port in before] + [f"{h}:{p}" for h, p in address.sentinels]
    return f"sentinel://{','.join(hosts)}/{master or address.master}"


def status(pipeline: Pipeline, url: str, *args: str) -> tuple[int, dict[str, Any], float]:
    """`runwarden status --json --timeout 0.5 ARGS` run in this process on `url`: its
    exit code, report, and how long it took."""
    env = {**pipeline.env, "RUNWARDEN_REDIS_URL": url}
    started = time.monotonic()
    result = CliRunner().invoke(
        app, ["status", "--json", "--timeout", str(STATUS_TIMEOUT_S), *args], env=env
    )
    took = time.monotonic() - started
    assert result.exit_code in (0, 1), (result.output, result.exception)
    report: dict[str, Any] = json.loads(result.output)
    return result.exit_code, report, took


def no_secret_in(pipeline: Pipeline, text: str) -> None:
    for name in ("redis-password", SENTINEL_PASSWORD):
        secret = pipeline.api.settings.secrets.read(name)
        assert secret is not None
        assert secret.get_secret_value() not in text, name


def test_status_reports_the_service_healthy_through_the_sentinels(pipeline: Pipeline) -> None:
    """Exit 0 once beat has sent each periodic task, the workers and beat up, Redis
    named by its sentinels; a hanging sentinel listed first is passed over."""
    cluster = pipeline.sentinel
    assert cluster is not None
    public = parse_sentinel(cluster.url).public()
    deadline = time.monotonic() + 30
    code, report, _ = status(pipeline, cluster.url)
    while code != 0:
        assert time.monotonic() < deadline, report
        time.sleep(0.1)
        code, report, _ = status(pipeline, cluster.url)
    assert report["redis"]["reachable"], report
    assert report["redis"]["address"] == public, report
    assert report["redis"]["used_memory"], report  # read on the primary the sentinels name
    assert {w["name"].partition("@")[0] for w in report["workers"] if w["alive"]} >= {
        "w1", "watch", "retrieve"
    }, report["workers"]  # fmt: skip
    assert any(b["alive"] for b in report["beats"]), report["beats"]
    no_secret_in(pipeline, json.dumps(report))

    with dead_sentinels() as (_, hanging):
        code, report, took = status(pipeline, sentinel_url(cluster, before=(hanging,)))
    assert code == 0, report
    assert took < 3 * STATUS_TIMEOUT_S + 2.0, took  # the hanging one's reply, once


def test_status_says_redis_is_unreachable_when_no_sentinel_names_a_primary(
    pipeline: Pipeline,
) -> None:
    """A master the sentinels do not monitor, and sentinels nobody answers on (one
    refusing, one hanging): exit 1 within the bound, the report unreachable with
    each sentinel's reason, no traceback; the real command says it in words."""
    cluster = pipeline.sentinel
    assert cluster is not None
    code, report, took = status(pipeline, sentinel_url(cluster, master="nosuch"))
    assert code == 1, report
    assert not report["ok"], report
    assert not report["redis"]["reachable"], report
    assert report["redis"]["error"].count("monitors no master 'nosuch'") == 3, report
    assert report["workers"] == [], report
    assert report["deadlines"] is None, report
    assert took < 2.0, took

    with dead_sentinels() as (refusing, hanging):
        url = f"sentinel://{HOST}:{refusing},{HOST}:{hanging}/{MASTER_NAME}"
        code, report, took = status(pipeline, url)
        assert code == 1, report
        assert not report["redis"]["reachable"], report
        error = report["redis"]["error"]
        assert f"{HOST}:{refusing} unreachable" in error, error
        assert f"{HOST}:{hanging} unreachable" in error, error  # timed out
        # One connect and one reply per sentinel, at most --timeout each.
        assert took < 2 * 2 * STATUS_TIMEOUT_S + 1.0, took

        # The real command, as a health check runs it: a verdict in words, exit 1.
        env = {**pipeline.env, "RUNWARDEN_REDIS_URL": url}
        done = subprocess.run(
            [sys.executable, "-m", "producers.cli", "status", "--timeout", str(STATUS_TIMEOUT_S)],
            cwd=ROOT, env=env, capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
    assert done.returncode == 1, (done.stdout, done.stderr)
    assert "Traceback" not in done.stdout + done.stderr, done.stderr
    assert done.stdout.startswith("runwarden: DOWN"), done.stdout
    assert "redis: unreachable at sentinel://" in done.stdout, done.stdout
    assert "no sentinel names a primary for 'runwarden'" in done.stdout, done.stdout
    no_secret_in(pipeline, done.stdout + done.stderr)


def test_celery_passes_a_refusing_sentinel_at_once(pipeline: Pipeline) -> None:
    """A producer's task through Celery (kombu's broker, Celery's result backend)
    with a sentinel that refuses connections listed first, as one that died with its
    host: published and answered as fast as without it. Each lookup tries a dead
    sentinel once; redis-py's own default retried it 10 times, backing off, on every
    new connection (as `status` did before it asked each sentinel once)."""
    cluster = pipeline.sentinel
    assert cluster is not None

    def doctor_through(url: str) -> float:
        settings = pipeline.api.settings.model_copy(update={"redis_url": SecretStr(url)})
        api = Runwarden(settings)
        started = time.monotonic()
        report = api.doctor("local", wait_s=30)
        took = time.monotonic() - started
        assert report.target == "local"
        api.app.close()
        return took

    alone = doctor_through(cluster.url)
    with dead_sentinels() as (refusing, _):
        took = doctor_through(sentinel_url(cluster, before=(refusing,)))
    assert took < alone + 1.0, (took, alone)


def test_the_web_view_lists_the_runs_of_the_service_behind_sentinel(pipeline: Pipeline) -> None:
    """The web view on the settings `runwarden serve --web` gives it (the URL's
    sentinels), behind basic auth, lists a run launched through the sentinels."""
    cluster = pipeline.sentinel
    assert cluster is not None
    name = f"web-{secrets.token_hex(3)}"
    spec = LaunchSpec(
        target="local",
        name=name,
        command=toy("--steps", "2", "--step-time", "0.05"),
        limits=RunLimits(disk=False),
    )
    run = pipeline.api.launch(spec, wait_s=60)
    serve = Service(pipeline.api.settings, ServiceOptions(web=True))
    assert serve.embedded is None  # a URL: serve starts no Redis
    user, password = "ops", secrets.token_urlsafe(12)
    web = create_app(Runwarden(serve.web_settings()), user=user, password=password)
    token = base64.b64encode(f"{user}:{password}".encode()).decode()
    client = TestClient(web, headers={"Authorization": f"Basic {token}"})
    assert TestClient(web).get("/").status_code == 401  # no credentials, no page
    page = client.get("/")
    assert page.status_code == 200, page.text
    assert run.id in page.text
    assert name in page.text
    listed = client.get("/api/runs")
    assert listed.status_code == 200
    assert run.id in {r["id"] for r in listed.json()}
    health = client.get("/api/health").json()
    assert health["redis"]["reachable"], health
    assert health["redis"]["address"] == parse_sentinel(cluster.url).public(), health
    pipeline.wait_terminal(run.id)
