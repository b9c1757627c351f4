"""`store.targets`: targets' configs, round trip and refusals."""

from __future__ import annotations

from typing import Any

import pytest

from schemas.errors import UnknownTarget
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
