"""docker-compose.yml: accepted by `docker-compose config`, AOF and a password on
Redis, its memory bounded (`maxmemory` from `RUNWARDEN_REDIS_MAXMEMORY`, the settings'
default, `noeviction`; the resolved options run by a real redis-server), basic auth
on Flower, every credential a docker secret (on no command line, in no environment,
never written in the file), an init in every container of ours (jobs' orphans are
reaped), `runwarden status` as beat's health check."""

from __future__ import annotations

import os
import shlex
import subprocess
from pathlib import Path
from typing import Any

import pytest
import redis
import yaml

from bench.harness.ports import free_port
from bench.harness.redis_server import REDIS_SERVER, RedisServer
from schemas import Settings
from schemas.bounds import parse_size

from ...conftest import ROOT, wait_for

CREDENTIALS = {
    "redis-password",
    "redis-password.worker",
    "flower-basic-auth",
    "producer.operator.key",
    "producer.worker.key",
    "operator.target.pub",
}


def config(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["docker-compose", "-f", str(ROOT / "docker-compose.yml"), "config"],
        env={**os.environ, **env}, capture_output=True, text=True, check=False, cwd=ROOT,
    )  # fmt: skip


@pytest.fixture(scope="module")
def resolved() -> dict[str, Any]:
    done = config({"RUNWARDEN_SECRETS_HOST_DIR": "/srv/runwarden/secrets"})
    assert done.returncode == 0, done.stderr
    loaded: dict[str, Any] = yaml.safe_load(done.stdout)
    return loaded


def _secrets_of(service: dict[str, Any]) -> set[str]:
    return {s["source"] if isinstance(s, dict) else s for s in service.get("secrets", [])}


def test_compose_accepts_the_file(resolved: dict[str, Any]) -> None:
    services = {"redis", "worker", "retriever", "watcher", "beat", "flower"}
    assert set(resolved["services"]) == services


def test_every_credential_is_a_docker_secret(resolved: dict[str, Any]) -> None:
    assert set(resolved["secrets"]) == CREDENTIALS
    for name, secret in resolved["secrets"].items():
        assert secret["file"] == f"/srv/runwarden/secrets/{name}"
    for name in ("worker", "retriever", "watcher", "beat"):
        service = resolved["services"][name]
        # The workers' own Redis user, never the operator's password.
        assert _secrets_of(service) >= {"redis-password.worker"}
        assert "redis-password" not in _secrets_of(service)
        assert service["environment"]["RUNWARDEN_REDIS_USER"] == "worker"
        assert service["environment"]["RUNWARDEN_SECRETS_DIR"] == "/run/secrets"
    assert "producer.worker.key" in _secrets_of(resolved["services"]["worker"])
    assert "flower-basic-auth" not in _secrets_of(resolved["services"]["worker"])


def test_redis_has_aof_and_a_password_on_no_command_line(resolved: dict[str, Any]) -> None:
    redis = resolved["services"]["redis"]
    script = redis["command"][-1]
    assert "redis-server -" in script  # its configuration from standard input
    assert "--appendonly yes" in script
    assert "/run/secrets/redis-password" in script
    assert "requirepass" in script
    assert "--requirepass" not in script
    assert _secrets_of(redis) == {"redis-password", "redis-password.worker"}
    url = resolved["services"]["worker"]["environment"]["RUNWARDEN_REDIS_URL"]
    assert url == "redis://redis:6379/0"  # the password is added from the secret


def test_flower_has_basic_auth_from_a_file_and_listens_on_loopback(
    resolved: dict[str, Any],
) -> None:
    flower = resolved["services"]["flower"]
    assert "--conf=/app/producers/flower_config.py" in flower["command"]
    assert not any("basic-auth" in part for part in flower["command"])
    assert flower["environment"]["RUNWARDEN_FLOWER_AUTH_FILE"] == "/run/secrets/flower-basic-auth"
    assert "flower-basic-auth" in _secrets_of(flower)
    # Short syntax (`host_ip:published:target`) or long, as the compose version writes it.
    for port in flower["ports"]:
        host_ip = port.get("host_ip") if isinstance(port, dict) else str(port).split(":")[0]
        assert host_ip == "127.0.0.1", port


