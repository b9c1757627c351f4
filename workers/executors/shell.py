"""`ScriptExecutor`: every `Executor` operation as one of the shared POSIX scripts,
run through a [`Transport`](transport.Transport). The SSH executor is this with a
remote transport; the local executor is this with fast native paths for file
access."""

from __future__ import annotations

import os
import posixpath
import secrets as _secrets
import tarfile
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import IO, Final

from pydantic import ValidationError

from schemas import (
    JobCommand,
    JobId,
    JobStatus,
    check_absolute_path,
    check_env_name,
    check_secret_name,
    check_secret_value,
)
from schemas.doctor import CLOCK_SKEW_WARN_S
from schemas.policy import DISK_USED_LIMIT, DiskSample
from schemas.protocol import MARK_ENV, MARK_FORM, RUN_ID_ENV

from . import scripts
from .digest import Charge, FileDigest, parse_manifest
from .doctor import DoctorFindings, DoctorOptions, run_doctor
from .errors import (
    CommandError,
    InvalidArgument,
    InvalidSecret,
    IoError,
    ProtocolError,
)
from .lines import LineStream
from .liveness import group_is_the_jobs
from .localtree import check_entries
from .marked import marked_job_script, parse_marked_job
from .notices import notice_watch_script
from .probe import disk_probe_script, parse_disk_probe
from .safetree import Downloaded, SafeTree
from .scripts import FollowEntry, FollowUpdate
from .scripts.common import check_job_pid
from .transport import DEFAULT_TIMEOUT_S, MAX_SCRIPT_BYTES, Completed, Transport, error_line
from .untar import extract_stream
from .uploadtree import add_to_tar, open_checked, upload_nodes

__all__ = [
    "CANCEL_DEADLINE_S",
    "CONTAINER_STOP_S",
    "ScriptExecutor",
    "cancel_deadline_s",
    "check_entries",
    "check_remote",
    "checked_secrets",
    "launcher_for",
]


CANCEL_DEADLINE_S: Final = float(scripts.CANCEL_TERM_WAIT_S + scripts.CANCEL_KILL_WAIT_S)
"""Longest a cancel's script runs, in seconds (20): its waits after SIGTERM and
after SIGKILL, counted in the script's own ticks, which a loaded machine stretches.
A cancel cut at its deadline fails (`CommandError`): the job has had its SIGTERM,
`cancelling` marks it, and the next cancel goes on from there."""
CONTAINER_STOP_S: Final = 30.0
"""What the cancel of a job in a container adds to [`CANCEL_DEADLINE_S`]: the
script's `<engine> stop -t 30`."""


def cancel_deadline_s(job: JobId) -> float:
    """The deadline of `job`'s cancel script, in seconds: [`CANCEL_DEADLINE_S`], plus
    [`CONTAINER_STOP_S`] for a job in a container."""
    return CANCEL_DEADLINE_S + (CONTAINER_STOP_S if job.container is not None else 0.0)


def check_remote(path: str) -> str:
    """`path` when it is an absolute path without NUL, else [`InvalidArgument`]."""
    try:
        return check_absolute_path(path)
    except ValueError as error:
        raise InvalidArgument(str(error)) from error


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
            check_secret_name(name)
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


def launcher_for(job: JobCommand, secret_names: Sequence[str]) -> scripts.Script:
    """The [`scripts.launcher_script`] of `job` (its text and arguments: the job's
    variables among them, never its secrets), reading `secret_names` from its
    stdin, with the on-target watchdog when `job.deadline_request_after_s` is set,
    and the preemption-notice watcher when `job.preemption` is.

    Raises:
        InvalidArgument: for a run directory that is not absolute, watchdog times
            out of range, or a watcher that cannot be made (an unknown cloud, a base
            URL that is not `http://host[:port]`, a poll out of range: a
            `JobCommand` built without validation).
    """
    dir = check_remote(job.dir)
    watchdog = None
    if job.deadline_request_after_s is not None:
        watchdog = (job.deadline_request_after_s, job.watchdog_poll_s)
    watcher = None
    if job.preemption is not None:
        watcher = notice_watch_script(dir, job.preemption, job.metadata_urls, job.notice_poll_s)
    return scripts.launcher_script(
        dir,
        job.script,
        job.env,
        secret_names,
        watchdog,
        notice_watcher=watcher,
        wait_for_all=job.wait_for_all,
        cgroup=job.cgroup,
    )


