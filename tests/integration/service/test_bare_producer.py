"""A producer in another service, exactly as docs/integrating.md ("The bare
producer") shows it: the snippet between the guide's `bare-producer` markers, run word for
word in an interpreter where runwarden cannot be imported, signing with nothing but
`hmac`, `hashlib` and `json` and a key made by `runwarden producers add`, against
the real service (bench/harness/pipeline.py: redis-server, beat, and the worker started
with the very command line `runwarden serve` uses, so with its `-Q`).

Checked: a stop it asks is recorded as asked by the producer's name and the run
stops with its checkpoint; a cancel cancels; a launch runs (once per key); a
message without a signature, or signed with a wrong key, is refused with a clear
error in the task's result and changes nothing.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import sysconfig
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
import redis

from bench.harness.pipeline import Pipeline, running_pipeline, toy
from producers.service import Service, ServiceOptions
from schemas import RunState, SnapshotReason
from schemas.events import LaunchSpec

from ...conftest import ROOT, wait_for

pytestmark = pytest.mark.slow

START, END = "<!-- bare-producer:start -->", "<!-- bare-producer:end -->"
GUIDE = "docs/integrating.md"
PRODUCER = "billing"
LONG_TOY = ("--steps", "100000", "--step-time", "0.05")
"""The toy trainer's arguments for a run that goes on until it is stopped."""
TIMEOUT_S = 120.0

UNSIGNED = """\
import json, os, sys
from celery import Celery

url = os.environ["RUNWARDEN_URL"]
app = Celery(broker=url, backend=url)
result = app.send_task(sys.argv[1], kwargs={"body": json.loads(sys.argv[2])})
try:
    print(json.dumps({"result": result.get(timeout=60)}))
except Exception as error:
    print(json.dumps({"error": type(error).__name__, "message": str(error)}))
"""
"""A producer that forgets to sign: prints the task's result, or its error."""

ISOLATION = """\
import json, sys
missing = []
for name in ("runwarden", "schemas", "store", "producers", "workers"):
    try:
        __import__(name)
    except ModuleNotFoundError:
        missing.append(name)
import celery
print(json.dumps({"missing": missing, "path": sys.path, "celery": celery.__file__}))
"""
"""What the producer's interpreter can import."""


def guide_snippet() -> str:
    """The Python block between docs/integrating.md's `bare-producer` markers."""
    text = (ROOT / GUIDE).read_text(encoding="utf-8")
    assert text.count(START) == 1, f"{GUIDE} needs exactly one {START}"
    assert text.count(END) == 1, f"{GUIDE} needs exactly one {END}"
    block = text[text.index(START) + len(START) : text.index(END)]
    found = re.fullmatch(r"\s*```python\n(.*?)```\s*", block, re.DOTALL)
    assert found is not None, f"between the markers: one ```python block, not {block!r}"
    return found.group(1)


def bare_env(url: str, key_file: Path | None = None) -> dict[str, str]:
    """The producer's environment: the runwarden URL and key file, and a PYTHONPATH of
    the interpreter's site-packages alone, read without `site` (`python -S`), so the
    editable install of runwarden (a `.pth` hook there) is never loaded; no
    `RUNWARDEN_*` setting of the test's own."""
    paths = sysconfig.get_paths()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RUNWARDEN_", "PYTHON"))}
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys([paths["purelib"], paths["platlib"]]))
    env["RUNWARDEN_URL"] = url
    env["RUNWARDEN_PRODUCER"] = PRODUCER
    if key_file is not None:
        env["RUNWARDEN_KEY_FILE"] = str(key_file)
    return env


def run_bare(
    script: Path, env: dict[str, str], *args: str, timeout: float = TIMEOUT_S
) -> subprocess.CompletedProcess[str]:
    """`python -S SCRIPT ARGS` in the script's own directory, with `env`."""
    try:
        return subprocess.run(
            [sys.executable, "-S", str(script), *args],
            cwd=script.parent, env=env, stdin=subprocess.DEVNULL,
            capture_output=True, text=True, timeout=timeout, check=False,
        )  # fmt: skip
    except subprocess.TimeoutExpired as error:
        raise AssertionError(
            f"{script.name} {' '.join(args)}: no answer within {timeout:g} s "
            "(is the message on a queue no worker reads?)"
        ) from error


def shown(result: subprocess.CompletedProcess[str]) -> str:
    return f"exit {result.returncode}\n--- stdout\n{result.stdout}--- stderr\n{result.stderr}"


