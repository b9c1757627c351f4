"""`schemas.target_sig`: a target record verifies by the operator's public key alone,
and nothing of it can change (name, version, config, tombstone) without the private
key; `ensure_key_pair` makes the pair once and refuses a public key of another pair;
versions only grow."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import SecretStr

from schemas.auth import Unauthenticated
from schemas.secrets import SecretsDir, SecretsError
from schemas.target_sig import (
    TARGET_KEY,
    TARGET_PUBLIC_KEY,
    SignedTarget,
    ensure_key_pair,
    new_key_pair,
    next_version,
    public_key_of,
    sign_record,
    verify_record,
)

CONFIG = {"name": "gpu1", "kind": "ssh", "workdir": "/srv/runs", "allow_secrets": ["HF_TOKEN"]}


def _pair() -> tuple[SecretStr, str]:
    seed, public = new_key_pair()
    return SecretStr(seed), public


def test_a_record_verifies_by_the_public_key_and_nothing_of_it_can_change() -> None:
    key, public = _pair()
    assert public_key_of(key) == public
    signature = sign_record("gpu1", CONFIG, 7, key)
    assert verify_record("gpu1", SignedTarget(CONFIG, 7, signature), public) == 7
    changed = [
        ("gpu2", SignedTarget(CONFIG, 7, signature)),  # another target's name
        ("gpu1", SignedTarget(CONFIG, 8, signature)),  # another version
        ("gpu1", SignedTarget({**CONFIG, "allow_secrets": []}, 7, signature)),
        ("gpu1", SignedTarget(None, 7, signature)),  # made a tombstone
        # Its last byte changed (one in 256 signatures ends in 00 already).
        (
            "gpu1",
            SignedTarget(CONFIG, 7, signature[:-2] + ("01" if signature.endswith("00") else "00")),
        ),
        ("gpu1", SignedTarget(CONFIG, 7, "zz")),  # not hex
    ]
    for name, record in changed:
        with pytest.raises(Unauthenticated, match="not signed by the operator: refused"):
            verify_record(name, record, public)
    _, other = _pair()
    with pytest.raises(Unauthenticated, match="refused"):
        verify_record("gpu1", SignedTarget(CONFIG, 7, signature), other)


def test_a_tombstone_is_signed_as_such() -> None:
    key, public = _pair()
    signature = sign_record("gpu1", None, 9, key)
    assert verify_record("gpu1", SignedTarget(None, 9, signature), public) == 9
    with pytest.raises(Unauthenticated):
        verify_record("gpu1", SignedTarget(CONFIG, 9, signature), public)


@pytest.mark.parametrize(
    "record",
    [SignedTarget(CONFIG), SignedTarget(CONFIG, None, "ab"), SignedTarget(CONFIG, 0, "ab")],
    ids=["unsigned", "no-version", "version-0"],
)
def test_a_record_without_signature_or_version_says_add_it_again(record: SignedTarget) -> None:
    _, public = _pair()
    with pytest.raises(Unauthenticated, match="add it again with `runwarden targets add`"):
        verify_record("gpu1", record, public)


def test_keys_that_are_not_ed25519_keys_are_clear_errors() -> None:
    with pytest.raises(Unauthenticated, match=TARGET_KEY):
        sign_record("gpu1", CONFIG, 1, SecretStr("not hex"))
    with pytest.raises(Unauthenticated, match=TARGET_PUBLIC_KEY):
        verify_record("gpu1", SignedTarget(CONFIG, 1, "ab"), "abcd")


def test_the_key_pair_is_made_once_and_a_stray_public_key_is_refused(tmp_path: Path) -> None:
    secrets = SecretsDir(tmp_path / "secrets")
    public = ensure_key_pair(secrets)
    assert ensure_key_pair(secrets) == public  # never replaced
    key = secrets.read(TARGET_KEY)
    assert key is not None
    assert public_key_of(key) == public
    assert (tmp_path / "secrets" / TARGET_KEY).stat().st_mode & 0o077 == 0
    (tmp_path / "secrets" / TARGET_PUBLIC_KEY).write_text(new_key_pair()[1] + "\n")
    with pytest.raises(SecretsError, match="is not the public key of"):
        ensure_key_pair(secrets)


def test_versions_only_grow() -> None:
    first = next_version(None)
    assert first > 1_700_000_000_000_000  # microseconds since the epoch
    assert next_version(first) > first
    far = first + 10**12  # a record stored by a clock far ahead
    assert next_version(far) == far + 1
