"""Trust boundaries through `runwarden serve` (the embedded default, with Flower and
the web view): what a launch may ask of a target, targets that only the operator can
define (and no one can roll back or revive), credentials on no command line and in no
environment of the service's own processes, Redis, Flower and the web view never
open."""

from __future__ import annotations

import base64
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis

from bench.harness.users import as_the_worker_args
from schemas import Settings
from schemas.secrets import service_redis_password_file
from store.acl import WEB_USER, set_web_user
from workers.target_versions import VERSIONS_FILE

from ...conftest import ROOT, wait_for
from .test_cli import _embedded_env, ok, refused, run_cli
from .test_flower import free_port

pytestmark = pytest.mark.slow

AS_THE_WORKER = as_the_worker_args()
"""`targets add`'s options for a local target whose jobs run as this process's user."""

TOKEN = "hf-s3cr3t-v4lue-that-must-not-leak"


@dataclass
class Served:
    env: dict[str, str]
    settings: Settings
    proc: subprocess.Popen[bytes]
    workdir: Path
    root: Path
    flower_port: int
    web_port: int


def _descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", encoding="ascii", errors="replace") as handle:
                ppid = int(handle.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    found, todo = [], [pid]
    while todo:
        current = todo.pop()
        found.append(current)
        todo.extend(children.get(current, []))
    return found


def _read(path: str) -> bytes:
    try:
        with open(path, "rb") as handle:
            return handle.read()
    except OSError:
        return b""


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    tmp = tmp_path_factory.mktemp("security")
    state = tmp / "state"
    env = _embedded_env(state)
    settings = Settings(state_dir=state)
    settings.secrets.ensure("HF_TOKEN", TOKEN)
    flower_port, web_port = free_port(), free_port()
    log = (tmp / "serve.log").open("wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "producers.cli", "serve", "--concurrency", "1", "--flower",
         "--flower-port", str(flower_port), "--web", "--web-port", str(web_port)],
        cwd=ROOT, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
        start_new_session=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while run_cli(env, "runs", "--json").returncode != 0:
            assert proc.poll() is None, (tmp / "serve.log").read_text()
            assert time.monotonic() < deadline, (tmp / "serve.log").read_text()
            time.sleep(0.3)
        workdir, root = tmp / "work", tmp / "uploads"
        (root / "project").mkdir(parents=True)
        (root / "project" / "train.py").write_text("print('hi')\n")
        ok(run_cli(env, "targets", "add", "here", "--workdir", str(workdir),
                   "--allow-secret", "HF_TOKEN", "--upload-root", str(root),
                   *AS_THE_WORKER))  # fmt: skip
        yield Served(env, settings, proc, workdir, root, flower_port, web_port)
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=90)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        log.close()


def _launch(
    served: Served, *options: str, script: str = "sleep 60"
) -> subprocess.CompletedProcess[str]:
    return run_cli(served.env, "launch", "--target", "here", *options, "--", "sh", "-c", script)


def test_a_launch_gets_only_what_its_target_allows(served: Served) -> None:
    before = set(os.listdir(served.workdir)) if served.workdir.exists() else set()
    line = refused(_launch(served, "--secret", "AWS_KEY"), 1, "does not allow the secret")
    assert "AWS_KEY" in line
    outside = served.root.parent / "elsewhere"
    outside.mkdir(exist_ok=True)
    refused(_launch(served, "--upload", str(outside)), 1, "outside the upload roots")
    # A link inside a root that leads outside it is outside.
    link = served.root / "sneaky"
    if not link.exists():
        link.symlink_to(outside)
    refused(_launch(served, "--upload", str(link)), 1, "outside the upload roots")
    refused(_launch(served, "--upload", "/root/.ssh"), 1, "outside the upload roots")
    after = set(os.listdir(served.workdir)) if served.workdir.exists() else set()
    assert after - before == set()  # nothing claimed, nothing started

    # What it allows works: the secret reaches the job, the upload arrives.
    script = 'printf "%s\\n" "${#HF_TOKEN}" "$HF_TOKEN" > token.seen; exec sleep 60'
    run_id = ok(_launch(served, "--secret", "HF_TOKEN", "--upload",
                        str(served.root / "project"), script=script)).strip()  # fmt: skip
    record = json.loads(ok(run_cli(served.env, "show", run_id, "--json")))
    run_dir = Path(record["remote_dir"])
    deadline = time.monotonic() + 30
    while not (run_dir / "token.seen").exists():
        assert time.monotonic() < deadline
        time.sleep(0.2)
    time.sleep(0.2)
    assert (run_dir / "token.seen").read_text().splitlines() == [str(len(TOKEN)), TOKEN]
    assert (run_dir / "train.py").exists()
    assert record["secrets"] == ["HF_TOKEN"]
    ok(run_cli(served.env, "cancel", run_id))


