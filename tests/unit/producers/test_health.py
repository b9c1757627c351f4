"""`producers.health` and `runwarden status` (`producers/cli/status.py`) over the
session's real redis-server, a Redis that is down and one that never answers: the
report, its bounded waits, the table for people, the exit code and the JSON. The
whole service (killed workers and beat) is in tests/integration/service/test_status.py."""

from __future__ import annotations

import io
import json
import re
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pydantic import SecretStr
from rich.console import Console
from typer.testing import CliRunner

from bench.harness.redis_server import RedisServer
from producers.cli import app
from producers.cli.status import render
from producers.health import QUEUES_SHOWN, read_health, redis_address, report_rows
from schemas import Settings
from schemas.health import Heartbeat, ServeChild, ServeState, periodic_tasks
from store import RunStore

HOSTILE = "evil\x1b[31m\x1b]0;title\x07\u202e\nname"


def settings_for(url: str | None, tmp_path: Path, **more: Any) -> Settings:
    return Settings(redis_url=None if url is None else SecretStr(url), state_dir=tmp_path, **more)


@pytest.fixture
def server(redis_server: RedisServer) -> Iterator[RunStore]:
    """The session's real Redis, emptied, as a store."""
    client = redis_server.client()
    client.flushall()
    yield RunStore(client)
    client.close()


def healthy(store: RunStore, settings: Settings, hostname: str = "h") -> None:
    """Heartbeats of a worker on both queues and of a beat; every periodic task ran."""
    queues = ("celery", "runwarden", "runwarden.retrieve", "runwarden.watch")
    beat = Heartbeat(name="w1@h", hostname=hostname, pid=7, queues=queues)
    store.health.heartbeat("worker", beat, ttl_s=60)
    store.health.heartbeat("beat", Heartbeat(name="beat@h", hostname=hostname, pid=8), ttl_s=60)
    for task in periodic_tasks(settings):
        store.health.record_tick(task)