class OtherService:
    """The other service: the guide's snippet as `runwarden_send.py` in a directory
    of its own, with the key file it was given."""

    def __init__(self, home: Path, url: str, key_file: Path) -> None:
        self.home = home
        self.script = home / "runwarden_send.py"
        self.script.write_text(guide_snippet(), encoding="utf-8")
        self.env = bare_env(url, key_file)

    def send(self, task: str, body: dict[str, Any]) -> subprocess.CompletedProcess[str]:
        return run_bare(self.script, self.env, task, json.dumps(body))

    def answer(self, task: str, body: dict[str, Any]) -> Any:
        """The task's result as the snippet printed it (exit 0 asserted)."""
        result = self.send(task, body)
        assert result.returncode == 0, shown(result)
        return json.loads(result.stdout)


def start_serve_workers(pipeline: Pipeline) -> None:
    """Replaces the pipeline's worker by the workers `runwarden serve` starts (the same
    command lines: the main one with `-Q runwarden,celery`, the retrieval and the
    watch workers), so that a message on Celery's default queue reaches a worker only
    if serve's main worker consumes it."""
    pipeline.kill_worker("w1")
    commands = Service(pipeline.api.settings, ServiceOptions(concurrency=2)).commands()
    workers = [c for c in commands if "worker" in c]
    assert len(workers) == 3, commands
    for command in workers:
        assert "-Q" in command, command
        name = command[command.index("-n") + 1].split("@")[0]
        log = (pipeline.tmp / f"worker-serve-{name}.log").open("ab")
        pipeline.workers[f"serve-{name}"] = subprocess.Popen(
            command, cwd=ROOT, env=pipeline.env, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
        pipeline.wait_worker(name)


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pipeline]:
    with running_pipeline(tmp_path_factory.mktemp("bare")) as started:
        start_serve_workers(started)
        try:
            yield started
        finally:
            started.kill_jobs()


