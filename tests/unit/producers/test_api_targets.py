"""`producers.api.Runwarden`'s targets: a record of the form before versions, signed
with the operator's HMAC key, is signed again with the target key at a version (what
`runwarden serve` does at its start, so an upgrade keeps its targets); a forged one
is left as it is; a removal writes a signed tombstone."""

from __future__ import annotations

import hashlib
import hmac
import json
from pathlib import Path

import fakeredis

from producers.api import Runwarden
from schemas import Settings, TargetConfig
from schemas.auth import OPERATOR, canonical
from schemas.secrets import producer_key_file
from schemas.target_sig import TARGET_KEY, TARGET_PUBLIC_KEY, ensure_key_pair, verify_record
from store import RunStore


def client(tmp_path: Path) -> tuple[Runwarden, str]:
    settings = Settings(state_dir=tmp_path)
    settings.secrets.ensure(producer_key_file(OPERATOR))
    public = ensure_key_pair(settings.secrets)
    api = Runwarden(settings)
    api._store = RunStore(fakeredis.FakeRedis(server=fakeredis.FakeServer()))
    return api, public


def _old_form(api: Runwarden, name: str, config: dict[str, object], key: str) -> None:
    text = f"runwarden-target/1\n{name}\n{canonical(config)}".encode()
    signature = hmac.new(key.encode(), text, hashlib.sha256).hexdigest()
    document = {"config": config, "signature": signature}
    api.store.client.hset(api.store.keys.targets, name, json.dumps(document))


def test_records_of_the_older_form_are_signed_again_and_forged_ones_left(tmp_path: Path) -> None:
    api, public = client(tmp_path)
    operator = api.settings.secrets.read(producer_key_file(OPERATOR))
    assert operator is not None
    config = {"name": "gpu1", "kind": "local", "workdir": "/w", "allow_secrets": ["HF_TOKEN"]}
    _old_form(api, "gpu1", config, operator.get_secret_value())
    _old_form(api, "evil", {**config, "name": "evil"}, "not the operator's key")
    assert api.resign_targets() == ["gpu1"]
    record = api.store.targets.get_signed("gpu1")
    assert record.config == config
    assert verify_record("gpu1", record, public) == record.version
    assert api.verified_targets() == {"evil": False, "gpu1": True}
    assert api.resign_targets() == []  # once


def test_a_removal_is_a_signed_tombstone_at_a_newer_version(tmp_path: Path) -> None:
    api, public = client(tmp_path)
    api.add_target(TargetConfig(name="t", kind="local", workdir="/w"))
    added = api.store.targets.get_signed("t")
    assert api.remove_target("t")
    removed = api.store.targets.get_signed("t")
    assert removed.config is None
    assert removed.version is not None
    assert added.version is not None
    assert removed.version > added.version
    assert verify_record("t", removed, public) == removed.version
    assert not api.remove_target("t")  # already removed
    assert api.list_targets() == []


def test_targets_are_checked_with_the_public_key_alone(tmp_path: Path) -> None:
    """A client holding the public key and not the private one (a worker's machine)
    still tells which records verify; with neither, it cannot tell."""
    api, _ = client(tmp_path)
    api.add_target(TargetConfig(name="t", kind="local", workdir="/w"))
    (api.settings.secrets.path / TARGET_KEY).unlink()
    assert api.verified_targets() == {"t": True}
    (api.settings.secrets.path / TARGET_PUBLIC_KEY).unlink()
    assert api.verified_targets() == {"t": None}