@pytest.fixture
def silent_port() -> Iterator[int]:
    """A TCP port on loopback that accepts connections and never answers."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        listener.settimeout(0.1)
        while not stop.is_set():
            try:
                held.append(listener.accept()[0])
            except TimeoutError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield listener.getsockname()[1]
    stop.set()
    thread.join()
    for conn in held:
        conn.close()
    listener.close()


# --- the address ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("redis://user:pw@redis:6379/0", "redis://redis:6379/0"),
        ("rediss://:p%40ss@host.example:6380/2?password=x", "rediss://host.example:6380/2"),
        ("redis://[::1]:6379", "redis://[::1]:6379"),
        ("unix:///run/redis.sock?db=1&password=x", "unix:///run/redis.sock"),
        ("redis://host", "redis://host"),
    ],
)
def test_the_address_never_shows_credentials(url: str, shown: str, tmp_path: Path) -> None:
    assert redis_address(settings_for(url, tmp_path)) == shown


def test_the_embedded_default_is_its_socket(tmp_path: Path) -> None:
    address = redis_address(settings_for(None, tmp_path))
    assert address == f"unix://{tmp_path}/redis.sock (embedded)"


# --- read_health ------------------------------------------------------------------


def test_a_healthy_service_reads_ok(
    server: RunStore, redis_server: RedisServer, tmp_path: Path
) -> None:
    settings = settings_for(redis_server.url, tmp_path)
    healthy(server, settings)
    server.client.rpush("runwarden", "m")
    report = read_health(settings)
    assert report.ok, report.problems
    assert report.redis.reachable
    assert report.redis.used_memory
    assert [w.name for w in report.workers] == ["w1@h"]
    assert [b.name for b in report.beats] == ["beat@h"]
    assert [t.task for t in report.periodic] == list(periodic_tasks(settings))
    assert all(t.last_run_age_s is not None and t.last_run_age_s < 5 for t in report.periodic)
    assert [(q.name, q.depth) for q in report.queues] == [
        (q, 1 if q == "runwarden" else 0) for q in QUEUES_SHOWN
    ]


def test_an_empty_store_is_down_for_want_of_workers_and_beat(
    server: RunStore, redis_server: RedisServer, tmp_path: Path
) -> None:
    report = read_health(settings_for(redis_server.url, tmp_path))
    assert not report.ok
    assert report.problems == (
        "workers: no live worker consumes the queue 'runwarden'",
        "workers: no live worker consumes the queue 'runwarden.retrieve'",
        "workers: no live worker consumes the queue 'runwarden.watch'",
        "beat: no live beat (periodic tasks are not sent)",
    )


def test_the_periods_are_the_settings(
    server: RunStore, redis_server: RedisServer, tmp_path: Path
) -> None:
    settings = settings_for(redis_server.url, tmp_path, reconcile_s=0.1)
    healthy(server, settings)
    time.sleep(0.5)
    report = read_health(settings, late_after_s=0.2)
    assert [t.task for t in report.periodic if t.late] == ["runwarden.reconcile"]
    assert not report.ok


def test_a_redis_that_is_down_is_a_report_not_an_error(tmp_path: Path) -> None:
    settings = settings_for(f"unix://{tmp_path}/none.sock", tmp_path)
    report = read_health(settings)
    assert not report.ok
    assert not report.redis.reachable
    assert report.redis.address == f"unix://{tmp_path}/none.sock"
    assert report.redis.error is not None
    assert report.redis.error.startswith("cannot reach Redis: ")
    assert report.problems == (
        f"redis: unreachable at {report.redis.address}: {report.redis.error}",
    )


def test_the_embedded_default_not_serving_says_how_to_start_it(tmp_path: Path) -> None:
    report = read_health(settings_for(None, tmp_path))
    assert report.redis.error is not None
    assert report.redis.error.endswith("(the embedded Redis runs with `runwarden serve`)")


def test_a_redis_that_never_answers_is_waited_for_at_most_the_timeout(
    silent_port: int, tmp_path: Path
) -> None:
    settings = settings_for(f"redis://127.0.0.1:{silent_port}/0", tmp_path)
    started = time.monotonic()
    report = read_health(settings, timeout_s=0.5)
    took = time.monotonic() - started
    assert took < 2.0, took
    assert not report.redis.reachable
    assert report.redis.error is not None
    assert "did not answer in time" in report.redis.error


def test_an_unreadable_password_file_is_a_report_not_an_error(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    secrets = tmp_path / "secrets"
    (secrets / "redis-password").mkdir(parents=True)  # a directory: unreadable as a file
    settings = settings_for(redis_server.url, tmp_path, secrets_dir=secrets)
    report = read_health(settings)
    assert not report.ok
    assert not report.redis.reachable


@pytest.mark.parametrize(("late", "timeout"), [(-1.0, 1.0), (1.0, 0.0), (1.0, float("inf"))])
def test_bad_bounds_are_refused(late: float, timeout: float, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="must be"):
        read_health(settings_for(None, tmp_path), late_after_s=late, timeout_s=timeout)


def test_serves_record_is_read_shown_and_removed_at_a_clean_stop(
    server: RunStore, redis_server: RedisServer, tmp_path: Path
) -> None:
    settings = settings_for(redis_server.url, tmp_path)
    healthy(server, settings)
    child = ServeChild(name="beat", pid=9, restarts=1, last_end="killed by SIGKILL",
                       last_end_ago_s=2.0)  # fmt: skip
    written = server.health.write_serve(ServeState(name="serve@h", hostname="h", pid=7,
                                            children=(child,)), ttl_s=5)  # fmt: skip
    assert written.started == written.at
    [serve] = read_health(settings).serve
    assert (serve.name, serve.pid, serve.restarts) == ("serve@h", 7, 1)
    assert serve.children[0].last_end == "killed by SIGKILL"
    assert serve.children[0].last_end_age_s is not None
    assert 2.0 <= serve.children[0].last_end_age_s < 5
    rows = [row for row in report_rows(read_health(settings)) if row[0] in ("serve", "child")]
    assert rows[0][:3] == ("serve", "up", "serve@h")
    assert rows[1][:3] == ("child", "up", "beat")
    assert rows[1][3].startswith("pid 9, 1 restart(s), last killed by SIGKILL ")
    server.health.end_serve("serve@h")
    assert read_health(settings).serve == ()
    # A serve killed without a word drops out when its record lapses.
    server.health.write_serve(ServeState(name="serve@h", hostname="h", pid=7), ttl_s=0.1)
    time.sleep(0.3)
    assert read_health(settings).serve == ()


# --- the table and the command ------------------------------------------------------


def test_the_table_is_aligned_cleaned_and_never_wrapped(
    server: RunStore, redis_server: RedisServer, tmp_path: Path
) -> None:
    settings = settings_for(redis_server.url, tmp_path)
    healthy(server, settings, hostname=HOSTILE)
    server.health.heartbeat("worker", Heartbeat(name=HOSTILE, hostname="h", pid=9), ttl_s=0.1)
    time.sleep(0.3)
    report = read_health(settings)
    rows = report_rows(report)
    assert all(c.isprintable() for row in rows for cell in row for c in cell)
    lines = [line.plain for line in render(report)]
    assert lines[0] == "runwarden: OK"
    table = lines[1 : 2 + len(rows)]
    assert table[0].split() == ["WHAT", "STATE", "NAME", "DETAIL"]
    state_at = table[0].index("STATE")
    name_at = table[0].index("NAME")
    for line, (what, state, name, _) in zip(table[1:], rows, strict=True):
        assert line.startswith(what)
        assert line[state_at:].startswith(state)
        assert line[name_at:].startswith(name)
    assert any(line.startswith("warning: worker evil") for line in lines)
    assert all("\x1b" not in line and "\u202e" not in line for line in lines)
    console = Console(file=io.StringIO(), width=40, color_system=None)
    for line in render(report):
        console.print(line, soft_wrap=True)
    shown = console.file.getvalue().splitlines()  # type: ignore[attr-defined]
    assert shown == lines  # a narrow terminal wraps nothing


def test_status_exits_0_when_ok_and_prints_the_table(
    server: RunStore, redis_server: RedisServer, tmp_path: Path
) -> None:
    settings = settings_for(redis_server.url, tmp_path)
    healthy(server, settings)
    env = {"RUNWARDEN_REDIS_URL": redis_server.url, "RUNWARDEN_STATE_DIR": str(tmp_path)}
    result = CliRunner().invoke(app, ["status"], env=env)
    assert result.exit_code == 0, result.output
    assert result.output.startswith("runwarden: OK\n")
    worker = (
        r"^worker +up +w1@h +host h, pid 7, heartbeat \d+\.\d s ago, "
        r"queues celery runwarden runwarden\.retrieve runwarden\.watch$"
    )
    assert re.search(worker, result.output, re.MULTILINE), result.output


def test_status_exits_1_with_a_clear_line_when_redis_is_down(tmp_path: Path) -> None:
    env = {
        "RUNWARDEN_REDIS_URL": f"unix://{tmp_path}/none.sock",
        "RUNWARDEN_STATE_DIR": str(tmp_path),
    }
    result = CliRunner().invoke(app, ["status"], env=env)
    assert result.exit_code == 1
    assert result.output.startswith("runwarden: DOWN (1 problem(s))\n")
    assert f"problem: redis: unreachable at unix://{tmp_path}/none.sock: cannot reach Redis" in (
        result.output
    )


def test_status_json_is_the_report(
    server: RunStore, redis_server: RedisServer, tmp_path: Path
) -> None:
    env = {"RUNWARDEN_REDIS_URL": redis_server.url, "RUNWARDEN_STATE_DIR": str(tmp_path)}
    result = CliRunner().invoke(app, ["status", "--json", "--late-after", "5"], env=env)
    assert result.exit_code == 1  # nothing beats
    data = json.loads(result.output)
    assert data["ok"] is False
    assert data["late_after_s"] == 5
    assert data["redis"]["reachable"] is True
    assert [q["name"] for q in data["queues"]] == list(QUEUES_SHOWN)
    assert len(data["problems"]) == 4


def test_status_refuses_a_negative_threshold_as_bad_usage(tmp_path: Path) -> None:
    result = CliRunner().invoke(
        app, ["status", "--late-after", "-1"], env={"RUNWARDEN_STATE_DIR": str(tmp_path)}
    )
    assert result.exit_code == 2


def test_the_help_documents_every_field_of_the_json(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["status", "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0
    shown = " ".join(result.output.split())
    report = read_health(settings_for(f"unix://{tmp_path}/none.sock", tmp_path))
    fields = set(report.model_dump()) | set(report.redis.model_dump())
    fields |= {"heartbeat_age_s", "queues", "last_run_age_s", "late_s", "by_priority", "due_in_s"}
    missing = {f for f in fields if f not in shown}
    assert not missing, result.output
    assert "problems (strings)" in shown  # not eaten as markup
