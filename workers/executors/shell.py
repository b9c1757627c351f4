"""`ScriptExecutor`: every `Executor` operation as one of the shared POSIX scripts,
run through a [`Transport`](transport.Transport). The SSH executor is this with a
remote transport; the local executor is this with fast native paths for file
access."""

from __future__ import annotations

import os
import posixpath
import tarfile
from collections.abc import Sequence
from pathlib import Path
from typing import IO

from pydantic import ValidationError

from schemas import (
    InvalidPath,
    JobCommand,
    JobId,
    JobStatus,
    check_absolute_path,
    check_env_name,
    check_secret_value,
    safe_relpath,
)

from . import scripts
from .digest import FileDigest, parse_manifest
from .errors import CommandError, InvalidArgument, InvalidSecret, IoError, ProtocolError
from .lines import LineStream
from .transport import Completed, Transport, error_line

__all__ = [
    "ScriptExecutor",
    "check_entries",
    "check_remote",
    "checked_secrets",
    "upload_names",
]


def check_remote(path: str) -> str:
    """`path` when it is an absolute path without NUL, else [`InvalidArgument`]."""
    try:
        return check_absolute_path(path)
    except ValueError as error:
        raise InvalidArgument(str(error)) from error


def check_entries(entries: Sequence[str], exclude: Sequence[str]) -> None:
    """Raises [`InvalidArgument`] for an entry that is not a safe relative path or an
    exclude pattern outside the executors' glob syntax."""
    for entry in entries:
        try:
            safe_relpath(entry)
        except InvalidPath as error:
            raise InvalidArgument(str(error)) from error
    for pattern in exclude:
        scripts.check_exclude(pattern)


def checked_secrets(job: JobCommand) -> list[tuple[str, str]]:
    """The job's secrets as (name, value) pairs, checked again here (a `JobCommand`
    built without validation must not slip through).

    Raises:
        InvalidSecret: naming the first variable that cannot be passed.
    """
    pairs: list[tuple[str, str]] = []
    for name, secret in job.secrets.items():
        value = secret.get_secret_value()
        try:
            check_env_name(name)
            check_secret_value(name, value)
        except ValueError as error:
            raise InvalidSecret(name) from error
        pairs.append((name, value))
    for name in job.env:
        try:
            check_env_name(name)
        except ValueError as error:
            raise InvalidArgument(str(error)) from error
    return pairs


def _checked(result: Completed, action: str) -> Completed:
    if result.exit_code != 0:
        raise CommandError(action, error_line(result.stderr, result.exit_code))
    return result


def upload_names(local: Path, skip: Sequence[str]) -> list[str]:
    """The top-level entries of `local` an upload copies: all but those in `skip`.

    Raises:
        IoError: when `local` cannot be listed.
    """
    try:
        names = sorted(os.listdir(local))
    except OSError as error:
        raise IoError(local, error) from error
    return [name for name in names if name not in set(skip)]


