"""The service's target records as the operator keeps them: each one signed with the
operator's Ed25519 key at a new version (`schemas.target_sig`), so a worker refuses a
record that is unsigned, forged, changed in Redis or older than one it saw, and a
removal is a signed tombstone at a new version rather than a deletion.

Only a client holding the operator's target key (`operator.target.key`, in the
secrets directory where `runwarden serve` made it) adds or removes targets; any
client can list them and tell which ones a worker would accept. The store is the
caller's (`Runwarden.store`): nothing here opens a connection of its own.
"""

from __future__ import annotations

from pydantic import SecretStr

from schemas import BadRequest, InvalidPath, Settings, TargetConfig, UnknownTarget
from schemas.auth import Unauthenticated
from schemas.job import check_secret_name
from schemas.secrets import SecretsError
from schemas.target_sig import (
    TARGET_KEY,
    TARGET_PUBLIC_KEY,
    legacy_signature_ok,
    next_version,
    public_key_of,
    sign_record,
    verify_record,
)
from store import RunStore

__all__ = ["TargetRecords"]


class TargetRecords:
    """The target records of the store `store`, signed with the key in the secrets
    directory of `settings`."""

    def __init__(self, settings: Settings, store: RunStore) -> None:
        self.settings = settings
        self.store = store

    def _target_key(self) -> SecretStr:
        """The operator's Ed25519 private key of targets (`schemas.target_sig`).

        Raises:
            SecretsError: this client has none (or it cannot be read).
        """
        key = self.settings.secrets.read(TARGET_KEY)
        if key is None:
            raise SecretsError(
                f"no operator target key ({TARGET_KEY}) in {self.settings.secrets.path}: "
                "targets are added and removed where `runwarden serve` made it"
            )
        return key

    def _stored_version(self, name: str) -> int | None:
        try:
            return self.store.targets.get_signed(name).version
        except UnknownTarget:
            return None

    def resign(self, operator: SecretStr) -> list[str]:
        """Gives every target record of the form before versions (signed with the
        operator's HMAC key `operator`) a version and the operator's Ed25519
        signature, so an upgrade keeps its targets; returns their names. A record that
        does not verify under that key is left as it is (workers refuse it).

        Raises:
            SecretsError: this client has no operator target key.
            StoreError: the store cannot be read or written.
        """
        signed = []
        for name, record in self.store.targets.all_signed().items():
            if record.config is None or not legacy_signature_ok(name, record, operator):
                continue
            version = next_version(None)
            signature = sign_record(name, record.config, version, self._target_key())
            self.store.targets.put(name, record.config, signature, version)
            signed.append(name)
        return signed

    def add(self, config: TargetConfig) -> None:
        """Adds or replaces a target, signed with the operator's Ed25519 key at a new
        version: only a client with it defines targets (a worker refuses any other
        record, and any record older than one it saw).

        Raises:
            InvalidPath: an upload root holds, or is inside, this service's state or
                secrets directory (its launches would be refused anyway: an upload of
                it would copy every producer's key into a run directory).
            BadRequest: an allowed secret no launch could pass (a name the shells set
                themselves, `IFS`, or one of the service's own, `RUNWARDEN_*`:
                `schemas.job.check_secret_name`).
            SecretsError: this client has no operator target key.
        """
        for secret in config.allow_secrets:
            try:
                check_secret_name(secret)
            except ValueError as error:
                raise BadRequest(f"--allow-secret {secret}: {error}") from None
        for root in config.upload_roots:
            kept = self.settings.guarded_by(root)
            if kept is not None:
                raise InvalidPath(
                    f"upload root {root} holds or is inside {kept}, which is never "
                    "uploaded: give the directory of your projects alone"
                )
        data = config.model_dump(mode="json")
        key = self._target_key()
        version = next_version(self._stored_version(config.name))
        signature = sign_record(config.name, data, version, key)
        self.store.targets.put(config.name, data, signature, version)

    def configs(self) -> list[TargetConfig]:
        """Every stored target (tombstones left out), as stored: verified or not."""
        return [TargetConfig.model_validate(c) for c in self.store.targets.all().values()]

    def verified(self) -> dict[str, bool | None]:
        """Per stored target (tombstones left out), whether its record is signed by
        this service's operator, as a worker checks it (False: unsigned, forged or
        changed in Redis, and refused by every worker), by the public key a worker
        holds (`operator.target.pub`), else the one of this client's private key;
        None for all when this client has neither."""
        records = self.store.targets.all_signed()
        live = {name: record for name, record in records.items() if record.config is not None}
        try:
            held = self.settings.secrets.read(TARGET_PUBLIC_KEY)
            public = held.get_secret_value().strip() if held else public_key_of(self._target_key())
        except (SecretsError, Unauthenticated):
            return dict.fromkeys(live)
        verified: dict[str, bool | None] = {}
        for name, record in live.items():
            try:
                verify_record(name, record, public)
            except Unauthenticated:
                verified[name] = False
            else:
                verified[name] = True
        return verified

    def remove(self, name: str) -> bool:
        """Removes target `name` with the operator's signed tombstone at a new version,
        so an older record written back is refused by every worker that saw the
        tombstone; whether it existed (a tombstone already there: False).

        Raises:
            SecretsError: this client has no operator target key.
        """
        try:
            stored = self.store.targets.get_signed(name)
        except UnknownTarget:
            return False
        if stored.config is None:
            return False
        version = next_version(stored.version)
        self.store.targets.put_removed(
            name, version, sign_record(name, None, version, self._target_key())
        )
        return True
