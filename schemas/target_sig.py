"""Target records signed by the operator with Ed25519, versioned, and removed by a
signed tombstone: a worker holds only the public key, so neither a write to Redis nor
a worker can define a target, and a worker that remembers the highest version it saw
of each target (`workers.target_versions`) refuses an older record written back (a
rolled-back target) and an old record put in place of a tombstone (a revived one).

The operator's key pair lives in the secrets directory: [`TARGET_KEY`], the private
key (the 32-byte Ed25519 seed as hex), on the operator's machine only, and
[`TARGET_PUBLIC_KEY`], the public key (32 bytes as hex), which every worker reads.
The signature (64 bytes as hex) is over the UTF-8 bytes of

    "runwarden-target/2\\n" + <name> + "\\n" + <version, a decimal integer> + "\\n"
    + <canonical config, or "removed" for a tombstone>

with the canonical config as `schemas.auth.canonical` makes it. A version is a
positive integer that only grows per target ([`next_version`]: the time in
microseconds, past the version stored).
"""

from __future__ import annotations

import hashlib
import hmac
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

from pydantic import SecretStr

from .auth import Unauthenticated, canonical
from .secrets import SecretsDir, SecretsError

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

# `cryptography` is imported by the functions that sign or verify: the commands that
# only read the store (`runwarden show`) never pay for it.

__all__ = [
    "TARGET_KEY",
    "TARGET_PUBLIC_KEY",
    "SignedTarget",
    "ensure_key_pair",
    "legacy_signature_ok",
    "new_key_pair",
    "next_version",
    "public_key_of",
    "sign_record",
    "verify_record",
]

TARGET_KEY: Final = "operator.target.key"
"""The secrets file of the operator's Ed25519 private key (hex seed): only where
targets are added or removed."""
TARGET_PUBLIC_KEY: Final = "operator.target.pub"
"""The secrets file of the operator's Ed25519 public key (hex): every worker."""

_FORM: Final = "runwarden-target/2"
_REMOVED: Final = "removed"


@dataclass(frozen=True)
class SignedTarget:
    """A target record as stored: its `config` (None: a tombstone, the target removed),
    its `version` and the operator's `signature` (None for a record of an older
    form, or one written by anyone else)."""

    config: dict[str, Any] | None
    version: int | None = None
    signature: str | None = None


def new_key_pair() -> tuple[str, str]:
    """A fresh Ed25519 key pair: (private seed, public key), each as hex."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import (  # noqa: PLC0415
        Ed25519PrivateKey,
    )

    private = Ed25519PrivateKey.generate()
    return private.private_bytes_raw().hex(), _public_hex(private)


def _public_hex(private: Ed25519PrivateKey) -> str:
    from cryptography.hazmat.primitives.serialization import (  # noqa: PLC0415
        Encoding,
        PublicFormat,
    )

    return private.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw).hex()


def _private(key: SecretStr) -> Ed25519PrivateKey:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import (  # noqa: PLC0415
        Ed25519PrivateKey,
    )

    try:
        return Ed25519PrivateKey.from_private_bytes(bytes.fromhex(key.get_secret_value()))
    except ValueError as error:
        raise Unauthenticated(f"the operator's target key ({TARGET_KEY}) is not one") from error


def public_key_of(key: SecretStr) -> str:
    """The public key (hex) of the private key `key` (hex seed).

    Raises:
        Unauthenticated: `key` is not an Ed25519 seed.
    """
    return _public_hex(_private(key))


def ensure_key_pair(secrets: SecretsDir) -> str:
    """The operator's public key (hex), its key pair made in `secrets` when missing
    ([`TARGET_KEY`], then [`TARGET_PUBLIC_KEY`] from it); never replaces a key.

    Raises:
        SecretsError: a file cannot be read or written, or the two do not match (a
            public key left from another pair: the workers would refuse every target).
    """
    seed, _ = new_key_pair()
    key, _ = secrets.ensure(TARGET_KEY, seed)
    try:
        derived = public_key_of(key)
    except Unauthenticated as error:
        raise SecretsError(str(error)) from error
    found, _ = secrets.ensure(TARGET_PUBLIC_KEY, derived)
    if found.get_secret_value().strip() != derived:
        raise SecretsError(
            f"{TARGET_PUBLIC_KEY} in {secrets.path} is not the public key of {TARGET_KEY}: "
            "remove it, and `runwarden serve` writes the right one"
        )
    return derived


def next_version(stored: int | None) -> int:
    """The version of a new record of a target whose stored record has `stored`: the
    time in microseconds, or one past `stored` when that is not earlier (a clock set
    back never makes a version go down)."""
    now = time.time_ns() // 1000
    return now if stored is None or now > stored else stored + 1


def _text(name: str, version: int, config: Mapping[str, Any] | None) -> bytes:
    body = _REMOVED if config is None else canonical(dict(config))
    return f"{_FORM}\n{name}\n{version}\n{body}".encode()


def sign_record(name: str, config: Mapping[str, Any] | None, version: int, key: SecretStr) -> str:
    """The operator's signature (hex) of target `name` at `version` with `config`, or
    of its tombstone (`config` None).

    Raises:
        Unauthenticated: `key` is not an Ed25519 seed.
    """
    return _private(key).sign(_text(name, version, config)).hex()


def legacy_signature_ok(name: str, record: SignedTarget, operator_key: SecretStr) -> bool:
    """Whether `record` is a target record of the form before this one, signed by the
    operator's HMAC key (`producer.operator.key`) over `"runwarden-target/1\\n" + name
    + "\\n" + canonical config`, with no version: for `Runwarden.resign_targets`
    alone, which gives such a record a version and an Ed25519 signature. Never
    accepted as a signature by a worker."""
    if record.config is None or record.version is not None:
        return False
    if not isinstance(record.signature, str):
        return False
    text = f"runwarden-target/1\n{name}\n{canonical(record.config)}".encode()
    mac = hmac.new(operator_key.get_secret_value().encode(), text, hashlib.sha256).hexdigest()
    return hmac.compare_digest(mac, record.signature)


def verify_record(name: str, record: SignedTarget, public_key: str) -> int:
    """Checks that the operator (`public_key`, hex) signed `record` of target `name`;
    returns its version.

    Raises:
        Unauthenticated: unsigned, of an older form, signed otherwise or changed since,
            or a public key that is not one (saying which; never a key).
    """
    from cryptography.exceptions import InvalidSignature  # noqa: PLC0415
    from cryptography.hazmat.primitives.asymmetric.ed25519 import (  # noqa: PLC0415
        Ed25519PublicKey,
    )

    version, signature = record.version, record.signature
    if not isinstance(signature, str) or not isinstance(version, int) or version < 1:
        raise Unauthenticated(
            f"target {name!r} is not signed by the operator: add it again with "
            "`runwarden targets add`"
        )
    try:
        public = Ed25519PublicKey.from_public_bytes(bytes.fromhex(public_key))
    except ValueError as error:
        raise Unauthenticated(
            f"the operator's public key ({TARGET_PUBLIC_KEY}) is not an Ed25519 key"
        ) from error
    try:
        public.verify(bytes.fromhex(signature), _text(name, version, record.config))
    except (ValueError, InvalidSignature) as error:
        raise Unauthenticated(f"target {name!r} is not signed by the operator: refused") from error
    return version
