"""The `Executor` protocol: overbrainer's operations on a target (docs/protocol.md),
synchronous (Celery tasks are synchronous), each stating what it guarantees and how it
fails.

A job is detached from whoever started it: it runs in its own session, writes its
output to `job.log`, its pid to `job.pid` and, when it ends, its exit code to
`exit_code`, all in its run directory. Any later process can read its status, tail
its files or cancel it from that directory alone.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Protocol, runtime_checkable

from schemas import JobCommand, JobId, JobStatus
from schemas.doctor import CLOCK_SKEW_WARN_S
from schemas.policy import DISK_USED_LIMIT, DiskSample

from .digest import Charge, FileDigest
from .doctor import DoctorFindings
from .errors import ProtocolError
from .lines import LineStream
from .safetree import Downloaded
from .scripts import CHECKPOINT_TIMEOUT_S, FOLLOW_TIMEOUT_S, FollowEntry, FollowUpdate
from .scripts.follow import FOLLOW_CHUNK_BYTES

__all__ = ["Executor"]


@runtime_checkable
class Executor(Protocol):
    """Runs jobs on a target and moves files to and from it. Paths on the target are
    absolute strings; the target may be another machine. Every failure raises an
    `ExecError`; bad arguments raise `InvalidArgument` before anything is done.
    Concurrent calls from several threads are allowed (over SSH, each on its own
    channel of one connection)."""

    @property
    def workdir(self) -> str:
        """Directory holding the run directories on the target, absolute."""
        ...

    def claim(self, dir: str, owner: str) -> bool:
        """Claims `dir` for the run whose owner value is `owner` (one line): creates it
        and its parents, then `.claim` in it, exclusively, holding `owner`. A `.claim`
        already there holding `owner` is a claim of the same run, and accepted.
        Returns False, and changes nothing, when it holds anything else."""
        ...

    def upload(self, local: Path, remote: str, skip: Sequence[str] = ()) -> None:
        """Copies the content of the local directory `local` into `remote`, creating
        it, except the top-level entries of `local` named in `skip`, which never leave
        this machine. Symbolic links are copied as links."""
        ...

    def spawn(self, job: JobCommand) -> JobId:
        """Starts `job` in the background and returns its handle. The job keeps running
        when this process exits or loses its connection to the target. Stale
        `exit_code`, `cancelling`, `cancelled` and `job.pid` are cleared first, and
        `snapshot.request`, `snapshot.json` and the notice watcher's files too: a new
        job never inherits a request, a proof or a notice (from an uploaded
        directory, an earlier job). With `job.deadline_request_after_s` the on-target
        watchdog starts beside it, with `job.preemption` the preemption-notice
        watcher (both in sessions of their own, outliving this process).

        A local job inherits this process's environment minus every variable whose
        name starts with `RUNWARDEN_`, `OVERBRAINER_` or `VAULT_`; a remote job gets
        the SSH server's non-interactive environment. The job's `env` is set on top,
        then its secrets, which travel on the launcher's stdin only.

        Raises:
            InvalidSecret: naming the variable only, when a secret's name is not an
                environment variable name or its value holds `\\n`, `\\r` or NUL;
                nothing is started then.
        """
        ...

    def read_from(self, path: str, offset: int, limit: int) -> bytes:
        """Bytes of the file `path` from byte `offset`, up to `limit` bytes (fewer
        when less remains). A missing file reads as empty. The read never blocks and
        never follows a symbolic link: a job may put anything in its run directory.

        Raises:
            ProtocolError: when `path` is not a regular file (a directory, a FIFO, a
                device, a symbolic link).
        """
        ...

    def status(self, job: JobId) -> JobStatus:
        """What `job` is doing now, decided by one script on the target in the
        protocol's order (see `scripts.status_script`).

        Raises:
            ProtocolError: when the run directory answers garbage (an `exit_code`
                that is not a number).
        """
        ...

    def statuses(self, jobs: Sequence[JobId]) -> list[JobStatus | ProtocolError]:
        """The statuses of all `jobs` of this target, in order, through at most one
        script (a target on this machine reads a live job's liveness itself and asks
        the script only for the others); a job whose run directory answers garbage
        (an `exit_code` that is not a number) gets a `ProtocolError` in its place,
        never hiding the others."""
        ...

    def cancel(self, job: JobId) -> None:
        """Stops `job`: its container first, then its whole process group (SIGTERM,
        then SIGKILL after 10 s), then waits up to 10 s for the group to be gone and
        writes `cancelled`. A job that already exited is left as is; cancelling a
        cancelled job is a no-op; pid 0 and 1 are never signalled. Runs to its end:
        an interrupt is delivered after it; its script has a deadline
        (`shell.cancel_deadline_s`: 20 s, 50 s for a container), plus the time to
        reach an SSH target.

        Raises:
            CommandError: when the group survives SIGKILL (`cancelling` stays and a
                later cancel retries), the run directory does not exist, or the
                script is cut at its deadline (a later cancel goes on from there).
        """
        ...

    def release(self, job: JobId) -> None:
        """Ends what is left of the finished `job` at once: every process in its
        cgroup (`JobId.cgroup`) and every process still carrying its mark
        (`JobId.mark`), SIGTERM then SIGKILL 0.1 s later (its wrapper or a cancel gave
        every process it could find SIGTERM and a grace; what is left hid from them,
        or outlived a cancel cut short), and removes the cgroup. Nothing for a job
        with neither (`scripts.release_script`).

        Raises:
            CommandError: something survived SIGKILL for 5 s.
            ExecError: the target cannot be reached.
        """
        ...

    def download(
        self,
        remote: str,
        local: Path,
        entries: Sequence[str],
        exclude: Sequence[str] = (),
        charge: Charge | None = None,
    ) -> Downloaded:
        """Copies `entries` (relative to the target directory `remote`) into the local
        directory `local`, leaving out names matching an `exclude` pattern at any
        depth. Missing entries are skipped, and so is an entry with a symbolic link
        on its way (`a/b` when `a` is a link); `local` is not created when none
        exists. With `charge`, each chunk of file content is charged (its size in
        bytes) before it is written here; whatever `charge` raises stops the download
        at once (the target's side too) and reaches the caller unchanged, what was
        written so far left in `local` for the caller to remove. Directories and
        regular files are copied (a file with several hard links comes once per
        name, in full); device files, FIFOs and sockets are not. A file's mode
        keeps its owner/group/other read and execute bits, plus owner read and
        write; its modification time is kept.

        Symbolic links, the same on every executor: a link whose target, resolved
        lexically from the link's own directory, stays inside `local` (relative, its
        `..` components first and not above `local`; see `safetree.stays_inside`)
        is made as a link; any other (absolute, climbing above `local`, or with a
        `..` after a name) is not made, and is listed in the result's
        `skipped_links`.

        The target may be hostile: whatever it sends, every path component here is
        made or opened relative to its parent without following a link, so nothing
        is ever written outside `local` (`safetree.py`).

        Returns the SHA-256 of every regular file written, by path relative to `local`
        (as [`manifest`] names them), computed from the bytes as they were written,
        never by reading the files back, and the links made and skipped; each list
        sorted. Comparing the files with the target's `manifest` verifies the copy
        without a second pass over the data here.

        Raises:
            CommandError: (action `download`, message `<remote> does not exist`) when
                `remote` is not a directory.
            IoError: when `local` cannot be written (nothing is retried then).
            UnsafeArchive: when the target sends a name that is absolute or holds
                `.`/`..` components, a hard link, a member below a link or a file of
                the same download, a link or file where a directory is, or an
                oversized header (a hostile target); nothing is written outside it.
            ProtocolError: when the target's stream breaks off or is garbage.
        """
        ...

    def manifest(
        self, remote: str, entries: Sequence[str], exclude: Sequence[str] = ()
    ) -> list[FileDigest]:
        """Every regular file under `entries` of `remote` with its SHA-256, excluded
        names left out at any depth, missing entries skipped, links not followed
        (an entry with a link on its way is missing, as for `download`); paths
        relative to `remote`, sorted. Links are not listed. Each file is read once, with no deadline
        (like `download`).

        Raises:
            CommandError: (message `<remote> does not exist`) when `remote` is not a
                directory.
        """
        ...

    def follow(
        self,
        entries: Sequence[FollowEntry],
        timeout_s: float = FOLLOW_TIMEOUT_S,
        log_chunk: int = FOLLOW_CHUNK_BYTES,
    ) -> list[FollowUpdate]:
        """One follow tick over `entries` (runs of this target), in one round trip
        bounded by `timeout_s` seconds:
        for each, in order, its status (as [`status`] decides it, or a
        `ProtocolError` for that run alone), the reason in `snapshot.request` (None
        without one), the first bytes of the notice watcher's `notice.json` and
        `.runwarden/notice.state` (None without them; read after the request), for
        an entry whose `proof` is set the first `PROOF_LIMIT` bytes of
        `snapshot.json` (None when it is not a regular file), and the bytes of
        `job.log` and `metrics.jsonl` past its offsets (at most `log_chunk` bytes of
        the log, the run's log budget in the store, and `scripts.FOLLOW_CHUNK_BYTES`
        of the metrics) with the files' sizes; a log more than `log_chunk` bytes
        behind is read from its last `log_chunk` bytes, the bytes skipped counted
        (`FollowUpdate.log_skipped`, and a note line of `log_lines`).

        Raises:
            CommandError: (action `follow`) when the script fails or times out.
            ProtocolError: when its answer is cut short or malformed.
        """
        ...

    def check_checkpoints(
        self,
        checks: Sequence[tuple[str, str]],
        timeout_s: float = CHECKPOINT_TIMEOUT_S,
    ) -> list[str | None]:
        """Judges the checkpoint of each `(run_dir, checkpoint)` (the checkpoint as a
        proof names it, relative to the run directory) by the one rule every proof
        is judged by, in one script on the target (`scripts.checkpoint_script`), in
        order: None when it resolves, with no symbolic link on any component of its
        path, to a non-empty directory inside the run directory; else why not, for a
        person (`checkpoint output/checkpoint-21 is a symbolic link`). Reads no file
        and follows no link; bounded by `timeout_s` seconds.

        Raises:
            InvalidArgument: a checkpoint that is not a relative path of plain names.
            CommandError: (action `checkpoint`) when the script fails or times out.
            ProtocolError: when its answer is cut short or malformed.
        """
        ...

    def disk_usage(self, run_dirs: Sequence[str]) -> list[DiskSample | ProtocolError]:
        """The filesystem of each of `run_dirs` (`df -Pk`) and the size of its newest
        checkpoint (`du -sk`), in order, from one read-only probe; a directory that
        could not be probed gets a `ProtocolError` saying why, never hiding the
        others.

        Raises:
            CommandError: (action `probe`) when the probe fails as a whole.
            ProtocolError: when its answer is cut short or malformed.
        """
        ...

    def doctor(
        self,
        *,
        disk_used_fraction: float = DISK_USED_LIMIT,
        skew_warn_s: float = CLOCK_SKEW_WARN_S,
    ) -> DoctorFindings:
        """What this target has of what runwarden needs, checked as the job's user
        (`runwarden doctor`): one probe script (`scripts.doctor`, read-only but for a
        scratch directory it removes itself) and a few readings of the target's
        clock, bracketed by this machine's. Each check says what was found and what
        does not work without it (`doctor.assess`); the disk check warns at
        `disk_used_fraction` used, the clock check above `skew_warn_s` seconds of
        possible skew. A probe the target's shell cannot run to its end is one
        `probe` check, missing; a clock that cannot be read, a `clock` warning.

        Raises:
            ExecError: when the target cannot be reached (or, for jobs run as another
                user, the change of user is refused).
        """
        ...

    def find_marked(self, mark: str) -> tuple[int, int] | None:
        """`(pid, start)` of the oldest live process-group leader whose environment
        holds `RUNWARDEN_RUN_ID=<mark>` (the job's wrapper), its start time in clock
        ticks since boot; None when there is none (or no `/proc`). Read-only
        (`marked.marked_job_script`).

        Raises:
            InvalidArgument: for a mark that is not a run id.
            CommandError: (action `marked`) when the script fails.
            ProtocolError: when it answers garbage.
        """
        ...

    def sizes(self, remote: str, entries: Sequence[str], exclude: Sequence[str] = ()) -> int | None:
        """The bytes a download of `entries` of `remote` (without `exclude`) would
        bring, from the directory entries alone (no file read; links not followed);
        None when the target cannot say (no GNU `find`). Read-only
        (`scripts.size_script`).

        Raises:
            InvalidArgument: an entry or pattern that is not safe.
            CommandError: (action `sizes`) when the script fails (`remote` is not a
                directory) or times out.
            ProtocolError: when it answers garbage.
        """
        ...

    def put_file(self, path: str, content: str) -> None:
        """Replaces the small file `path` with `content`, creating its directory,
        through a rename from a writer-unique temporary name: a reader sees the old
        content or the new one, never a part."""
        ...

    def put_files(self, files: Sequence[tuple[str, str]]) -> list[str | None]:
        """Replaces each small file `path` of `files` with its `content`, as
        [`put_file`] replaces one, all in one script on the target (as few as fit the
        transport's size limit: `PUT_FILES_BATCH_BYTES`), or in this process for a
        local target: None for each file replaced, else why not, in order; a file that
        cannot be replaced never stops the others (a bulk stop's request files).

        Raises:
            InvalidArgument: a path that is not absolute (before any write).
            CommandError: (action `put_files`) when the script fails as a whole or
                times out; SshError when the target cannot be reached.
            ProtocolError: when its answer is cut short or malformed.
        """
        ...

    def tail(self, path: str, offset: int = 0) -> LineStream:
        """Follows the file `path` from byte `offset`, one complete line at a time."""
        ...

    def close(self) -> None:
        """Releases every connection and resource; the executor opens again lazily."""
        ...