def _live_here(job: JobId) -> bool:
    """Whether `job`, on this machine, is running by the kernel's word: its leader's
    start time is known and its group alive and its own. An adopted job (no start
    time) is left to the status script, as overbrainer decides it."""
    return job.start is not None and group_is_the_jobs(check_job_pid(job), job.start)


def _checked(result: Completed, action: str) -> Completed:
    if result.exit_code != 0:
        raise CommandError(action, error_line(result.stderr, result.exit_code))
    return result


PUT_FILES_BATCH_BYTES: Final = MAX_SCRIPT_BYTES - 8 * 1024
"""The arguments one `put_files` script takes at most, in bytes: a target's request
files are written by as few scripts as fit (one for some 800 runs of 100-byte
paths), each below the transports' limit with room for the script's text."""


def _batches(files: Sequence[tuple[str, str]], limit: int) -> list[list[tuple[str, str]]]:
    """`files` cut, in order, into lists whose `put_files` arguments fit in `limit`
    bytes (one file each at least)."""
    batches: list[list[tuple[str, str]]] = []
    size = 0
    for index, (path, content) in enumerate(files):
        cost = len(str(index)) + len(path.encode()) + len(content.encode()) + 3
        if not batches or size + cost > limit:
            batches.append([])
            size = 40  # the token
        batches[-1].append((path, content))
        size += cost
    return batches


