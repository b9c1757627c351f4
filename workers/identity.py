"""Who a message comes from, on the worker: the producers' keys (files
`producer.<name>.key` of the secrets directory, `schemas.secrets`), the check of a
task's signature (`schemas.auth`), and the signature of the workers' own messages
(countdowns, fan-outs, the policies' requests), signed as `worker`."""

from __future__ import annotations

import os
import threading
import time
from typing import Any, Final

from pydantic import SecretStr

from schemas import Settings
from schemas.auth import WORKER, Unauthenticated, sign, verify, verify_target
from schemas.secrets import SecretsError, producer_key_file

__all__ = ["RELOAD_S", "Identities"]

RELOAD_S: Final = 5.0
"""Least time between two reads of the secrets directory for an unknown producer while
the directory itself did not change (its mtime): a key added or removed is seen at
the next message that names it; a flood of messages from unknown producers costs one
`stat` each and one read of the directory per period."""
_PREFIX, _SUFFIX = "producer.", ".key"


class Identities:
    """The producers' keys of one worker process, read from the secrets directory on
    first use and again (at most every `RELOAD_S`) when a message names a producer
    not known yet; a removed key is forgotten at that read."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._keys: dict[str, SecretStr] = {}
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
        self._keys = keys
        self._read_at = time.monotonic()

    def keys(self, wanted: str | None = None) -> dict[str, SecretStr]:
        """The known keys, read again when `wanted` is not among them (rate-limited)."""
        with self._lock:
            if not self._keys or (wanted is not None and wanted not in self._keys):
                old = time.monotonic() - self._read_at >= RELOAD_S
                if old or self._version() != self._seen:
                    self._reload()
            return dict(self._keys)

    def check(self, task: str, body: Any, auth: Any) -> str:
        """The producer that signed `body` for `task`.

        Raises:
            Unauthenticated: saying why (never a key or a signature).
        """
        wanted = auth.get("producer") if isinstance(auth, dict) else None
        return verify(
            task,
            body,
            auth,
            self.keys(wanted if isinstance(wanted, str) else None),
            now=time.time(),
            max_age_s=self.settings.visibility_timeout_s + 3600.0,
        )

    def signed(self, task: str, kwargs: dict[str, Any]) -> dict[str, Any]:
        """`kwargs` with the workers' own signature of its `body` for `task` (as is
        without a body: a tick carries nothing to sign).

        Raises:
            Unauthenticated: this worker has no `worker` key.
        """
        if "body" not in kwargs:
            return kwargs
        key = self.keys(WORKER).get(WORKER)
        if key is None:
            raise Unauthenticated(
                f"no key for producer {WORKER!r} in {self.settings.secrets.path}: "
                "`runwarden serve` creates it"
            )
        return {**kwargs, "auth": sign(task, kwargs["body"], WORKER, key, time.time())}

    def check_target(self, name: str, config: dict[str, Any], signature: str | None) -> None:
        """Checks the operator's signature of target `name`.

        Raises:
            Unauthenticated: unsigned, signed otherwise, or no operator key here.
        """
        key = self.keys("operator").get("operator")
        if key is None:
            raise Unauthenticated(
                f"no operator key in {self.settings.secrets.path}: targets cannot be checked"
            )
        verify_target(name, config, signature, key)
