"""`LocalExecutor`: runs jobs on this machine.

Cancel, claim, spawn and probe run the shared scripts (so a run directory behaves
the same whoever started it); the follow tick, status and file access (`read_from`,
`put_file`, `upload`, `download`, `manifest`) are done natively, with the same
semantics, because it is many times faster than a shell per call.
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

from schemas import JobCommand, JobId, JobStatus
from schemas.protocol import FILTERED_ENV_PREFIXES

from .digest import Charge, FileDigest
from .doctor import DoctorOptions
from .errors import InvalidArgument, IoError, ProtocolError
from .localtree import Node, local_manifest, open_regular, open_root, walk_entries
from .rundir import follow_here, status_here
from .safetree import Downloaded, SafeTree
from .scripts.follow import FOLLOW_CHUNK_BYTES, FOLLOW_TIMEOUT_S, FollowEntry, FollowUpdate
from .shell import (
    ScriptExecutor,
    check_entries,
    check_remote,
    checked_secrets,
    launcher_for,
)
from .transport import LocalTransport
from .uploadtree import open_checked, put_local, upload_nodes

__all__ = ["FILTERED_ENV_PREFIXES", "LocalExecutor", "job_environment"]


def job_environment(base: Mapping[str, str]) -> dict[str, str]:
    """`base` without the variables a job must not inherit (see
    [`FILTERED_ENV_PREFIXES`])."""
    return {k: v for k, v in base.items() if not k.startswith(FILTERED_ENV_PREFIXES)}


def _copy(node: Node, tree: SafeTree) -> None:
    """Writes the directory, regular file or link `node` into `tree` as a download
    through tar does (a file read once, through a descriptor, and hashed as
    written; a link by the tree's rule). A file gone or swapped for something else
    since it was listed is left out, as the target's tar would miss it."""
    if node.is_dir:
        tree.directory(node.path)
    elif node.is_link:
        try:
            target = os.readlink(node.name, dir_fd=node.dir_fd)
        except OSError as error:
            if error.errno in (errno.ENOENT, errno.EINVAL):
                return  # gone, or no longer a link, since it was listed
            raise
        tree.link(node.path, target)
    else:
        fd = open_regular(node)
        if fd is None:
            return
        with open(fd, "rb") as source:
            info = os.fstat(fd)  # of the file read, should it have changed since listed
            tree.file(node.path, source, info.st_mode, info.st_mtime_ns)


class LocalExecutor(ScriptExecutor):
    """Runs jobs in run directories under the local directory `workdir` (created when
    missing)."""

    ON_THIS_MACHINE = True

    def __init__(self, workdir: Path | str) -> None:
        root = Path(workdir).expanduser().absolute()
        try:
            root.mkdir(parents=True, exist_ok=True)
        except OSError as error:
            raise IoError(root, error) from error
        self._local = LocalTransport()
        super().__init__(self._local, str(root))

    def _doctor_options(self) -> DoctorOptions:
        # Uploads, downloads, manifests, reads and small writes are native here.
        return DoctorOptions(native_files=True)

    def spawn(self, job: JobCommand) -> JobId:
        secrets = checked_secrets(job)
        script = launcher_for(job, [name for name, _ in secrets])
        stdin = "".join(f"{value}\n" for _, value in secrets).encode()
        result = self._local.run(
            script.text,
            action="spawn",
            stdin=stdin,
            env=job_environment(os.environ),
            args=script.args,
        )
        return self._launch(job, result)

    def follow(
        self,
        entries: Sequence[FollowEntry],
        timeout_s: float = FOLLOW_TIMEOUT_S,
        log_chunk: int = FOLLOW_CHUNK_BYTES,
    ) -> list[FollowUpdate]:
        """As [`ScriptExecutor.follow`], read by the worker itself ([`rundir`]: the
        script's records and limits, through descriptors, as the script run by this
        process reads), some 50 times faster than the script (`bench/follow_tick.py`).
        `timeout_s` is unused: every read is bounded in bytes and none blocks."""
        return follow_here(entries, None, log_chunk=log_chunk)

    def _script_statuses(self, jobs: Sequence[JobId]) -> list[JobStatus | ProtocolError]:
        # The jobs not found running by the kernel, read here as the follow is.
        return [status_here(job, None) for job in jobs]

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

    def put_files(self, files: Sequence[tuple[str, str]]) -> list[str | None]:
        checked = [(check_remote(path), content) for path, content in files]
        answers: list[str | None] = []
        for path, content in checked:
            try:
                self.put_file(path, content)
            except IoError as error:
                answers.append(str(error))
            else:
                answers.append(None)
        return answers

    def upload(self, local: Path, remote: str, skip: Sequence[str] = ()) -> None:
        dest = Path(check_remote(remote))
        root = open_checked(local, "upload")
        try:
            dest.mkdir(parents=True, exist_ok=True)
            for node in upload_nodes(root, skip):
                put_local(node, dest / node.path)
        except OSError as error:
            raise IoError(error.filename or dest, error) from error
        finally:
            os.close(root)

    def download(
        self,
        remote: str,
        local: Path,
        entries: Sequence[str],
        exclude: Sequence[str] = (),
        charge: Charge | None = None,
    ) -> Downloaded:
        check_entries(entries, exclude)
        root = open_root(Path(check_remote(remote)), "download")
        try:
            with SafeTree(local, charge) as tree:
                for node in walk_entries(root, entries, exclude):
                    _copy(node, tree)
                return tree.result()
        except OSError as error:
            raise IoError(error.filename or local, error) from error
        finally:
            os.close(root)

    def manifest(
        self, remote: str, entries: Sequence[str], exclude: Sequence[str] = ()
    ) -> list[FileDigest]:
        return local_manifest(Path(check_remote(remote)), entries, exclude)
