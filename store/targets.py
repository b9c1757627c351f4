"""Targets in the run store: where runs go, by name. A target config is stored as
given (its meaning belongs to the executors), with its version and the operator's
Ed25519 signature (`schemas.target_sig`), which a worker checks before it uses it; it
never holds a secret. Stored value: `{"config": {...}, "version": N, "signature":
"<hex>"}`, or for a removed target its signed tombstone `{"removed": true, "version":
N, "signature": "<hex>"}` (a record of an older form reads as unsigned).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any, Final

from schemas import UnknownTarget
from schemas.target_sig import SignedTarget

from .base import StorePart, text, translated

__all__ = ["Targets"]

_SECRET_KEY: Final = re.compile(r"password|passphrase|secret|token|private_key", re.IGNORECASE)
_TARGET_KINDS: Final = frozenset({"local", "ssh"})
_NAMES_OF_SECRETS: Final = frozenset({"allow_secrets"})
"""Keys that hold the names of secrets, never a value: not refused."""


def _check_target_name(name: str) -> str:
    if not isinstance(name, str) or not 1 <= len(name) <= 64:
        raise ValueError("a target name is 1 to 64 characters")
    if any(ord(c) < 0x21 or ord(c) == 0x7F for c in name):
        raise ValueError(f"a target name cannot hold spaces or control characters: {name!r}")
    return name


def _secret_keys(value: Any, path: str = "") -> list[str]:
    found: list[str] = []
    if isinstance(value, Mapping):
        for key, item in value.items():
            where = f"{path}.{key}" if path else str(key)
            if str(key) in _NAMES_OF_SECRETS and not path:
                continue
            if _SECRET_KEY.search(str(key)):
                found.append(where)
            found += _secret_keys(item, where)
    elif isinstance(value, list | tuple):
        for index, item in enumerate(value):
            found += _secret_keys(item, f"{path}[{index}]")
    return found


def _target_json(config: Mapping[str, Any]) -> str:
    if not isinstance(config, Mapping):
        raise ValueError("a target config is a JSON object")
    if config.get("kind") not in _TARGET_KINDS:
        raise ValueError(f"a target's kind is 'local' or 'ssh', not {config.get('kind')!r}")
    secret = _secret_keys(config)
    if secret:
        raise ValueError(
            f"a target config cannot hold secrets ({', '.join(secret)}): use a key file "
            "or an ssh agent, named by path"
        )
    try:
        return json.dumps(config, allow_nan=False, sort_keys=True, separators=(",", ":"))
    except (TypeError, ValueError) as error:
        raise ValueError(f"a target config must be plain JSON: {error}") from error


class Targets(StorePart):
    """Targets (`RunStore.targets`): `put`, `put_removed`, `get`, `all`, `remove`."""

    @translated
    def put(
        self,
        name: str,
        config: Mapping[str, Any],
        signature: str | None = None,
        version: int | None = None,
    ) -> None:
        """Adds or replaces target `name`, at `version` with the operator's `signature`
        of it.

        `config` is a JSON object: `kind` (`local` or `ssh`), `workdir`, and for ssh
        the destination fields (host, port, user, identity path, known_hosts path...).
        It is stored as given; its meaning belongs to the executors.

        Raises:
            ValueError: for a name that is empty, longer than 64 characters or holds
                spaces or control characters; a config that is not plain JSON, has no
                valid `kind`, or holds a key that looks like a secret (`password`,
                `passphrase`, `secret`, `token`, `private_key`, at any depth).
        """
        document = {
            "config": json.loads(_target_json(config)),
            "version": version,
            "signature": signature,
        }
        self._r.hset(self.keys.targets, _check_target_name(name), json.dumps(document))

    @translated
    def put_removed(self, name: str, version: int, signature: str) -> None:
        """Replaces target `name` with its tombstone at `version`, signed by the
        operator: read as no target, and an older record written back is refused by
        the workers that saw it (`workers.target_versions`)."""
        document = {"removed": True, "version": version, "signature": signature}
        self._r.hset(self.keys.targets, _check_target_name(name), json.dumps(document))

    @translated
    def get_signed(self, name: str) -> SignedTarget:
        """The record of target `name` as stored, a tombstone included (its config
        None). Raises `UnknownTarget` when there is none."""
        raw = self._r.hget(self.keys.targets, name)
        if raw is None:
            raise UnknownTarget(name)
        return _unwrap(json.loads(raw))

    @translated
    def get(self, name: str) -> dict[str, Any]:
        """The config of target `name`. Raises `UnknownTarget` when there is none (or
        only its tombstone)."""
        config = self.get_signed(name).config
        if config is None:
            raise UnknownTarget(name)
        return config

    @translated
    def all(self) -> dict[str, dict[str, Any]]:
        """Every target and its config, ordered by name (tombstones left out)."""
        return {
            name: record.config
            for name, record in self.all_signed().items()
            if record.config is not None
        }

    @translated
    def all_signed(self) -> dict[str, SignedTarget]:
        """Every target's record as stored, tombstones included, ordered by name."""
        raw = self._r.hgetall(self.keys.targets)
        items = {text(name): _unwrap(json.loads(value)) for name, value in raw.items()}
        return dict(sorted(items.items()))

    @translated
    def remove(self, name: str) -> bool:
        """Forgets target `name`'s record (its tombstone too); whether it existed. The
        service removes a target with `put_removed`; this is for the store's own
        tests and a cleanup. Runs recorded on it keep its name (and stay followed)."""
        return bool(self._r.hdel(self.keys.targets, name))


def _unwrap(document: Any) -> SignedTarget:
    if not isinstance(document, dict):
        return SignedTarget({})
    version = document.get("version")
    signature = document.get("signature")
    version = version if isinstance(version, int) and not isinstance(version, bool) else None
    signature = signature if isinstance(signature, str) else None
    if document.get("removed") is True and set(document) == {"removed", "version", "signature"}:
        return SignedTarget(None, version, signature)
    if "config" in document and set(document) <= {"config", "version", "signature"}:
        config = document["config"]
        return SignedTarget(dict(config) if isinstance(config, dict) else {}, version, signature)
    return SignedTarget(dict(document))  # the bare config of the oldest form: unsigned
