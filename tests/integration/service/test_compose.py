"""docker-compose.yml: accepted by `docker-compose config`, AOF and a password on
Redis, basic auth on Flower, no secret written in the file, an init in every
container of ours (jobs' orphans are reaped)."""

from __future__ import annotations

import os
import subprocess
from typing import Any

import pytest
import yaml

from ...conftest import ROOT

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
