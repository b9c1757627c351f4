"""`ScriptExecutor`: every `Executor` operation as one of the shared POSIX scripts,
run through a [`Transport`](transport.Transport). The SSH executor is this with a
remote transport; the local executor is this with fast native paths for file
access."""

from __future__ import annotations

import os
import posixpath
import re
import secrets as _secrets
import tarfile
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Final

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
from schemas.policy import DiskSample
from schemas.protocol import RUN_ID_ENV

from . import scripts
from .digest import FileDigest, copy_hashed, parse_manifest
from .errors import (
    CommandError,
    InvalidArgument,
    InvalidSecret,
    IoError,
    ProtocolError,
    UnsafeArchive,
)
from .lines import LineStream
from .probe import disk_probe_script, parse_disk_probe
from .scripts import FollowEntry, FollowUpdate
from .transport import Completed, Transport, error_line

__all__ = [
    "ScriptExecutor",
    "check_entries",
    "check_remote",
    "checked_secrets",
    "launcher_for",
    "upload_names",
]


_MARK: Final = re.compile(r"[a-z0-9][a-z0-9_.-]{0,63}")
"""A `RUNWARDEN_RUN_ID` that can be a job's mark (`JobId.mark`): a run id."""


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


def launcher_for(job: JobCommand, secret_names: Sequence[str]) -> str:
    """The [`scripts.launcher_script`] of `job`, reading `secret_names` from its
    stdin, with the on-target watchdog when `job.deadline_request_after_s` is set.

    Raises:
        InvalidArgument: for a run directory that is not absolute, or watchdog times
            out of range (a `JobCommand` built without validation).
    """
    watchdog = None
    if job.deadline_request_after_s is not None:
        watchdog = (job.deadline_request_after_s, job.watchdog_poll_s)
    return scripts.launcher_script(
        check_remote(job.dir), job.script, job.env, secret_names, watchdog
    )


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


_TAR_BUFSIZE = 64 * 1024
"""tarfile's read size on a download stream, in bytes (its default is 10 KiB; beyond
a few hundred KiB its buffer joins and slices leave the CPU cache and cost more than
the hashing)."""


def _member_path(name: str) -> str:
    """The path an archive member names, relative to the destination (`./a/b` ->
    `a/b`), or [`UnsafeArchive`] when it is absolute or holds `.`/`..` components."""
    relative = name[2:] if name.startswith("./") else name
    try:
        return safe_relpath(relative)
    except InvalidPath as error:
        raise UnsafeArchive(f"archive member {name[:200]!r}: {error}") from error


