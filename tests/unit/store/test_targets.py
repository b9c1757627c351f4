"""`store.targets`: targets' configs, round trip and refusals; records with their
version and signature, and tombstones, which read as no target."""

from __future__ import annotations

from typing import Any

import pytest

from schemas.errors import UnknownTarget
from schemas.target_sig import SignedTarget
from store import RunStore


def test_targets_round_trip(store: RunStore) -> None:
    store.targets.put("gpu1", {"kind": "ssh", "workdir": "/srv/runs", "host": "gpu1", "port": 22})
    store.targets.put("here", {"kind": "local", "workdir": "/tmp/runs"})
    assert store.targets.get("gpu1") == {
        "kind": "ssh",
        "workdir": "/srv/runs",
        "host": "gpu1",
        "port": 22,
    }
    assert list(store.targets.all()) == ["gpu1", "here"]
    store.targets.put("here", {"kind": "local", "workdir": "/other"})
    assert store.targets.get("here")["workdir"] == "/other"
    assert store.targets.remove("here")
    assert not store.targets.remove("here")
    with pytest.raises(UnknownTarget, match="here"):
        store.targets.get("here")


def test_a_record_keeps_its_version_and_a_tombstone_reads_as_no_target(store: RunStore) -> None:
    config = {"kind": "local", "workdir": "/w"}
    store.targets.put("here", config, "ab" * 64, 7)
    assert store.targets.get_signed("here") == SignedTarget(config, 7, "ab" * 64)
    store.targets.put_removed("here", 8, "cd" * 64)
    assert store.targets.get_signed("here") == SignedTarget(None, 8, "cd" * 64)
    with pytest.raises(UnknownTarget, match="here"):
        store.targets.get("here")
    assert store.targets.all() == {}
    assert list(store.targets.all_signed()) == ["here"]
    # Older forms and odd values read as unsigned, never as a tombstone.
    store._r.hset(store.keys.targets, "old", '{"config": {"kind": "local"}, "signature": "ab"}')
    store._r.hset(store.keys.targets, "bare", '{"kind": "local", "workdir": "/x"}')
    store._r.hset(store.keys.targets, "odd", '{"removed": true, "version": true, "x": 1}')
    assert store.targets.get_signed("old") == SignedTarget({"kind": "local"}, None, "ab")
    assert store.targets.get_signed("bare") == SignedTarget({"kind": "local", "workdir": "/x"})
    assert store.targets.get_signed("odd").config is not None


@pytest.mark.parametrize(
    "config",
    [
        {"kind": "ssh", "workdir": "/w", "password": "hunter2"},
        {"kind": "ssh", "workdir": "/w", "auth": {"Passphrase": "x"}},
        {"kind": "docker", "workdir": "/w"},
        {"workdir": "/w"},
        {"kind": "local", "workdir": "/w", "x": float("nan")},
        {"kind": "local", "workdir": "/w", "x": {1, 2}},
    ],
)
def test_target_config_refused(store: RunStore, config: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match=r"secret|kind|JSON"):
        store.targets.put("t", config)
    assert store.targets.all() == {}


@pytest.mark.parametrize("name", ["", "a b", "x" * 65, "tab\there"])
def test_target_name_refused(store: RunStore, name: str) -> None:
    with pytest.raises(ValueError, match="target name"):
        store.targets.put(name, {"kind": "local", "workdir": "/w"})