def test_a_target_written_into_redis_by_anyone_else_is_refused(served: Served) -> None:
    client = redis.Redis.from_url(served.settings.store_url())
    evil = {"config": {"name": "evil", "kind": "local", "workdir": "/tmp/evil-runs"},
            "signature": "0" * 64}  # fmt: skip
    client.hset("rw:targets", "evil", json.dumps(evil))
    bare = {"name": "bare", "kind": "local", "workdir": "/tmp/x"}  # an older, unsigned record
    client.hset("rw:targets", "bare", json.dumps(bare))
    for name in ("evil", "bare"):
        result = run_cli(served.env, "launch", "--target", name, "--", "true")
        refused(result, 1, "not signed by the operator")
    assert not Path("/tmp/evil-runs").exists()


def test_no_credential_on_a_command_line_or_in_an_environment(served: Served) -> None:
    secrets = served.settings.secrets
    values = {
        name: secrets.read(name)
        for name in ("redis-password", "redis-password.worker", "redis-password.web",
                     "flower-basic-auth", "producer.operator.key", "producer.worker.key",
                     "HF_TOKEN")
    }  # fmt: skip
    needles = {name: v.get_secret_value().encode() for name, v in values.items() if v}
    needles["flower-password"] = needles["flower-basic-auth"].split(b":", 1)[1]
    assert len(needles) == 8
    checked = 0
    for pid in _descendants(served.proc.pid):
        environ = _read(f"/proc/{pid}/environ")
        if b"RUNWARDEN_RUN_ID=" in environ:
            continue  # a job's own process: its secrets are its own
        cmdline = _read(f"/proc/{pid}/cmdline")
        for name, needle in needles.items():
            assert needle not in cmdline, (pid, name, cmdline)
            assert needle not in environ, (pid, name)
        checked += 1
    assert checked >= 5  # serve, redis, two workers and their pools, beat, flower
    # Every file holding one is the worker's alone.
    for name in values:
        assert (secrets.path / name).stat().st_mode & 0o077 == 0, name
    assert secrets.path.stat().st_mode & 0o077 == 0


def test_redis_flower_and_the_web_view_are_never_open(served: Served) -> None:
    bare = redis.Redis(unix_socket_path=str(served.settings.embedded_socket))
    with pytest.raises(redis.AuthenticationError):
        bare.ping()
    assert redis.Redis.from_url(served.settings.store_url()).ping()
    value = served.settings.secrets.read("flower-basic-auth")
    assert value is not None
    good = "Basic " + base64.b64encode(value.get_secret_value().encode()).decode()
    for port, path in ((served.flower_port, "/api/workers"), (served.web_port, "/api/runs")):
        url = f"http://127.0.0.1:{port}{path}"
        deadline = time.monotonic() + 30
        while True:
            try:
                with pytest.raises(urllib.error.HTTPError) as raised:
                    urllib.request.urlopen(url, timeout=5)
                break
            except urllib.error.URLError:
                assert time.monotonic() < deadline, url
                time.sleep(0.3)
        assert raised.value.code == 401, url
        request = urllib.request.Request(url, headers={"Authorization": good})
        with urllib.request.urlopen(request, timeout=10) as response:  # noqa: S310
            assert response.status == 200, url