class ScriptExecutor:
    """An `Executor` whose every operation is a shared script run by `transport` on
    the target whose run directories live under `workdir`.

    A subclass whose target is this machine sets [`ON_THIS_MACHINE`]: its jobs'
    liveness is then read here, from the kernel, before any status script runs
    ([`statuses`])."""

    ON_THIS_MACHINE: bool = False
    """Whether the target's processes are this machine's (`/proc` here is the
    target's): a local target, or one whose jobs run as another user of it."""

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
        result = _checked(
            self._transport.run(script.text, action="claim", args=script.args), "claim"
        )
        return scripts.parse_claim(result.stdout)

    def upload(self, local: Path, remote: str, skip: Sequence[str] = ()) -> None:
        root = open_checked(local, "upload")

        def source(stream: IO[bytes]) -> None:
            # Writes of 64 KiB, not tarfile's 10 KiB: fewer, fuller packets over SSH.
            with tarfile.open(
                fileobj=stream, mode="w|", format=tarfile.PAX_FORMAT, bufsize=64 * 1024
            ) as tar:
                for node in upload_nodes(root, skip):
                    add_to_tar(tar, node)

        try:
            script = scripts.unpack_script(check_remote(remote))
            result = self._transport.send(
                script.text, action="upload", source=source, args=script.args
            )
        finally:
            os.close(root)
        _checked(result, "upload")

    def _launch(self, job: JobCommand, result: Completed) -> JobId:
        _checked(result, "spawn")
        text = result.stdout.decode("utf-8", "replace").strip()
        words = text.split()
        mark = job.env.get(MARK_ENV, job.env.get(RUN_ID_ENV))
        try:
            if not 1 <= len(words) <= 2:
                raise ValueError("one pid and an optional start time")
            return JobId(
                dir=job.dir,
                pid=int(words[0]),
                container=job.container,
                start=int(words[1]) if len(words) == 2 else None,
                mark=mark if mark is not None and MARK_FORM.fullmatch(mark) else None,
                cgroup=job.cgroup,
            )
        except (ValueError, ValidationError) as error:
            raise ProtocolError(f"spawn answered pid {text[:40]!r}") from error

    def spawn(self, job: JobCommand) -> JobId:
        secrets = checked_secrets(job)
        script = launcher_for(job, [name for name, _ in secrets])
        stdin = "".join(f"{value}\n" for _, value in secrets).encode()
        result = self._transport.run(script.text, action="spawn", stdin=stdin, args=script.args)
        return self._launch(job, result)

    def read_from(self, path: str, offset: int, limit: int) -> bytes:
        if limit == 0:
            return b""
        script = scripts.read_range_script(check_remote(path), offset, limit)
        result = self._transport.run(script.text, action="read", args=script.args)
        if result.exit_code == 3:
            raise ProtocolError(error_line(result.stderr, 3))
        return _checked(result, "read").stdout

    def status(self, job: JobId) -> JobStatus:
        result = self.statuses([job])[0]
        if isinstance(result, ProtocolError):
            raise result
        return result

    def statuses(self, jobs: Sequence[JobId]) -> list[JobStatus | ProtocolError]:
        """As [`Executor.statuses`]. On this machine ([`ON_THIS_MACHINE`]), a job whose
        leader's start time is known and whose group is alive and its own
        (`liveness.group_is_the_jobs`, read here) is running without a script: the
        status script runs for the others only, so nothing a job does to the scripts
        of its user (pause, kill, write into their output) can report a live job
        ended, or delay its status."""
        if not jobs:
            return []
        for job in jobs:
            self._transport.reap(job.pid)
        live = self._live(jobs)
        asked = [job for job, alive in zip(jobs, live, strict=True) if not alive]
        answers = iter(self._script_statuses(asked))
        return [JobStatus.RUNNING if alive else next(answers) for alive in live]

    def _live(self, jobs: Sequence[JobId]) -> list[bool]:
        """Per job of `jobs`, whether it is known to run without the status script, by
        a reading no process of the job's user can forge or hold up: on this machine,
        the kernel's ([`_live_here`]); elsewhere none (an SSH target whose jobs run as
        another user asks its control user, `SshExecutor`)."""
        return [self.ON_THIS_MACHINE and _live_here(job) for job in jobs]

    def _script_statuses(self, jobs: Sequence[JobId]) -> list[JobStatus | ProtocolError]:
        if not jobs:
            return []
        script = scripts.status_script(jobs)
        result = _checked(self._deciding(script, "status"), "status")
        return scripts.parse_statuses(result.stdout, len(jobs))

    def _deciding(
        self, script: scripts.Script, action: str, timeout_s: float | None = DEFAULT_TIMEOUT_S
    ) -> Completed:
        """Runs `script`, one that only reads run directories to decide what a job's
        state is (status, follow), as the target runs such scripts: here through the
        transport as every script; an SSH target with a jobs' user runs it as its
        login user ([`SshExecutor`](ssh.SshExecutor))."""
        return self._transport.run(
            script.text, action=action, timeout_s=timeout_s, args=script.args
        )

    def cancel(self, job: JobId) -> None:
        script = scripts.cancel_script(job)
        result = self._transport.run_to_end(
            script.text,
            args=script.args,
            action="cancel",
            pgid=job.pid,
            timeout_s=cancel_deadline_s(job),
        )
        _checked(result, "cancel")

    def release(self, job: JobId) -> None:
        if job.cgroup is None and job.mark is None:
            return
        script = scripts.release_script(job)
        _checked(self._transport.run(script.text, action="release", args=script.args), "release")

    def download(
        self,
        remote: str,
        local: Path,
        entries: Sequence[str],
        exclude: Sequence[str] = (),
        charge: Charge | None = None,
    ) -> Downloaded:
        check_entries(entries, exclude)
        script = scripts.archive_script(check_remote(remote), entries, exclude)
        if not entries:
            return Downloaded()

        broken: list[tarfile.TarError] = []
        written: list[Downloaded] = []

        def sink(stream: IO[bytes]) -> None:
            # A transport that retries after a broken connection calls the sink again,
            # on a new stream from the start: only the last stream's files count.
            broken.clear()
            written.clear()
            # Never outside `local`, whatever the target sends (safetree.py).
            # What `charge` raises leaves the sink unchanged: the transport stops the
            # script (a local one killed, a channel closed) and raises it on.
            with SafeTree(local, charge) as tree:
                try:
                    extract_stream(stream, tree)
                except tarfile.TarError as error:
                    broken.append(error)  # reported after the script's own failure, if any
                except OSError as error:
                    # Translated here: an OSError leaving the sink would pass for a
                    # broken connection (and be retried) in the SSH transport.
                    raise IoError(error.filename or local, error) from error
                written.append(tree.result())

        try:
            result = self._transport.receive(
                script.text, action="download", sink=sink, args=script.args
            )
        except OSError as error:
            raise IoError(local, error) from error
        _checked(result, "download")
        if broken:
            raise ProtocolError(f"download archive: {broken[0]}") from broken[0]
        return written[-1] if written else Downloaded()

    def manifest(
        self, remote: str, entries: Sequence[str], exclude: Sequence[str] = ()
    ) -> list[FileDigest]:
        check_entries(entries, exclude)
        script = scripts.manifest_script(check_remote(remote), entries, exclude)
        # No deadline, as a download has none: hashing a checkpoint of hundreds of GB
        # takes minutes, and a retry after a timeout would only start over.
        result = self._transport.run(
            script.text, action="manifest", timeout_s=None, args=script.args
        )
        _checked(result, "manifest")
        return parse_manifest(result.stdout)

    def follow(
        self,
        entries: Sequence[FollowEntry],
        timeout_s: float = scripts.FOLLOW_TIMEOUT_S,
        log_chunk: int = scripts.FOLLOW_CHUNK_BYTES,
    ) -> list[FollowUpdate]:
        if not entries:
            return []
        # Records are lines that begin with a random token; a job's bytes come encoded
        # (scripts.parse_follow): no content of a job's file can forge a record.
        token = _secrets.token_hex(16)
        script = scripts.follow_script(entries, token, log_chunk=log_chunk)
        result = _checked(self._deciding(script, "follow", timeout_s), "follow")
        return scripts.parse_follow(result.stdout, token, len(entries), log_chunk)

    def check_checkpoints(
        self,
        checks: Sequence[tuple[str, str]],
        timeout_s: float = scripts.CHECKPOINT_TIMEOUT_S,
    ) -> list[str | None]:
        if not checks:
            return []
        token = _secrets.token_hex(16)
        script = scripts.checkpoint_script(
            [(check_remote(run_dir), checkpoint) for run_dir, checkpoint in checks], token
        )
        result = self._transport.run(
            script.text, action="checkpoint", timeout_s=timeout_s, args=script.args
        )
        _checked(result, "checkpoint")
        return scripts.parse_checkpoints(result.stdout, token, [c for _, c in checks])

    def disk_usage(self, run_dirs: Sequence[str]) -> list[DiskSample | ProtocolError]:
        if not run_dirs:
            return []
        token = _secrets.token_hex(16)
        output = self._read_only(disk_probe_script(run_dirs, token), "probe")
        return parse_disk_probe(output, token, len(run_dirs))

    def find_marked(self, mark: str) -> tuple[int, int] | None:
        return parse_marked_job(self._read_only(marked_job_script(mark), "marked"))

    def sizes(self, remote: str, entries: Sequence[str], exclude: Sequence[str] = ()) -> int | None:
        check_entries(entries, exclude)
        script = scripts.size_script(check_remote(remote), entries, exclude)
        return scripts.parse_size_answer(self._read_only(script, "sizes"))

    def doctor(
        self,
        *,
        disk_used_fraction: float = DISK_USED_LIMIT,
        skew_warn_s: float = CLOCK_SKEW_WARN_S,
    ) -> DoctorFindings:
        options = replace(
            self._doctor_options(), disk_used_fraction=disk_used_fraction, skew_warn_s=skew_warn_s
        )
        return run_doctor(self._transport, self._workdir, options, time.time)

    def _doctor_options(self) -> DoctorOptions:
        """What the doctor must know of this executor: every file operation is a
        script here, and the job's user makes the run directories."""
        return DoctorOptions()

    def _read_only(self, script: scripts.Script | str, action: str) -> bytes:
        """The standard output of the read-only `script`.

        Raises:
            CommandError: (`action`) when it exits non-zero or times out.
        """
        if isinstance(script, str):
            script = scripts.Script(script)
        result = self._transport.run(script.text, action=action, args=script.args)
        return _checked(result, action).stdout

    def put_file(self, path: str, content: str) -> None:
        path = check_remote(path)
        parent = posixpath.dirname(path) or "/"
        script = scripts.put_file_script(path, parent, content)
        result = self._transport.run(script.text, action="put_file", args=script.args)
        _checked(result, "put_file")

    def put_files(self, files: Sequence[tuple[str, str]]) -> list[str | None]:
        checked = [(check_remote(path), content) for path, content in files]
        answers: list[str | None] = []
        for batch in _batches(checked, PUT_FILES_BATCH_BYTES):
            token = _secrets.token_hex(16)
            script = scripts.put_files_script(batch, token)
            result = _checked(
                self._transport.run(script.text, action="put_files", args=script.args),
                "put_files",
            )
            done = scripts.parse_put_files(result.stdout, token, len(batch))
            answers += [None if ok else f"cannot replace {path}" for (path, _), ok in
                        zip(batch, done, strict=True)]  # fmt: skip
        return answers

    def tail(self, path: str, offset: int = 0) -> LineStream:
        return LineStream(self, check_remote(path), offset)

    def close(self) -> None:
        self._transport.close()

    def __enter__(self) -> ScriptExecutor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