class ScriptExecutor:
    """An `Executor` whose every operation is a shared script run by `transport` on
    the target whose run directories live under `workdir`."""

    def __init__(self, transport: Transport, workdir: str) -> None:
        self._transport = transport
        self._workdir = check_remote(workdir).rstrip("/") or "/"

    @property
    def workdir(self) -> str:
        return self._workdir

    @property
    def transport(self) -> Transport:
        """The transport scripts run through."""
        return self._transport

    def claim(self, dir: str, owner: str) -> bool:
        script = scripts.claim_script(check_remote(dir), owner)
        result = _checked(self._transport.run(script, action="claim"), "claim")
        return scripts.parse_claim(result.stdout)

    def upload(self, local: Path, remote: str, skip: Sequence[str] = ()) -> None:
        names = upload_names(local, skip)

        def source(stream: IO[bytes]) -> None:
            # Writes of 64 KiB, not tarfile's 10 KiB: fewer, fuller packets over SSH.
            with tarfile.open(
                fileobj=stream, mode="w|", format=tarfile.PAX_FORMAT, bufsize=64 * 1024
            ) as tar:
                for name in names:
                    tar.add(local / name, arcname=name, recursive=True)

        script = scripts.unpack_script(check_remote(remote))
        _checked(self._transport.send(script, action="upload", source=source), "upload")

    def _launch(self, job: JobCommand, result: Completed) -> JobId:
        _checked(result, "spawn")
        text = result.stdout.decode("utf-8", "replace").strip()
        try:
            return JobId(dir=job.dir, pid=int(text), container=job.container)
        except (ValueError, ValidationError) as error:
            raise ProtocolError(f"spawn answered pid {text[:40]!r}") from error

    def spawn(self, job: JobCommand) -> JobId:
        secrets = checked_secrets(job)
        script = scripts.launcher_script(
            check_remote(job.dir), job.script, job.env, [name for name, _ in secrets]
        )
        stdin = "".join(f"{value}\n" for _, value in secrets).encode()
        return self._launch(job, self._transport.run(script, action="spawn", stdin=stdin))

    def read_from(self, path: str, offset: int, limit: int) -> bytes:
        if limit == 0:
            return b""
        script = scripts.read_range_script(check_remote(path), offset, limit)
        return _checked(self._transport.run(script, action="read"), "read").stdout

    def status(self, job: JobId) -> JobStatus:
        result = self.statuses([job])[0]
        if isinstance(result, ProtocolError):
            raise result
        return result

    def statuses(self, jobs: Sequence[JobId]) -> list[JobStatus | ProtocolError]:
        if not jobs:
            return []
        for job in jobs:
            self._transport.reap(job.pid)
        result = _checked(
            self._transport.run(scripts.status_script(jobs), action="status"), "status"
        )
        return scripts.parse_statuses(result.stdout, len(jobs))

    def cancel(self, job: JobId) -> None:
        result = self._transport.run_to_end(
            scripts.cancel_script(job), action="cancel", pgid=job.pid
        )
        _checked(result, "cancel")

    def download(
        self, remote: str, local: Path, entries: Sequence[str], exclude: Sequence[str] = ()
    ) -> None:
        check_entries(entries, exclude)
        script = scripts.archive_script(check_remote(remote), entries, exclude)
        if not entries:
            return

        broken: list[tarfile.TarError] = []

        def sink(stream: IO[bytes]) -> None:
            try:
                with tarfile.open(fileobj=stream, mode="r|") as tar:
                    for member in tar:
                        local.mkdir(parents=True, exist_ok=True)
                        # The data filter refuses absolute names, `..`, links leaving
                        # the destination and device files: a hostile target cannot
                        # write outside `local`.
                        tar.extract(member, local, filter="data")
            except tarfile.TarError as error:
                broken.append(error)  # reported after the script's own failure, if any

        try:
            result = self._transport.receive(script, action="download", sink=sink)
        except OSError as error:
            raise IoError(local, error) from error
        _checked(result, "download")
        if broken:
            raise ProtocolError(f"download archive: {broken[0]}") from broken[0]

    def manifest(
        self, remote: str, entries: Sequence[str], exclude: Sequence[str] = ()
    ) -> list[FileDigest]:
        check_entries(entries, exclude)
        script = scripts.manifest_script(check_remote(remote), entries, exclude)
        result = _checked(self._transport.run(script, action="manifest"), "manifest")
        return parse_manifest(result.stdout)

    def probe(self, script: str) -> bytes:
        return _checked(self._transport.run(script, action="probe"), "probe").stdout

    def put_file(self, path: str, content: str) -> None:
        path = check_remote(path)
        parent = posixpath.dirname(path) or "/"
        script = scripts.put_file_script(path, parent, content)
        _checked(self._transport.run(script, action="put_file"), "put_file")

    def tail(self, path: str, offset: int = 0) -> LineStream:
        return LineStream(self, check_remote(path), offset)

    def close(self) -> None:
        self._transport.close()

    def __enter__(self) -> ScriptExecutor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
