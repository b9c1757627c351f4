"""`runwarden producers add|rm` tell where the producer's Redis user went: the servers
written, and for each replica missed the exact reason and what to do, in words and in
`--json`; the exit code stays 0 when the primary took it. The API is a stub here (its
servers are tests/integration/service/test_sentinel.py's)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

import producers.api
from producers.cli import app
from producers.cli import producers as cli_producers
from producers.redis_users import AddedUser, RemovedUser, ServerMissed, ServerWritten
from schemas import StoreError

PRIMARY = ServerWritten("10.0.0.1:6379", "primary", saved=True)
REPLICA = ServerWritten("10.0.0.2:6379", "replica", saved=False)
DOWN = ServerMissed("10.0.0.3:6379", "the sentinels see it down (s_down,disconnected)")


class StubApi:
    """`Runwarden` as the CLI uses it: the answers set on the class."""

    added: AddedUser | None = None
    removed: RemovedUser | None = None
    error: Exception | None = None

    def __init__(self, settings: Any) -> None:
        self.settings = settings

    def add_producer_user(self, name: str) -> AddedUser:
        if self.error is not None:
            raise self.error
        assert self.added is not None
        return self.added

    def remove_producer_user(self, name: str) -> RemovedUser:
        if self.error is not None:
            raise self.error
        assert self.removed is not None
        return self.removed


@pytest.fixture
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    monkeypatch.setattr(producers.api, "Runwarden", StubApi)
    monkeypatch.setattr(cli_producers, "serving", lambda settings: True)
    StubApi.added = StubApi.removed = StubApi.error = None
    return {
        "RUNWARDEN_STATE_DIR": str(tmp_path / "state"),
        "RUNWARDEN_REDIS_URL": "sentinel://10.0.0.9:26379/runwarden",
        "COLUMNS": "400",
    }


def invoke(env: dict[str, str], *args: str) -> tuple[int, str]:
    result = CliRunner().invoke(app, ["producers", *args], env=env)
    return result.exit_code, result.output


def added(tmp_path: Path, *, missed: tuple[ServerMissed, ...] = (DOWN,)) -> AddedUser:
    password = tmp_path / "state" / "secrets" / "redis-password.producer-billing"
    return AddedUser("producer-billing", password, False, (PRIMARY, REPLICA), missed)


def test_add_names_the_servers_written_and_each_replica_missed(
    env: dict[str, str], tmp_path: Path
) -> None:
    StubApi.added = added(tmp_path)
    code, output = invoke(env, "add", "billing")
    assert code == 0, output
    lines = output.splitlines()
    assert lines[0].startswith("created ")
    assert lines[1].startswith("Redis user producer-billing: its password is ")
    assert lines[2] == (
        "written on 10.0.0.1:6379 (primary), 10.0.0.2:6379 (replica, until it restarts: "
        "no ACL file)"
    )
    assert lines[3] == (
        "not written on 10.0.0.3:6379: the sentinels see it down (s_down,disconnected); "
        "add it there when it is back: runwarden producers add billing again"
    )
    assert len(lines) == 4


def test_add_json_has_the_same_as_fields(env: dict[str, str], tmp_path: Path) -> None:
    StubApi.added = added(tmp_path)
    code, output = invoke(env, "add", "billing", "--json")
    assert code == 0, output
    record = json.loads(output)
    assert record["redis_user"] == "producer-billing"
    assert record["redis_user_saved"] is False
    assert record["redis_servers"] == [
        {"address": "10.0.0.1:6379", "role": "primary", "saved": True},
        {"address": "10.0.0.2:6379", "role": "replica", "saved": False},
    ]
    assert record["redis_missed"] == [
        {"address": "10.0.0.3:6379", "reason": DOWN.reason,
         "again": "runwarden producers add billing"},
    ]  # fmt: skip


def test_add_without_the_primary_makes_no_user_and_keeps_the_key(env: dict[str, str]) -> None:
    StubApi.error = StoreError("run store: cannot reach Redis (set_producer_user): refused")
    code, output = invoke(env, "add", "billing", "--json")
    assert code == 0, output
    assert json.loads(output)["redis_user"] is None


def test_rm_names_where_the_user_was_removed_and_where_it_may_still_be(
    env: dict[str, str], tmp_path: Path
) -> None:
    StubApi.added = added(tmp_path, missed=())
    assert invoke(env, "add", "billing")[0] == 0  # the key, made
    StubApi.removed = RemovedUser("producer-billing", True, (PRIMARY,), (DOWN,))
    code, output = invoke(env, "rm", "billing")
    assert code == 0, output
    assert output.splitlines() == [
        "removed producer billing",
        "removed its Redis user producer-billing from 10.0.0.1:6379 (primary)",
        "its Redis user producer-billing may still be on 10.0.0.3:6379: the sentinels see it "
        "down (s_down,disconnected); remove it there when it is back: runwarden producers rm "
        "billing again",
    ]
    # Again once the replica is back: the key is gone, the user still removed there.
    StubApi.removed = RemovedUser("producer-billing", True, (PRIMARY, REPLICA), ())
    code, output = invoke(env, "rm", "billing", "--json")
    assert code == 0, output
    record = json.loads(output)
    assert record["key_removed"] is False
    assert record["redis_user_existed"] is True
    assert [s["address"] for s in record["redis_servers"]] == ["10.0.0.1:6379", "10.0.0.2:6379"]
    assert record["redis_missed"] == []
    # Nothing anywhere: no such producer.
    StubApi.removed = RemovedUser("producer-billing", False, (PRIMARY, REPLICA), ())
    code, output = invoke(env, "rm", "billing")
    assert code == 2
    assert "no producer 'billing'" in output
