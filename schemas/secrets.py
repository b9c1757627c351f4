"""The secrets directory: where every credential of the service lives, one file a
secret, readable by the service's own user only, never in an environment, a command
line, Redis or a log. It is laid out as systemd's `$CREDENTIALS_DIRECTORY` and docker
secrets are (`/run/secrets/<name>`), so either can provide it.

| file | holds |
| --- | --- |
| `<NAME>` (an environment variable name, e.g. `HF_TOKEN`) | a job's secret, read at spawn time |
| `producer.<name>.key` | the signing key of producer `<name>` (`schemas.auth`) |
| `redis-password` | the Redis password, added to the Redis URL at connection time |
| `redis-password.worker` | the password of the Redis user of the workers and beat |
| `redis-password.web` | the password of the Redis user of the web view |
| `flower-basic-auth` | `user:password` of Flower and the web view |

With `settings`, this module is the configuration edge of `schemas`: the only place it
reads anything but its arguments.
"""

from __future__ import annotations

import os
import re
import secrets as _secrets
import stat
from pathlib import Path
from typing import Final

from pydantic import SecretStr

from .errors import SchemaError

__all__ = [
    "FLOWER_AUTH",
    "MAX_SECRET_BYTES",
    "PRODUCER_NAME",
    "REDIS_PASSWORD",
    "SERVICE_REDIS_USERS",
    "SecretsDir",
    "SecretsError",
    "producer_key_file",
    "producer_passwords",
    "producer_redis_password_file",
    "service_redis_password_file",
]

MAX_SECRET_BYTES: Final = 64 * 1024
"""Largest secret file read, in bytes."""
REDIS_PASSWORD: Final = "redis-password"  # noqa: S105 - a file name, not a password
FLOWER_AUTH: Final = "flower-basic-auth"
PRODUCER_NAME: Final = re.compile(r"[a-z][a-z0-9-]{0,31}")
"""A producer's name: 1 to 32 lowercase letters, digits and `-`, starting with a
letter (it names a file and goes into `asked_by`)."""
_SECRET_NAME: Final = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}")


class SecretsError(SchemaError):
    """A secret cannot be read or written: not a regular file, too large, a name that
    is not a safe file name, a directory that cannot be created. Names the file, never
    its content."""


def producer_key_file(name: str) -> str:
    """The file name of producer `name`'s key (`producer.<name>.key`).

    Raises:
        SecretsError: for a name that is not a producer's name.
    """
    if PRODUCER_NAME.fullmatch(name) is None:
        raise SecretsError(
            f"invalid producer name {name[:40]!r}: use 1-32 lowercase letters, digits or "
            "'-', starting with a letter"
        )
    return f"producer.{name}.key"


def producer_redis_password_file(name: str) -> str:
    """The file name of the password of producer `name`'s Redis user
    (`redis-password.producer-<name>`), kept by the operator; the producer's own
    secrets directory holds it as its `redis-password`.

    Raises:
        SecretsError: for a name that is not a producer's name.
    """
    producer_key_file(name)  # the same names
    return f"{REDIS_PASSWORD}.producer-{name}"


SERVICE_REDIS_USERS: Final = ("worker", "web")
"""The Redis users of the service's own processes besides the operator's default user:
`worker`, which the workers and beat connect as (store/acl.py, `worker_rules`), and
`web`, which the web view connects as (`web_rules`)."""


def service_redis_password_file(user: str) -> str:
    """The file name of the password of the service's Redis user `user`
    (`redis-password.<user>`).

    Raises:
        SecretsError: for a user that is not one of [`SERVICE_REDIS_USERS`].
    """
    if user not in SERVICE_REDIS_USERS:
        raise SecretsError(
            f"unknown Redis user {user[:40]!r} (RUNWARDEN_REDIS_USER): one of "
            f"{', '.join(SERVICE_REDIS_USERS)}"
        )
    return f"{REDIS_PASSWORD}.{user}"


def producer_passwords(secrets: SecretsDir) -> dict[str, SecretStr]:
    """The password of each producer's Redis user kept in `secrets` (its
    `producer_redis_password_file`), for the producers that still have a key there;
    a file that cannot be read is left out."""
    prefix = f"{REDIS_PASSWORD}.producer-"
    found: dict[str, SecretStr] = {}
    for file_name in secrets.names():
        name = file_name.removeprefix(prefix)
        if name == file_name or PRODUCER_NAME.fullmatch(name) is None:
            continue
        try:
            if secrets.read(producer_key_file(name)) is None:
                continue
            password = secrets.read(file_name)
        except SecretsError:
            continue
        if password is not None and password.get_secret_value():
            found[name] = password
    return found


class SecretsDir:
    """The secrets directory `path` (it may not exist yet)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def _file(self, name: str) -> Path:
        if _SECRET_NAME.fullmatch(name) is None:
            raise SecretsError(f"invalid secret name {name[:40]!r}")
        return self.path / name

    def read(self, name: str) -> SecretStr | None:
        """The content of secret `name`, one trailing line end removed; None when there
        is no such file.

        Raises:
            SecretsError: when it is not a regular file (a link is not followed), is
                larger than `MAX_SECRET_BYTES`, or cannot be read.
        """
        path = self._file(name)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        except FileNotFoundError:
            return None
        except OSError as error:
            raise SecretsError(f"cannot read the secret {path}: {error.strerror}") from error
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):
                raise SecretsError(f"the secret {path} is not a regular file")
            if info.st_size > MAX_SECRET_BYTES:
                raise SecretsError(f"the secret {path} is larger than {MAX_SECRET_BYTES} bytes")
            data = os.read(fd, MAX_SECRET_BYTES + 1)
        except OSError as error:
            raise SecretsError(f"cannot read the secret {path}: {error.strerror}") from error
        finally:
            os.close(fd)
        text = data.decode("utf-8", "surrogateescape")
        if text.endswith("\n"):
            text = text[:-1]
        if text.endswith("\r"):
            text = text[:-1]
        return SecretStr(text)

    def names(self) -> list[str]:
        """The names of the files in the directory, sorted; none when it does not
        exist."""
        try:
            return sorted(e.name for e in os.scandir(self.path) if e.is_file(follow_symlinks=False))
        except FileNotFoundError:
            return []

    def ensure(self, name: str, make: str | None = None) -> tuple[SecretStr, bool]:
        """Secret `name`, created when missing (mode 0600, in a directory of mode
        0700 created when missing) with `make`, or 32 random bytes as hex; returns it
        and whether it was created. Never replaces an existing one.

        Raises:
            SecretsError: when it cannot be read or written.
        """
        found = self.read(name)
        if found is not None:
            return found, False
        value = make if make is not None else _secrets.token_hex(32)
        path = self._file(name)
        try:
            self.path.mkdir(mode=0o700, parents=True, exist_ok=True)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        except FileExistsError:
            return self.ensure(name, make)  # written meanwhile by another process
        except OSError as error:
            raise SecretsError(f"cannot write the secret {path}: {error.strerror}") from error
        try:
            os.write(fd, (value + "\n").encode("utf-8"))
            os.fsync(fd)
        finally:
            os.close(fd)
        return SecretStr(value), True

    def remove(self, name: str) -> bool:
        """Removes secret `name`; whether it existed."""
        try:
            self._file(name).unlink()
        except FileNotFoundError:
            return False
        return True
