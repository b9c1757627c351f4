"""`LocalExecutor`: runs jobs on this machine.

Status, cancel, claim, spawn and probe run the shared scripts (so a run directory
behaves the same whoever started it); file access (`read_from`, `put_file`,
`upload`, `download`, `manifest`) is done natively, with the same semantics, because
it is many times faster than a shell per call.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets as _secrets
import shutil
import stat
from collections.abc import Mapping, Sequence
from pathlib import Path

from schemas import JobCommand, JobId
from schemas.protocol import FILTERED_ENV_PREFIXES

from .digest import FileDigest, copy_hashed, glob_match, local_manifest
from .errors import CommandError, InvalidArgument, IoError, ProtocolError
from .shell import (
    ScriptExecutor,
    check_entries,
    check_remote,
    checked_secrets,
    launcher_for,
    upload_names,
)
from .transport import LocalTransport

__all__ = ["FILTERED_ENV_PREFIXES", "LocalExecutor", "job_environment"]



def job_environment(base: Mapping[str, str]) -> dict[str, str]:
    """`base` without the variables a job must not inherit (see
    [`FILTERED_ENV_PREFIXES`])."""
    return {k: v for k, v in base.items() if not k.startswith(FILTERED_ENV_PREFIXES)}


def _copy_entry(
    root: Path, entry: str, local: Path, exclude: Sequence[str], written: dict[str, str]
) -> None:
    """Copies `root/entry` to `local/entry` as `download` does (directories, regular
    files read once and hashed as written, links as links, excluded names pruned at
    any depth, device files and FIFOs left out), recording each regular file's
    digest in `written`. Raises OSError."""

    def excluded(name: str) -> bool:
        return any(glob_match(p, name) for p in exclude)

    def copy(source: Path, relative: str, info: os.stat_result) -> None:
        target = local / relative
        if stat.S_ISLNK(info.st_mode):
            if os.path.lexists(target):
                os.unlink(target)
            os.symlink(os.readlink(source), target)
        elif stat.S_ISREG(info.st_mode):
            with open(source, "rb") as handle:
                written[relative] = copy_hashed(handle, target)
            # As a download through tar: owner-writable, no group/other write.
            os.chmod(target, (stat.S_IMODE(info.st_mode) & 0o755) | 0o600)
            os.utime(target, ns=(info.st_atime_ns, info.st_mtime_ns))

    source = root / entry
    if excluded(source.name):
        return
    try:
        top = source.lstat()
    except FileNotFoundError:
        return
    (local / entry).parent.mkdir(parents=True, exist_ok=True)
    if not stat.S_ISDIR(top.st_mode):
        copy(source, entry, top)
        return

    def fail(error: OSError) -> None:
        raise error

    for dirpath, dirnames, filenames in os.walk(source, onerror=fail):
        base = Path(dirpath)
        relative = base.relative_to(root).as_posix()
        (local / relative).mkdir(exist_ok=True)
        names = [d for d in dirnames if not excluded(d)]
        # os.walk lists links to directories among directories: copied as links.
        dirnames[:] = [d for d in names if not (base / d).is_symlink()]
        for name in [*filenames, *(d for d in names if d not in dirnames)]:
            if not excluded(name):
                path = base / name
                copy(path, f"{relative}/{name}", path.lstat())


class LocalExecutor(ScriptExecutor):
    """Runs jobs in run directories under the local directory `workdir` (created when
    missing)."""

    def __init__(self, workdir: Path | str) -> None:
        root = Path(workdir).expanduser().absolute()
        try:
            root.mkdir(parents=True, exist_ok=True)
        except OSError as error:
            raise IoError(root, error) from error
        self._local = LocalTransport()
        super().__init__(self._local, str(root))

    def spawn(self, job: JobCommand) -> JobId:
        secrets = checked_secrets(job)
        script = launcher_for(job, [name for name, _ in secrets])
        stdin = "".join(f"{value}\n" for _, value in secrets).encode()
        result = self._local.run(
            script, action="spawn", stdin=stdin, env=job_environment(os.environ)
        )
        return self._launch(job, result)

    def read_from(self, path: str, offset: int, limit: int) -> bytes:
        if offset < 0 or limit < 0:
            raise InvalidArgument("offset and limit are non-negative")
        path = check_remote(path)
        # O_NOFOLLOW: a link the job put there is never followed; O_NONBLOCK: a FIFO
        # never blocks the open. The type is checked on the descriptor, so a file
        # swapped after the open changes nothing.
        flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
        try:
            fd = os.open(path, flags)
        except FileNotFoundError:
            return b""
        except OSError as error:
            if error.errno == errno.ELOOP:
                raise ProtocolError(f"{path} is not a regular file") from error
            raise IoError(path, error) from error
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise ProtocolError(f"{path} is not a regular file")
            return os.pread(fd, limit, offset) if limit else b""
        except OSError as error:
            raise IoError(path, error) from error
        finally:
            os.close(fd)

    def put_file(self, path: str, content: str) -> None:
        target = Path(check_remote(path))
        temp = target.with_name(f"{target.name}.rw-tmp.{os.getpid()}.{_secrets.token_hex(6)}")
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            # A directory in a protocol file's place is the job's: removed, never
            # followed (rename itself replaces a link or a FIFO, never follows it).
            with contextlib.suppress(FileNotFoundError):
                if stat.S_ISDIR(os.lstat(target).st_mode):
                    shutil.rmtree(target)
            temp.write_bytes(content.encode("utf-8", "surrogateescape"))
            os.replace(temp, target)
        except OSError as error:
            temp.unlink(missing_ok=True)
            raise IoError(target, error) from error

    def upload(self, local: Path, remote: str, skip: Sequence[str] = ()) -> None:
        dest = Path(check_remote(remote))
        try:
            dest.mkdir(parents=True, exist_ok=True)
            for name in upload_names(local, skip):
                source = local / name
                if source.is_dir() and not source.is_symlink():
                    shutil.copytree(source, dest / name, symlinks=True, dirs_exist_ok=True)
                else:
                    shutil.copy2(source, dest / name, follow_symlinks=False)
        except shutil.Error as error:
            raise CommandError("upload", str(error)[:500]) from error
        except OSError as error:
            raise IoError(error.filename or dest, error) from error

    def download(
        self, remote: str, local: Path, entries: Sequence[str], exclude: Sequence[str] = ()
    ) -> list[FileDigest]:
        check_entries(entries, exclude)
        root = Path(check_remote(remote))
        if not root.is_dir():
            raise CommandError("download", f"{remote} does not exist")
        written: dict[str, str] = {}
        try:
            for entry in entries:
                _copy_entry(root, entry, local, exclude, written)
        except OSError as error:
            raise IoError(error.filename or local, error) from error
        return sorted(FileDigest(path, sha256) for path, sha256 in written.items())

    def manifest(
        self, remote: str, entries: Sequence[str], exclude: Sequence[str] = ()
    ) -> list[FileDigest]:
        return local_manifest(Path(check_remote(remote)), entries, exclude)