def _extract_hashed(
    tar: tarfile.TarFile, member: tarfile.TarInfo, local: Path, written: dict[str, str]
) -> None:
    """Extracts `member` of the stream `tar` into `local` with tarfile's "data" filter
    (no name outside `local`, no link leaving it, owner-writable modes, no owners).
    Regular files are written here, hashed as written, their digests recorded in
    `written` by relative path (a hard link takes its target's digest; any other
    member drops the path's digest); device files and FIFOs are skipped (a manifest
    lists regular files only).

    Raises:
        UnsafeArchive: for a member that would land outside `local`.
        OSError: when writing fails; tarfile's errors for a broken stream.
    """
    path = _member_path(member.name)
    if member.ischr() or member.isblk() or member.isfifo():
        written.pop(path, None)
        return
    try:
        safe = tarfile.data_filter(member, str(local))
    except tarfile.FilterError as error:
        raise UnsafeArchive(f"archive member {member.name[:200]!r}: {error}") from error
    if not safe.isreg():
        tar.extract(safe, local, filter="data")
        written.pop(path, None)
        if safe.islnk() and (linked := written.get(_member_path(safe.linkname))):
            written[path] = linked
        return
    source = tar.extractfile(safe)
    assert source is not None  # a regular member always has data
    target = local / path
    target.parent.mkdir(parents=True, exist_ok=True)
    written[path] = copy_hashed(source, target)
    if safe.mode is not None:
        os.chmod(target, safe.mode)
    os.utime(target, (safe.mtime, safe.mtime))


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
        words = text.split()
        mark = job.env.get(RUN_ID_ENV)
        try:
            if not 1 <= len(words) <= 2:
                raise ValueError("one pid and an optional start time")
            return JobId(
                dir=job.dir,
                pid=int(words[0]),
                container=job.container,
                start=int(words[1]) if len(words) == 2 else None,
                mark=mark if mark is not None and _MARK.fullmatch(mark) else None,
            )
        except (ValueError, ValidationError) as error:
            raise ProtocolError(f"spawn answered pid {text[:40]!r}") from error

    def spawn(self, job: JobCommand) -> JobId:
        secrets = checked_secrets(job)
        script = launcher_for(job, [name for name, _ in secrets])
        stdin = "".join(f"{value}\n" for _, value in secrets).encode()
        return self._launch(job, self._transport.run(script, action="spawn", stdin=stdin))

    def read_from(self, path: str, offset: int, limit: int) -> bytes:
        if limit == 0:
            return b""
        script = scripts.read_range_script(check_remote(path), offset, limit)
        result = self._transport.run(script, action="read")
        if result.exit_code == 3:
            raise ProtocolError(error_line(result.stderr, 3))
        return _checked(result, "read").stdout

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
    ) -> list[FileDigest]:
        check_entries(entries, exclude)
        script = scripts.archive_script(check_remote(remote), entries, exclude)
        if not entries:
            return []

        broken: list[tarfile.TarError] = []
        written: dict[str, str] = {}

        def sink(stream: IO[bytes]) -> None:
            # A transport that retries after a broken connection calls the sink again,
            # on a new stream from the start: only the last stream's files count.
            broken.clear()
            written.clear()
            try:
                with tarfile.open(fileobj=stream, mode="r|", bufsize=_TAR_BUFSIZE) as tar:
                    for member in tar:
                        local.mkdir(parents=True, exist_ok=True)
                        # Never outside `local`, whatever the target sends.
                        _extract_hashed(tar, member, local, written)
            except tarfile.TarError as error:
                broken.append(error)  # reported after the script's own failure, if any
            except OSError as error:
                # Translated here: an OSError leaving the sink would pass for a broken
                # connection (and be retried) in the SSH transport.
                raise IoError(error.filename or local, error) from error

        try:
            result = self._transport.receive(script, action="download", sink=sink)
        except OSError as error:
            raise IoError(local, error) from error
        _checked(result, "download")
        if broken:
            raise ProtocolError(f"download archive: {broken[0]}") from broken[0]
        return sorted(FileDigest(path, sha256) for path, sha256 in written.items())

    def manifest(
        self, remote: str, entries: Sequence[str], exclude: Sequence[str] = ()
    ) -> list[FileDigest]:
        check_entries(entries, exclude)
        script = scripts.manifest_script(check_remote(remote), entries, exclude)
        # No deadline, as a download has none: hashing a checkpoint of hundreds of GB
        # takes minutes, and a retry after a timeout would only start over.
        result = self._transport.run(script, action="manifest", timeout_s=None)
        _checked(result, "manifest")
        return parse_manifest(result.stdout)

    def follow(
        self, entries: Sequence[FollowEntry], timeout_s: float = scripts.FOLLOW_TIMEOUT_S
    ) -> list[FollowUpdate]:
        if not entries:
            return []
        # A random token frames the answer: no content of a job's file can forge it.
        token = _secrets.token_hex(16)
        script = scripts.follow_script(entries, token)
        result = self._transport.run(script, action="follow", timeout_s=timeout_s)
        _checked(result, "follow")
        return scripts.parse_follow(result.stdout, token, len(entries))

    def disk_usage(self, run_dirs: Sequence[str]) -> list[DiskSample | ProtocolError]:
        if not run_dirs:
            return []
        token = _secrets.token_hex(16)
        output = self.probe(disk_probe_script(run_dirs, token))
        return parse_disk_probe(output, token, len(run_dirs))

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
