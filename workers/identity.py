"""Who a message comes from, on the worker: the producers' keys (files
`producer.<name>.key` of the secrets directory, `schemas.secrets`), the check of a
task's signature (`schemas.auth`), the signature of the workers' own messages
(countdowns, fan-outs, the policies' requests), signed as `worker`, and the check of a
target record's signature: the operator's Ed25519 signature, by its public key alone
(`schemas.target_sig`)."""

from __future__ import annotations

import os
import threading
import time
from typing import Any, Final

from pydantic import SecretStr

from schemas import Settings
from schemas.auth import WORKER, Unauthenticated, canonical, sign, verify
from schemas.secrets import SecretsError, producer_key_file
from schemas.target_sig import TARGET_PUBLIC_KEY, SignedTarget, verify_record

__all__ = ["RELOAD_S", "Identities"]

RELOAD_S: Final = 2.0
"""Longest time the keys read from the secrets directory are used while the directory
itself did not change (its mtime), in seconds. A key added, removed or replaced by a
new file (`producers rm`, `producers add`, a rename) changes the directory and is
seen by the next message; a key file rewritten in place, within this period. Every
message costs one `stat`; the directory is read at most once a period, and whenever
it changed, whatever producer messages name (a flood from unknown producers
included)."""
_PREFIX, _SUFFIX = "producer.", ".key"
_VERIFIED_MAX: Final = 4096
"""Target records whose signature this process checked, kept so a record is verified
once, not at every use (forgotten all at once past this many)."""


class Identities:
    """The producers' keys of one worker process, read from the secrets directory on
    first use, and again at a message that finds the directory changed or its keys
    older than [`RELOAD_S`]: a revoked or rotated key is refused within seconds,
    without a restart."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._keys: dict[str, SecretStr] = {}
        self._target_public: str | None = None
        self._verified: set[tuple[str, int, str, str]] = set()
        self._read_at = float("-inf")
        self._seen: int | None = None
        self._lock = threading.Lock()

    def _version(self) -> int | None:
        try:
            return os.stat(self.settings.secrets.path).st_mtime_ns
        except OSError:
            return None

    def _reload(self) -> None:
        self._seen = self._version()
        secrets = self.settings.secrets
        keys: dict[str, SecretStr] = {}
        for name in secrets.names():
            if name.startswith(_PREFIX) and name.endswith(_SUFFIX):
                producer = name[len(_PREFIX) : -len(_SUFFIX)]
                try:
                    key = secrets.read(producer_key_file(producer))
                except SecretsError:
                    continue  # not a producer's key file: never trusted
                if key is not None and key.get_secret_value():
                    keys[producer] = key
        try:
            public = secrets.read(TARGET_PUBLIC_KEY)
        except SecretsError:
            public = None
        self._keys = keys
        self._target_public = None if public is None else public.get_secret_value().strip()
        self._read_at = time.monotonic()

    def keys(self) -> dict[str, SecretStr]:
        """The producers' keys as the secrets directory holds them now: read again
        when it changed, or when they are older than [`RELOAD_S`]."""
        with self._lock:
            old = time.monotonic() - self._read_at >= RELOAD_S
            if not self._keys or old or self._version() != self._seen:
                self._reload()
            return dict(self._keys)

    def check(self, task: str, body: Any, auth: Any, task_id: str | None) -> str:
        """The producer that signed `body` for `task` in the message `task_id`.

        Raises:
            Unauthenticated: saying why (never a key or a signature).
        """
        return verify(
            task,
            body,
            auth,
            self.keys(),
            now=time.time(),
            max_age_s=self.settings.visibility_timeout_s + 3600.0,
            task_id=task_id,
        )

    def signed(self, task: str, kwargs: dict[str, Any], task_id: str) -> dict[str, Any]:
        """`kwargs` with the workers' own signature of its `body` for `task` in the
        message `task_id` (as is without a body: a tick carries nothing to sign).

        Raises:
            Unauthenticated: this worker has no `worker` key.
        """
        if "body" not in kwargs:
            return kwargs
        key = self.keys().get(WORKER)
        if key is None:
            raise Unauthenticated(
                f"no key for producer {WORKER!r} in {self.settings.secrets.path}: "
                "`runwarden serve` creates it"
            )
        auth = sign(task, kwargs["body"], WORKER, key, at=time.time(), task_id=task_id)
        return {**kwargs, "auth": auth}

    def check_target(self, name: str, record: SignedTarget) -> int:
        """Checks that the operator signed target `name`'s stored `record` (a tombstone
        included), by its public key (`schemas.target_sig.TARGET_PUBLIC_KEY` in the
        secrets directory, read again as the producers' keys are); returns its
        version.

        Raises:
            Unauthenticated: unsigned, signed otherwise, or no public key here.
        """
        self.keys()  # the public key is read with them
        public = self._target_public
        if not public:
            raise Unauthenticated(
                f"no operator public key ({TARGET_PUBLIC_KEY}) in "
                f"{self.settings.secrets.path}: targets cannot be checked"
            )
        body = "" if record.config is None else canonical(record.config)
        known = (name, record.version or 0, record.signature or "", body)
        if known not in self._verified:
            verify_record(name, record, public)
            if len(self._verified) >= _VERIFIED_MAX:
                self._verified.clear()
            self._verified.add(known)
        return known[1]