@pytest.fixture(scope="module")
def key_file(pipeline: Pipeline, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The key `runwarden producers add billing` made and printed, copied to the
    other service's directory as an operator would hand it over."""
    result = subprocess.run(
        [sys.executable, "-m", "producers.cli", "producers", "add", PRODUCER],
        cwd=ROOT, env={**pipeline.env, "COLUMNS": "40"}, stdin=subprocess.DEVNULL,
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert result.returncode == 0, shown(result)
    verb, _, where = result.stdout.splitlines()[0].partition(" ")
    assert verb == "created", shown(result)
    made = Path(where)
    assert made == pipeline.api.settings.secrets.path / f"producer.{PRODUCER}.key", shown(result)
    # And its Redis user, its password in a file of the operator's secrets.
    password = pipeline.api.settings.secrets.path / f"redis-password.producer-{PRODUCER}"
    # The test's redis-server keeps its users in an ACL file: saved there, it outlives
    # a restart. One server, no Sentinel: the primary alone.
    assert result.stdout.splitlines()[1:] == [
        f"Redis user producer-{PRODUCER}: its password is {password} (the producer's "
        "`redis-password`)",
        f"written on {pipeline.redis.socket_path} (primary)",
    ], shown(result)
    assert f"user producer-{PRODUCER} " in pipeline.redis.acl_path.read_text()  # type: ignore[union-attr]
    given = tmp_path_factory.mktemp("billing-service") / made.name
    given.write_bytes(made.read_bytes())
    given.chmod(0o600)
    return given


def user_url(pipeline: Pipeline) -> str:
    """The Redis URL of the producer's own user (`store/acl.py`), as the operator hands
    it over: the service's socket, the user, the password `producers add` made."""
    file = pipeline.api.settings.secrets.path / f"redis-password.producer-{PRODUCER}"
    password = quote(file.read_text().strip(), safe="")
    return f"redis+socket://producer-{PRODUCER}:{password}@{pipeline.redis.socket_path}"


@pytest.fixture(scope="module")
def service(pipeline: Pipeline, key_file: Path) -> OtherService:
    """The other service, connected as its own Redis user: every test of the module
    sends through it."""
    return OtherService(key_file.parent, user_url(pipeline), key_file)


def launch_long(pipeline: Pipeline) -> str:
    """A toy trainer launched by the operator, past its third step; its run id."""
    run_id = pipeline.api.launch(LaunchSpec(target="local", command=toy(*LONG_TOY))).id
    pipeline.wait_step(run_id, 3)
    return run_id


def test_the_producer_runs_without_runwarden(service: OtherService) -> None:
    probe = service.home / "probe.py"
    probe.write_text(ISOLATION, encoding="utf-8")
    result = run_bare(probe, service.env)
    assert result.returncode == 0, shown(result)
    seen = json.loads(result.stdout)
    assert seen["missing"] == ["runwarden", "schemas", "store", "producers", "workers"], seen
    assert str(ROOT) not in seen["path"], seen
    assert str(ROOT) not in service.env["PYTHONPATH"].split(os.pathsep)
    # The snippet itself imports nothing of runwarden.
    imports = re.findall(r"^(?:from|import) (\w+)", guide_snippet(), re.MULTILINE)
    stdlib = {"hashlib", "hmac", "json", "os", "sys", "time", "uuid"}
    assert set(imports) == {*stdlib, "celery"}, imports


def test_a_stop_from_the_service_is_recorded_as_asked_by_it(
    pipeline: Pipeline, service: OtherService
) -> None:
    run_id = launch_long(pipeline)
    stop = service.answer("runwarden.snapshot_request", {"run_id": run_id, "reason": "cost"})
    assert (stop["run_id"], stop["reason"], stop["asked_by"]) == (run_id, "cost", PRODUCER), stop
    run = pipeline.wait_state(run_id, timeout_s=TIMEOUT_S)
    assert run.state is RunState.STOPPED, run
    assert run.snapshot is not None
    assert run.snapshot.reason is SnapshotReason.COST
    assert (Path(run.remote_dir) / run.snapshot.checkpoint).is_dir()
    (closed,) = pipeline.api.store.stops.history(run_id)
    assert closed.asked_by == PRODUCER


def test_a_cancel_from_the_service(pipeline: Pipeline, service: OtherService) -> None:
    run_id = launch_long(pipeline)
    answer = service.answer("runwarden.cancel", {"run_id": run_id})
    assert answer == {"run_id": run_id, "state": "cancelled"}
    run = pipeline.api.get_run(run_id)
    assert run.state is RunState.CANCELLED, run
    assert run.snapshot is None


def test_a_launch_from_the_service_runs_once_per_key(
    pipeline: Pipeline, service: OtherService
) -> None:
    body = {"target": "local", "command": toy(*LONG_TOY), "name": "nightly", "key": "bare-1"}
    answer = service.answer("runwarden.launch", body)
    run_id = answer["run_id"]
    try:
        assert run_id.endswith("-nightly"), answer
        run = pipeline.api.get_run(run_id)
        assert run.state is RunState.RUNNING, run
        assert run.job is not None
        assert answer["pid"] == run.job.pid
        pipeline.wait_step(run_id, 2)
        # The same launch given again (a retry of the service) finds the same run.
        assert service.answer("runwarden.launch", body)["run_id"] == run_id
        assert sum(r.id.endswith("-nightly") for r in pipeline.api.list_runs()) == 1
        assert pipeline.api.get_run(run_id).state is RunState.RUNNING
    finally:
        pipeline.api.cancel(run_id)


def test_an_unsigned_message_is_refused_in_its_result(
    pipeline: Pipeline, service: OtherService
) -> None:
    run_id = launch_long(pipeline)
    try:
        script = service.home / "unsigned.py"
        script.write_text(UNSIGNED, encoding="utf-8")
        body = {"run_id": run_id, "reason": "cost"}
        result = run_bare(script, service.env, "runwarden.snapshot_request", json.dumps(body))
        assert result.returncode == 0, shown(result)
        assert json.loads(result.stdout) == {
            "error": "Unauthenticated",
            "message": "runwarden.snapshot_request: the message is not signed (no 'auth')",
        }, shown(result)
        assert pipeline.api.get_stop(run_id) is None
        assert pipeline.api.store.stops.history(run_id) == []
        assert pipeline.api.get_run(run_id).state is RunState.RUNNING
    finally:
        pipeline.api.cancel(run_id)


def test_a_message_signed_with_another_key_is_refused(
    pipeline: Pipeline, service: OtherService, tmp_path: Path
) -> None:
    run_id = launch_long(pipeline)
    try:
        forged = tmp_path / "producer.billing.key"
        forged.write_text("0" * 64 + "\n")
        env = {**service.env, "RUNWARDEN_KEY_FILE": str(forged)}
        result = run_bare(service.script, env, "runwarden.cancel", json.dumps({"run_id": run_id}))
        assert result.returncode == 1, shown(result)
        assert result.stdout == "", shown(result)
        assert result.stderr == (
            "runwarden.cancel: Unauthenticated: runwarden.cancel: the signature of "
            f"'{PRODUCER}' does not match\n"
        ), shown(result)
        assert pipeline.api.get_run(run_id).state is RunState.RUNNING
    finally:
        pipeline.api.cancel(run_id)


def test_a_revoked_or_rotated_key_is_refused_within_seconds(
    pipeline: Pipeline, service: OtherService, key_file: Path, tmp_path: Path
) -> None:
    """`producers rm billing`: the service's next message is refused within 5 s, with
    no worker restarted; `producers add billing` again (a rotation): the new key is
    accepted and the old one still refused. The original key is put back after."""
    run_id = launch_long(pipeline)
    held = pipeline.api.settings.secrets.path / key_file.name
    password = pipeline.api.settings.secrets.path / f"redis-password.producer-{PRODUCER}"
    kept = password.read_bytes()
    # The key's revocation, not the Redis user's (which `producers rm` removes too):
    # the old key is sent through the operator's connection.
    old_env = bare_env(pipeline.api.settings.broker_url(), key_file)
    body = json.dumps({"run_id": run_id})

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "producers.cli", *args], cwd=ROOT, env=pipeline.env,
            stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip

    def refused(env: dict[str, str]) -> bool:
        result = run_bare(service.script, env, "runwarden.follow", body)
        return result.returncode == 1 and "Unauthenticated" in result.stderr

    try:
        assert run_bare(service.script, old_env, "runwarden.follow", body).returncode == 0
        assert cli("producers", "rm", PRODUCER).returncode == 0
        revoked = time.monotonic()
        wait_for(lambda: refused(old_env), timeout_s=5)
        print(f"revoked: refused {time.monotonic() - revoked:.2f} s after producers rm")
        made = cli("producers", "add", PRODUCER)
        assert made.stdout.startswith("created "), shown(made)
        rotated = tmp_path / key_file.name
        rotated.write_bytes(held.read_bytes())
        rotated.chmod(0o600)
        new_env = bare_env(pipeline.api.settings.broker_url(), rotated)
        wait_for(
            lambda: run_bare(service.script, new_env, "runwarden.follow", body).returncode == 0,
            timeout_s=5,
        )
        assert refused(old_env)  # the old key, after the rotation
    finally:
        # A new file (the directory changes): every worker reads it at its next message.
        held.unlink(missing_ok=True)
        held.write_bytes(key_file.read_bytes())
        held.chmod(0o600)
        # Its Redis user as it was, for the module's other tests.
        password.unlink(missing_ok=True)
        password.write_bytes(kept)
        password.chmod(0o600)
        pipeline.api.add_producer_user(PRODUCER)
        pipeline.api.cancel(run_id)


def test_the_service_s_redis_user_can_do_nothing_else(
    pipeline: Pipeline, service: OtherService
) -> None:
    """Connected as its own Redis user (`store/acl.py`), the service that sends stops
    and reads their results (the tests above) cannot read a run's record or log, list
    or delete keys, push to the workers' internal queue, or use Celery's remote
    control: each is refused by Redis, and nothing changed."""
    from celery import Celery

    run_id = launch_long(pipeline)
    try:
        url = user_url(pipeline).replace("redis+socket://", "unix://", 1)
        mine = redis.Redis.from_url(url)
        assert mine.ping()
        tries = [
            lambda: mine.get(f"rw:run:{run_id}"),
            lambda: mine.xrange(f"rw:log:{run_id}"),
            lambda: mine.keys("*"),
            lambda: mine.delete(f"rw:run:{run_id}"),
            lambda: mine.lpush("runwarden.watch", "{}"),
            lambda: mine.publish("/0.celery.pidbox", "{}"),
            lambda: mine.execute_command("PSUBSCRIBE", "celery-task-meta-*"),
            lambda: mine.acl_setuser("producer-billing", enabled=True),
        ]
        for attempt in tries:
            with pytest.raises(redis.exceptions.NoPermissionError):
                attempt()
        app = Celery(broker=user_url(pipeline), backend=user_url(pipeline))
        with pytest.raises(Exception, match="no permissions"):
            app.control.shutdown()
        with pytest.raises(Exception, match="no permissions"):
            app.control.revoke("any-task-id")
        # The workers are all there, the run untouched.
        assert pipeline.api.app.control.ping(timeout=2)
        assert pipeline.api.get_run(run_id).state is RunState.RUNNING
    finally:
        pipeline.api.cancel(run_id)