def test_one_image_with_an_init(resolved: dict[str, Any]) -> None:
    for name in ("worker", "retriever", "beat", "flower"):
        service = resolved["services"][name]
        assert service["image"] == "runwarden:latest"
        assert service["init"] is True


def test_no_credential_in_an_environment_or_on_a_command_line(resolved: dict[str, Any]) -> None:
    """Environments hold paths of secret files at most; commands hold no credential
    option; the files hold no value of a credential."""
    for name, service in resolved["services"].items():
        for key, value in (service.get("environment") or {}).items():
            if any(word in key for word in ("PASSWORD", "TOKEN", "SECRET", "AUTH", "KEY")):
                assert str(value).startswith("/run/secrets"), (name, key)
            assert "@" not in str(value), (name, key)  # no user:password@ in a URL
        command = " ".join(map(str, service.get("command") or []))
        for option in ("--requirepass", "--basic-auth", "--password", "-a "):
            assert option not in command, (name, option)
    for file_name in ("docker-compose.yml", "Dockerfile"):
        text = (ROOT / file_name).read_text()
        for option in ("--requirepass", "--basic-auth", "PASSWORD=", "PASSWORD:"):
            assert option not in text, (file_name, option)


def test_retrievals_and_follow_ticks_have_workers_of_their_own(resolved: dict[str, Any]) -> None:
    """A long download must never hold a process a stop's deadline needs, nor a storm
    of cancels the follow ticks: the main worker consumes `runwarden` (and `celery`)
    only, the retriever `runwarden.retrieve` only, the watcher `runwarden.watch` only;
    the worker and the retriever keep the artifacts in the same volume."""
    worker = resolved["services"]["worker"]["command"]
    retriever = resolved["services"]["retriever"]["command"]
    watcher = resolved["services"]["watcher"]["command"]
    # `celery` too: a bare `send_task` of another service lands there.
    assert worker[worker.index("-Q") + 1] == "runwarden,celery"
    assert retriever[retriever.index("-Q") + 1] == "runwarden.retrieve"
    assert watcher[watcher.index("-Q") + 1] == "runwarden.watch"

    def artifacts(name: str) -> list[Any]:
        return [
            v
            for v in resolved["services"][name]["volumes"]
            if (v.get("target") if isinstance(v, dict) else str(v).split(":")[1])
            == "/home/runwarden/state/runs"
        ]

    assert artifacts("worker")
    assert artifacts("retriever")


def redis_options(resolved: dict[str, Any]) -> list[str]:
    """The options compose gives redis-server after its configuration from standard
    input (which holds only the password: a test server is reached without one)."""
    script = str(resolved["services"]["redis"]["command"][-1])
    return shlex.split(script.split("redis-server -", 1)[1])


class ComposeRedis(RedisServer):
    """A test redis-server run with compose's options on top of its own."""

    def __init__(self, data_dir: Path, options: list[str]) -> None:
        super().__init__(data_dir)
        self.options = options

    def argv(self) -> list[str]:
        return [*super().argv(), *self.options]


def test_redis_memory_is_bounded_without_eviction(resolved: dict[str, Any]) -> None:
    options = redis_options(resolved)
    assert options[options.index("--maxmemory-policy") + 1] == "noeviction"
    # The default is the settings' own (which the embedded server uses).
    assert parse_size(options[options.index("--maxmemory") + 1]) == Settings().redis_maxmemory


def test_redis_maxmemory_comes_from_the_environment() -> None:
    done = config({"RUNWARDEN_SECRETS_HOST_DIR": "/srv/s", "RUNWARDEN_REDIS_MAXMEMORY": "512mb"})
    assert done.returncode == 0, done.stderr
    options = redis_options(yaml.safe_load(done.stdout))
    assert options[options.index("--maxmemory") + 1] == "512mb"


