"""docker-compose.yml: accepted by `docker-compose config`, AOF and a password on
Redis, its memory bounded (`maxmemory` from `RUNWARDEN_REDIS_MAXMEMORY`, the settings'
default, `noeviction`; the resolved options run by a real redis-server), basic auth
on Flower, no secret written in the file, an init in every container of ours (jobs'
orphans are reaped)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from schemas import Settings
from schemas.bounds import parse_size

from ...conftest import ROOT
from ...redis_server import RedisServer

SECRETS = {
    "RUNWARDEN_REDIS_PASSWORD": "s3cret-pw",
    "FLOWER_USER": "ops",
    "FLOWER_PASSWORD": "fl0wer-pw",
}


def config(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if k not in SECRETS}
    return subprocess.run(
        ["docker-compose", "-f", str(ROOT / "docker-compose.yml"), "config"],
        env={**base, **env}, capture_output=True, text=True, check=False, cwd=ROOT,
    )  # fmt: skip


@pytest.fixture(scope="module")
def resolved() -> dict[str, Any]:
    done = config(SECRETS)
    assert done.returncode == 0, done.stderr
    loaded: dict[str, Any] = yaml.safe_load(done.stdout)
    return loaded


def test_compose_accepts_the_file(resolved: dict[str, Any]) -> None:
    assert set(resolved["services"]) == {"redis", "worker", "retriever", "beat", "flower"}


def test_redis_has_aof_and_a_password(resolved: dict[str, Any]) -> None:
    command = resolved["services"]["redis"]["command"]
    assert command[command.index("--appendonly") + 1] == "yes"
    assert command[command.index("--requirepass") + 1] == SECRETS["RUNWARDEN_REDIS_PASSWORD"]
    url = resolved["services"]["worker"]["environment"]["RUNWARDEN_REDIS_URL"]
    assert f":{SECRETS['RUNWARDEN_REDIS_PASSWORD']}@redis:6379" in url


def test_flower_has_basic_auth_and_listens_on_loopback(resolved: dict[str, Any]) -> None:
    flower = resolved["services"]["flower"]
    assert "--basic-auth=ops:fl0wer-pw" in flower["command"]
    # Short syntax (`host_ip:published:target`) or long, as the compose version writes it.
    for port in flower["ports"]:
        host_ip = port.get("host_ip") if isinstance(port, dict) else str(port).split(":")[0]
        assert host_ip == "127.0.0.1", port


def test_one_image_with_an_init(resolved: dict[str, Any]) -> None:
    for name in ("worker", "retriever", "beat", "flower"):
        service = resolved["services"][name]
        assert service["image"] == "runwarden:latest"
        assert service["init"] is True


@pytest.mark.parametrize("missing", sorted(SECRETS))
def test_a_missing_secret_is_refused(missing: str) -> None:
    done = config({k: v for k, v in SECRETS.items() if k != missing})
    assert done.returncode != 0
    assert missing in done.stderr


def test_every_password_comes_from_the_environment() -> None:
    for name in ("docker-compose.yml", "Dockerfile"):
        for line in (ROOT / name).read_text().splitlines():
            if line.lstrip().startswith("#"):
                continue
            if "PASSWORD" in line or "requirepass" in line or "basic-auth" in line:
                assert "${" in line or "--requirepass" in line, line


def test_retrievals_have_a_worker_of_their_own(resolved: dict[str, Any]) -> None:
    """A long download must never hold a process a stop's deadline needs: the main
    worker consumes `runwarden` only, the retriever `runwarden.retrieve` only, and
    both keep the artifacts in the same volume."""
    worker = resolved["services"]["worker"]["command"]
    retriever = resolved["services"]["retriever"]["command"]
    assert worker[worker.index("-Q") + 1] == "runwarden"
    assert retriever[retriever.index("-Q") + 1] == "runwarden.retrieve"
    def artifacts(name: str) -> list[Any]:
        return [
            v for v in resolved["services"][name]["volumes"]
            if (v.get("target") if isinstance(v, dict) else str(v).split(":")[1])
            == "/home/runwarden/state/runs"
        ]
    assert artifacts("worker")
    assert artifacts("retriever")


def redis_options(resolved: dict[str, Any]) -> list[str]:
    """The options of compose's redis-server command, without the password (a test
    server is reached without one)."""
    command: list[str] = list(resolved["services"]["redis"]["command"])
    assert command[0] == "redis-server"
    at = command.index("--requirepass")
    return command[1:at] + command[at + 2 :]


class ComposeRedis(RedisServer):
    """A test redis-server run with compose's options on top of its own."""

    def __init__(self, data_dir: Path, options: list[str]) -> None:
        super().__init__(data_dir)
        self.options = options

    def argv(self) -> list[str]:
        return [*super().argv(), *self.options]


def test_redis_memory_is_bounded_without_eviction(resolved: dict[str, Any]) -> None:
    command = resolved["services"]["redis"]["command"]
    assert command[command.index("--maxmemory-policy") + 1] == "noeviction"
    # The default is the settings' own (which the embedded server uses).
    assert parse_size(command[command.index("--maxmemory") + 1]) == Settings().redis_maxmemory


def test_redis_maxmemory_comes_from_the_environment() -> None:
    done = config({**SECRETS, "RUNWARDEN_REDIS_MAXMEMORY": "512mb"})
    assert done.returncode == 0, done.stderr
    command = yaml.safe_load(done.stdout)["services"]["redis"]["command"]
    assert command[command.index("--maxmemory") + 1] == "512mb"


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