def _web(served: Served, path: str, form: dict[str, str] | None = None) -> tuple[int, str]:
    """The status and body of `path` of serve's web view, with its credentials (a
    `form` is POSTed from the view's own origin; a redirect is followed)."""
    value = served.settings.secrets.read("flower-basic-auth")
    assert value is not None
    origin = f"http://127.0.0.1:{served.web_port}"
    headers = {
        "Authorization": "Basic " + base64.b64encode(value.get_secret_value().encode()).decode(),
        "Origin": origin,
    }
    data = None if form is None else urllib.parse.urlencode(form).encode()
    request = urllib.request.Request(origin + path, data=data, headers=headers)  # noqa: S310
    try:
        with urllib.request.urlopen(request, timeout=120) as response:  # noqa: S310
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def test_serve_s_web_view_connects_to_redis_as_its_own_user(served: Served) -> None:
    """The web view, a thread of serve, connects to the embedded Redis as `web`
    (store/acl.py, `web_rules`), not as the operator: once it served a run, `CLIENT
    LIST` shows connections of `web`; a cancel sent from it works with nothing refused
    (`ACL LOG`); with the user deleted (its connections end) the view cannot read the
    store, and reads it again once the user is back."""
    operator = redis.Redis.from_url(served.settings.store_url(), socket_timeout=5)
    operator.acl_log_reset()
    run_id = ok(_launch(served)).strip()
    assert _web(served, f"/api/runs/{run_id}")[0] == 200
    users = [c["user"] for c in operator.client_list()]
    assert WEB_USER in users, users
    status, page = _web(served, f"/runs/{run_id}")
    assert status == 200
    token = re.search(r'name="csrf" value="([^"]+)"', page)
    assert token, page
    form = {"csrf": token.group(1), "confirmed": "yes"}
    assert _web(served, f"/runs/{run_id}/cancel", form)[0] == 200  # the run page, after 303
    record = json.loads(ok(run_cli(served.env, "show", run_id, "--json")))
    assert record["state"] == "cancelled"
    assert [e for e in operator.acl_log() if e["username"] == WEB_USER] == []
    password = served.settings.secrets.read(service_redis_password_file(WEB_USER))
    assert password is not None
    try:
        assert operator.acl_deluser(WEB_USER) == 1
        assert _web(served, "/api/runs")[0] == 503
    finally:
        set_web_user(operator, password)
    assert wait_for(lambda: _web(served, "/api/runs")[0] == 200)
    operator.close()


def _versions(served: Served) -> dict[str, int]:
    try:
        found = json.loads((served.settings.state_dir / VERSIONS_FILE).read_text())
    except (OSError, ValueError):
        return {}
    return found if isinstance(found, dict) else {}


def test_a_target_written_back_or_revived_is_refused(served: Served) -> None:
    """The operator tightens `here` (no more HF_TOKEN) and removes `gone`; someone with
    Redis writes each one's old record back (signed by the operator, but older): once
    the workers saw the new versions (reconcile reads every record), both are refused,
    nothing is claimed, and the secret reaches no job."""
    client = redis.Redis.from_url(served.settings.store_url())
    common = ("--upload-root", str(served.root), *AS_THE_WORKER)
    gone_dir = served.root.parent / "gone-runs"
    ok(run_cli(served.env, "targets", "add", "gone", "--workdir", str(gone_dir), *common))
    allowing, old_gone = client.hget("rw:targets", "here"), client.hget("rw:targets", "gone")
    assert allowing is not None
    assert old_gone is not None
    try:
        ok(run_cli(served.env, "targets", "add", "here", "--workdir", str(served.workdir),
                   *common))  # fmt: skip
        ok(run_cli(served.env, "targets", "rm", "gone"))
        stored = {n: json.loads(client.hget("rw:targets", n) or "{}")["version"]
                  for n in ("here", "gone")}  # fmt: skip
        assert json.loads(client.hget("rw:targets", "gone") or "{}").get("removed") is True
        deadline = time.monotonic() + 15
        while any(_versions(served).get(n, 0) < v for n, v in stored.items()):
            assert time.monotonic() < deadline, (_versions(served), stored)
            time.sleep(0.2)

        client.hset("rw:targets", "here", allowing)  # rolled back
        client.hset("rw:targets", "gone", old_gone)  # revived
        before = set(os.listdir(served.workdir)) if served.workdir.exists() else set()
        line = refused(_launch(served, "--secret", "HF_TOKEN", script="env > env.seen"), 1)
        assert "target 'here'" in line
        assert "older than version" in line
        line = refused(run_cli(served.env, "launch", "--target", "gone", "--", "true"), 1)
        assert "target 'gone'" in line
        assert "older than version" in line
        after = set(os.listdir(served.workdir)) if served.workdir.exists() else set()
        assert after == before
        assert not gone_dir.exists()  # nothing claimed
    finally:
        # The module's other tests use `here` as the fixture made it.
        ok(run_cli(served.env, "targets", "add", "here", "--workdir", str(served.workdir),
                   "--allow-secret", "HF_TOKEN", *common))  # fmt: skip