def test_a_real_redis_server_runs_compose_s_options(
    resolved: dict[str, Any], tmp_path: Path
) -> None:
    server = ComposeRedis(tmp_path / "redis", redis_options(resolved))
    server.start()
    try:
        client = server.client()
        assert client.config_get("maxmemory") == {"maxmemory": str(2 * 1024**3)}
        assert client.config_get("maxmemory-policy") == {"maxmemory-policy": "noeviction"}
        assert client.config_get("appendonly") == {"appendonly": "yes"}
        client.close()
    finally:
        server.stop()


def test_beat_runs_the_service_health_check(resolved: dict[str, Any]) -> None:
    check = resolved["services"]["beat"]["healthcheck"]
    assert check["test"] == ["CMD", "runwarden", "status"]
    assert check["retries"] >= 1
    assert _secrets_of(resolved["services"]["beat"]) >= {"redis-password.worker"}


def test_compose_s_redis_gives_the_workers_their_user(
    resolved: dict[str, Any], tmp_path: Path
) -> None:
    """The configuration compose's Redis reads from its standard input, made by its own
    script from two secret files, run by a real redis-server: the `worker` user works
    with its password and is refused a dangerous command; the operator's password
    still opens the `default` user."""
    secrets_dir = tmp_path / "secrets"
    secrets_dir.mkdir()
    (secrets_dir / "redis-password").write_text("operator-pw")
    (secrets_dir / "redis-password.worker").write_text("worker-pw")
    script = str(resolved["services"]["redis"]["command"][-1]).replace("$$", "$")
    printing = script.split("| exec redis-server -", 1)[0].replace("/run/secrets", str(secrets_dir))
    done = subprocess.run(["sh", "-c", printing], capture_output=True, text=True, check=True)
    conf = tmp_path / "redis.conf"
    conf.write_text(done.stdout)
    socket = str(tmp_path / "redis.sock")
    server = subprocess.Popen(
        [REDIS_SERVER, str(conf), "--port", "0", "--unixsocket", socket, "--dir",
         str(tmp_path), "--save", ""],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        operator = redis.Redis(unix_socket_path=socket, password="operator-pw")
        assert wait_for(lambda: _answers(operator), timeout_s=10)
        worker = redis.Redis(unix_socket_path=socket, username="worker", password="worker-pw")
        worker.set("rw:probe", "1")
        with pytest.raises(redis.exceptions.NoPermissionError):
            worker.config_set("dir", "/tmp")
        worker.close()
        assert operator.get("rw:probe") == b"1"
        operator.close()
    finally:
        server.terminate()
        server.wait(timeout=10)


def _answers(client: redis.Redis) -> bool:
    try:
        return bool(client.ping())
    except redis.ConnectionError:
        return False


# --- docker-compose.ha.yml: Redis behind Sentinel ----------------------------------


def ha_config(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    files = ["-f", str(ROOT / "docker-compose.yml"), "-f", str(ROOT / "docker-compose.ha.yml")]
    return subprocess.run(
        ["docker-compose", *files, "config"],
        env={**os.environ, **env}, capture_output=True, text=True, check=False, cwd=ROOT,
    )  # fmt: skip


@pytest.fixture(scope="module")
def ha() -> dict[str, Any]:
    done = ha_config({"RUNWARDEN_SECRETS_HOST_DIR": "/srv/runwarden/secrets"})
    assert done.returncode == 0, done.stderr
    loaded: dict[str, Any] = yaml.safe_load(done.stdout)
    return loaded


OURS = ("worker", "retriever", "watcher", "beat", "flower")


def test_the_ha_override_adds_a_replica_and_three_sentinels(ha: dict[str, Any]) -> None:
    sentinels = {"sentinel-1", "sentinel-2", "sentinel-3"}
    assert set(ha["services"]) == {*OURS, "redis", "redis-replica", *sentinels}
    assert set(ha["secrets"]) == CREDENTIALS | {"redis-sentinel-password"}
    replica = str(ha["services"]["redis-replica"]["command"][-1])
    assert "--replicaof redis 6379" in replica
    assert "masterauth" in replica
    assert "masterauth" in str(ha["services"]["redis"]["command"][-1])
    for name in sentinels:
        script = str(ha["services"][name]["command"][-1])
        assert "sentinel monitor runwarden redis 6379 2" in script
        assert "exec redis-sentinel" in script
        assert _secrets_of(ha["services"][name]) == {"redis-password", "redis-sentinel-password"}


def test_every_service_of_ours_reaches_redis_through_the_sentinels(ha: dict[str, Any]) -> None:
    for name in OURS:
        service = ha["services"][name]
        url = service["environment"]["RUNWARDEN_REDIS_URL"]
        settings = Settings(redis_url=url, secrets_dir=Path("/nonexistent"))
        address = settings.sentinel_address()
        assert address is not None, name
        assert address.master == "runwarden"
        assert [h for h, _ in address.sentinels] == ["sentinel-1", "sentinel-2", "sentinel-3"]
        assert settings.min_replicas == 1
        assert "redis-sentinel-password" in _secrets_of(service), name
    for name in ("worker", "retriever", "watcher", "beat"):
        service = ha["services"][name]
        assert service["environment"]["RUNWARDEN_REDIS_USER"] == "worker"
        assert "redis-password" not in _secrets_of(service)


def test_the_ha_override_puts_no_credential_in_an_environment_or_on_a_command_line(
    ha: dict[str, Any],
) -> None:
    for name, service in ha["services"].items():
        for key, value in (service.get("environment") or {}).items():
            if any(word in key for word in ("PASSWORD", "TOKEN", "SECRET", "AUTH", "KEY")):
                assert str(value).startswith("/run/secrets"), (name, key)
            assert "@" not in str(value), (name, key)
        command = " ".join(map(str, service.get("command") or []))
        for option in ("--requirepass", "--masterauth", "--password", "-a "):
            assert option not in command, (name, option)
    text = (ROOT / "docker-compose.ha.yml").read_text()
    for option in ("--requirepass", "--masterauth", "PASSWORD=", "PASSWORD:"):
        assert option not in text, option


def test_the_ha_sentinels_configuration_from_their_secrets(
    ha: dict[str, Any], tmp_path: Path
) -> None:
    """The configuration a sentinel of the override writes, from its two secret files,
    read by a real `redis-sentinel`-capable server's parser: it starts, answers with
    its password, and watches `runwarden`."""
    secrets_dir = tmp_path / "secrets"
    secrets_dir.mkdir()
    (secrets_dir / "redis-password").write_text("operator-pw")
    (secrets_dir / "redis-sentinel-password").write_text("sentinel-pw")
    script = str(ha["services"]["sentinel-1"]["command"][-1]).replace("$$", "$")
    printing = script.split("&& exec redis-sentinel", 1)[0]
    printing = printing.replace("/run/secrets", str(secrets_dir)).replace(
        "/tmp/sentinel.conf", str(tmp_path / "sentinel.conf")
    )
    subprocess.run(["sh", "-c", printing], check=True)
    conf = (tmp_path / "sentinel.conf").read_text()
    assert 'requirepass "sentinel-pw"' in conf
    assert 'sentinel auth-pass runwarden "operator-pw"' in conf
    # The master's host name resolves in compose's network only: here, loopback.
    conf = conf.replace(
        "sentinel monitor runwarden redis 6379", "sentinel monitor runwarden 127.0.0.1 6379"
    )
    port = free_port()
    (tmp_path / "sentinel.conf").write_text(conf.replace("port 26379", f"port {port}"))
    server = subprocess.Popen(
        [REDIS_SERVER, str(tmp_path / "sentinel.conf"), "--sentinel", "--dir", str(tmp_path)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        client = redis.Redis(host="127.0.0.1", port=port, password="sentinel-pw")
        assert wait_for(lambda: _answers(client), timeout_s=10)
        assert client.sentinel_master("runwarden")["name"] == "runwarden"
        client.close()
    finally:
        server.terminate()
        server.wait(timeout=10)
