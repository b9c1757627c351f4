"""`SlurmExecutor`: a target whose jobs a Slurm cluster runs. The run directories live
on a filesystem the login node and the compute nodes share; everything but a job's
start, status and cancel is the ordinary protocol, run on the login node through its
transport (this machine, or an SSH destination).

- **Start**: `sh/slurm_submit.sh` on the login node runs `sbatch`, the batch script
  (`sh/slurm_batch.sh`, on its standard input, never in a file) being the job's
  wrapper on the compute node: the job's shell in the batch step's process group,
  its exit code to `exit_code`. The job's variables and secrets are exported in the
  submitting shell (secrets read from its standard input straight into their names)
  and reach the job through `--export=ALL`; slurmctld keeps a job's environment in its
  state directory, readable by its `SlurmUser` only, as for every Slurm job. The job
  runs as the user who submits it.
- **Status and follow**: one `squeue` per call for all the target's jobs, before the
  run directories are read. A job Slurm has queued or running is running whatever its
  files say (a job cannot write its own end). One it is ending (`COMPLETING`: a
  preemption's grace time, the time limit's `KillWait`) is running until its batch
  script writes its end (`exit_code`, or `cancelled` by a cancel): it may still be
  saving. Otherwise the files decide as everywhere, and a job that ended without an
  exit code (its node failed, its time ran out before it could write one, someone
  else's `scancel`) is lost. Slurm's state and reason of each job are
  [`SlurmExecutor.slurm_states`].
- **Cancel**: `cancelling`, then `scancel`: a job that never started leaves the queue,
  a running one gets SIGTERM on every process of every step and SIGKILL after the
  cluster's `KillWait` (its grace); the batch script waits for the job meanwhile.
- **Slurm's own notices**: `--signal=B:USR1@<lead>` before the time limit becomes a
  `deadline` request, a SIGTERM of a preemption's grace time a `preempted` one
  (`sh/slurm_batch.sh`). Jobs are submitted `--no-requeue`: a preempted run ends
  `stopped` with its checkpoint, and `--on-preempt resume` continues it as a new
  submission, as on every target.

Containment is Slurm's: `ProctrackType=proctrack/cgroup` finds every process of a job,
`proctrack/pgid` only those of its process groups (`doctor` says which).
"""

from __future__ import annotations

import dataclasses
import math
import posixpath
import secrets as _secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Final

from pydantic import ValidationError

from schemas import JobCommand, JobId, JobStatus
from schemas.doctor import CLOCK_SKEW_WARN_S, DoctorCheck
from schemas.job import NO_PID
from schemas.policy import DISK_USED_LIMIT
from schemas.protocol import MARK_ENV, MARK_FORM, RUN_ID_ENV
from schemas.targets import SlurmOptions

from . import scripts
from .doctor import DoctorFindings
from .doctor_checks import make_check
from .errors import CommandError, ExecError, InvalidArgument, ProtocolError
from .scripts import FollowEntry, FollowUpdate
from .scripts.common import Script, quote, sh
from .scripts.launch import job_shell_script
from .shell import ScriptExecutor, check_remote, checked_secrets
from .transport import DEFAULT_TIMEOUT_S, Completed, Transport, error_line

__all__ = [
    "ACTIVE_STATES",
    "SLURM_CANCEL_DEADLINE_S",
    "SlurmExecutor",
    "SlurmState",
    "batch_script",
    "parse_squeue",
    "sbatch_args",
    "slurm_checks",
]

ACTIVE_STATES: Final = frozenset({
    "PENDING", "CONFIGURING", "RUNNING", "SUSPENDED", "STOPPED", "REQUEUED",
    "REQUEUE_HOLD", "REQUEUE_FED", "RESIZING", "SIGNALING", "STAGE_OUT",
    "RESV_DEL_HOLD", "SPECIAL_EXIT",
})  # fmt: skip
"""Slurm job states in which the job is queued or its batch script runs: the run is
running. `COMPLETING` is not among them: Slurm is ending the job, whose batch script
may have written its end already."""
SLURM_CANCEL_DEADLINE_S: Final = 80.0
"""The deadline of a cancel's script, in seconds: its wait for the job's end, the
cluster's KillWait (at most 50 s counted) plus 8 s in looks 0.2 s apart, each a
`squeue`, and the way to the login node."""
_STATE_LINE: Final = 3


@dataclass(frozen=True)
class SlurmState:
    """What slurmctld says of a job: its state (`RUNNING`, `PENDING`, `TIMEOUT`, ...)
    and its reason (`Resources`, `Priority`, `None`, ...)."""

    state: str
    reason: str

    @property
    def active(self) -> bool:
        """Whether the job is queued or its batch script runs ([`ACTIVE_STATES`])."""
        return self.state in ACTIVE_STATES

    def __str__(self) -> str:
        return self.state if self.reason in ("", "None") else f"{self.state} ({self.reason})"


def parse_squeue(out: bytes) -> dict[int, SlurmState]:
    """The lines `ID|STATE|REASON` of `sh/slurm_squeue.sh`, by job id. A line of a job
    step or an array element (`123.batch`, `123_4`) or anything else is skipped.

    Raises:
        ProtocolError: when the output is not text.
    """
    try:
        text = out.decode("utf-8")
    except UnicodeDecodeError as error:
        raise ProtocolError("squeue answered bytes that are not UTF-8") from error
    found: dict[int, SlurmState] = {}
    for line in text.splitlines():
        parts = line.strip().split("|")
        if len(parts) != _STATE_LINE or not parts[0].isdigit() or not parts[1].isupper():
            continue
        found[int(parts[0])] = SlurmState(parts[1], parts[2][:200])
    return found


def sbatch_args(dir: str, options: SlurmOptions) -> list[str]:
    """The `sbatch` arguments of a job in the run directory `dir`: its output appended
    to `dir/job.log`, its directory, name (the run directory's name), no requeueing,
    its environment from the submitting shell, the time-limit warning, then the
    target's partition, account and own options.

    Raises:
        InvalidArgument: `dir` holds `%` or `\\`, which `sbatch --output` reads as a
            pattern.
    """
    if "%" in dir or "\\" in dir:
        raise InvalidArgument(f"a Slurm run directory cannot hold % or \\: {dir[:200]!r}")
    args = [
        "--parsable", "--export=ALL", f"--chdir={dir}", f"--output={dir}/job.log",
        "--open-mode=append", "--no-requeue", f"--signal=B:USR1@{options.signal_lead_s}",
        f"--job-name={posixpath.basename(dir.rstrip('/')) or 'runwarden'}",
    ]  # fmt: skip
    if options.partition is not None:
        args.append(f"--partition={options.partition}")
    if options.account is not None:
        args.append(f"--account={options.account}")
    return [*args, *options.sbatch_args]


def batch_script(job: JobCommand) -> str:
    """The batch script of `job` (`sh/slurm_batch.sh` after a `set --` of its words,
    each quoted), given to `sbatch` on its standard input. With
    `job.deadline_request_after_s`, the `deadline` request comes after that many
    seconds (rounded up), counted on the compute node from the job's start."""
    dir = check_remote(job.dir)
    shell = job_shell_script(dir, job.script)
    after = job.deadline_request_after_s
    words = [dir, shell.text, *shell.args, "" if after is None else str(math.ceil(after))]
    text = sh("wait_job", "slurm_batch")
    return "#!/bin/sh\nset -- " + " ".join(quote(w) for w in words) + "\n" + text


def _said(job: JobId, states: Mapping[int, SlurmState]) -> str | None:
    state = states.get(job.slurm) if job.slurm is not None else None
    return None if state is None else f"Slurm job {job.slurm}: {state}"


_NO_SLURM: Final = "every run of this target: none can be submitted, followed or cancelled"
DOCTOR_SLURM_TIMEOUT_S: Final = 40.0
"""Deadline of the Slurm part of `doctor`, in seconds: its test job waits 20 s at most."""


def slurm_checks(found: Mapping[str, str], workdir: str) -> list[DoctorCheck]:
    """The checks of a Slurm login node's probe (`sh/slurm_doctor.sh`'s `KEY=VALUE`
    lines): `slurm` (the commands), `partition`, `containment` (Slurm's
    `ProctrackType`) and `shared-workdir` (the test job's file seen here)."""
    commands = ["sbatch", "squeue", "scontrol", "scancel", "sinfo"]
    lacking = [c for c in commands if found.get(f"cmd-{c}") != "yes"]
    version = found.get("version", "").strip() or "no version"
    if lacking:
        return [make_check("slurm", "missing", f"no {', '.join(lacking)}", _NO_SLURM)]
    checks = [make_check("slurm", "ok", f"{version}: {', '.join(commands)}", "")]
    partition = found.get("partition", "")
    state = found.get("partition-state", "").strip()
    if not partition or not state:
        checks.append(make_check(
            "partition", "missing", f"{partition or 'no default partition'}: unknown to sinfo",
            "every launch: sbatch refuses a job for a partition it does not know",
        ))  # fmt: skip
    elif state != "up":
        checks.append(make_check(
            "partition", "warn", f"{partition}: {state}",
            "new runs wait in the queue until the partition is up",
        ))  # fmt: skip
    else:
        checks.append(make_check("partition", "ok", f"{partition}: up", ""))
    proctrack = found.get("proctrack", "").strip() or "unknown"
    if proctrack == "proctrack/cgroup":
        checks.append(make_check(
            "containment", "ok", f"{proctrack}: Slurm finds every process of a job", "",
        ))  # fmt: skip
    else:
        checks.append(make_check(
            "containment", "warn", f"{proctrack}: Slurm finds a job's processes by their group",
            "containment: a process of a run that leaves its process group (`setsid`) "
            "outlives the run's cancel (ProctrackType=proctrack/cgroup contains it)",
        ))  # fmt: skip
    shared = found.get("shared", "").strip()
    if shared == "yes":
        checks.append(make_check(
            "shared-workdir", "ok", f"{workdir}: a compute node's file seen here", "",
        ))  # fmt: skip
    elif shared.startswith("pending"):
        waiting = shared.removeprefix("pending ")
        checks.append(make_check(
            "shared-workdir", "warn", f"not checked: the test job is {waiting}",
            "nothing yet; if the compute nodes do not share the workdir, no run can start",
        ))  # fmt: skip
    else:
        why = shared or "no answer"
        checks.append(make_check(
            "shared-workdir", "missing", f"{workdir}: the test job's file not seen ({why})",
            "every run: the job, its proof and its checkpoint must be in the shared workdir",
        ))  # fmt: skip
    return checks


class SlurmExecutor(ScriptExecutor):
    """Runs jobs on a Slurm cluster through its login node, reached by `transport`,
    in run directories under `workdir` (see the module). The submitting shell's
    environment is the transport's: on this machine, give it the worker's less its
    own variables (`local.job_environment`)."""

    def __init__(self, transport: Transport, workdir: str, options: SlurmOptions) -> None:
        super().__init__(transport, workdir)
        self._options = options

    @property
    def options(self) -> SlurmOptions:
        return self._options

    def spawn(self, job: JobCommand) -> JobId:
        """As [`Executor.spawn`], through `sbatch` (see the module): returns once
        slurmctld accepted the job, which may then wait in the queue.

        Raises:
            InvalidArgument: a job in a container or watching a cloud's preemption
                notices (Slurm's own notices are the ones of a Slurm target), or a
                run directory `sbatch` cannot take.
            InvalidSecret: as [`Executor.spawn`].
            CommandError: `sbatch` refused the job (its message).
        """
        if job.container is not None:
            raise InvalidArgument("a Slurm target runs no container: its jobs are Slurm's")
        if job.preemption is not None:
            raise InvalidArgument(
                "a Slurm target watches Slurm's own notices, not a cloud's: no preemption mode"
            )
        secrets = checked_secrets(job)
        dir = check_remote(job.dir)
        args = [dir, *sbatch_args(dir, self._options), "--"]
        args += [f"{name}={value}" for name, value in job.env.items()]
        args += ["--", *(name for name, _ in secrets), "--"]
        script = Script(sh("slurm_submit"), tuple(args))
        stdin = "".join(f"{value}\n" for _, value in secrets) + batch_script(job)
        result = self._run(script, "spawn", stdin.encode())
        if result.exit_code != 0:
            raise CommandError("spawn", error_line(result.stderr, result.exit_code))
        text = result.stdout.decode("utf-8", "replace").strip()
        mark = job.env.get(MARK_ENV, job.env.get(RUN_ID_ENV))
        try:
            return JobId(
                dir=job.dir,
                pid=NO_PID,
                slurm=int(text.split(";", 1)[0]),
                mark=mark if mark is not None and MARK_FORM.fullmatch(mark) else None,
            )
        except (ValueError, ValidationError) as error:
            raise ProtocolError(f"sbatch answered {text[:60]!r}, not a job id") from error

    def _run(
        self,
        script: Script,
        action: str,
        stdin: bytes = b"",
        timeout_s: float | None = DEFAULT_TIMEOUT_S,
    ) -> Completed:
        return self.transport.run(
            script.text, action=action, stdin=stdin, timeout_s=timeout_s, args=script.args
        )

    def slurm_states(self, jobs: Sequence[JobId]) -> dict[int, SlurmState]:
        """What slurmctld says of each Slurm job of `jobs`, by job id, through one
        `squeue`; a job it no longer knows (ended more than `MinJobAge` ago) is not
        there.

        Raises:
            CommandError: `squeue` failed (slurmctld down, no `squeue` on the login
                node).
        """
        ids = sorted({job.slurm for job in jobs if job.slurm is not None})
        if not ids:
            return {}
        script = Script(sh("slurm_squeue"), tuple(str(i) for i in ids))
        result = self._run(script, "status")
        if result.exit_code != 0:
            raise CommandError("status", error_line(result.stderr, result.exit_code))
        return parse_squeue(result.stdout)

    @staticmethod
    def _files_only(job: JobId) -> JobId:
        # A handle with no process group and no start time: the protocol's scripts
        # then decide from the run directory's files alone.
        return JobId(dir=job.dir, pid=NO_PID, mark=job.mark)

    @staticmethod
    def _decide(
        job: JobId, files: JobStatus | ProtocolError, states: Mapping[int, SlurmState]
    ) -> JobStatus | ProtocolError:
        state = states.get(job.slurm) if job.slurm is not None else None
        if state is not None and state.active:
            return JobStatus.RUNNING
        if state is not None and state.state == "COMPLETING" and files == JobStatus.LOST:
            # Slurm ends the job (a preemption's grace time, the time limit's KillWait)
            # and its batch script has not written its end: it may still be saving.
            return JobStatus.RUNNING
        return files

    def statuses(self, jobs: Sequence[JobId]) -> list[JobStatus | ProtocolError]:
        """As [`Executor.statuses`]: one `squeue` for all `jobs`, then one status
        script on their files (see the module)."""
        if not jobs:
            return []
        states = self.slurm_states(jobs)
        files = self._script_statuses([self._files_only(job) for job in jobs])
        return [self._decide(j, f, states) for j, f in zip(jobs, files, strict=True)]

    def follow(
        self,
        entries: Sequence[FollowEntry],
        timeout_s: float = scripts.FOLLOW_TIMEOUT_S,
        log_chunk: int = scripts.FOLLOW_CHUNK_BYTES,
    ) -> list[FollowUpdate]:
        """As [`Executor.follow`]: one `squeue` for all the entries' jobs, then the
        follow script on their run directories, each status decided as
        [`statuses`] decides it."""
        if not entries:
            return []
        states = self.slurm_states([entry.job for entry in entries])
        plain = [entry._replace(job=self._files_only(entry.job)) for entry in entries]
        updates = super().follow(plain, timeout_s, log_chunk)
        return [
            replace(
                update,
                status=self._decide(entry.job, update.status, states),
                scheduler=_said(entry.job, states),
            )
            for entry, update in zip(entries, updates, strict=True)
        ]

    def cancel(self, job: JobId) -> None:
        """As [`Executor.cancel`], through `scancel` (see the module; `sh/slurm_cancel.sh`).

        Raises:
            InvalidArgument: `job` is not a Slurm job.
            CommandError: the job still runs after SIGKILL (a later cancel retries),
                its run directory does not exist, or `scancel` failed.
        """
        if job.slurm is None:
            raise InvalidArgument(
                f"{job.dir} is not a Slurm job: a Slurm target cancels none other"
            )
        script = Script(sh("slurm_cancel"), (check_remote(job.dir), str(job.slurm)))
        result = self._run(script, "cancel", timeout_s=SLURM_CANCEL_DEADLINE_S)
        if result.exit_code != 0:
            raise CommandError("cancel", error_line(result.stderr, result.exit_code))

    def doctor(
        self,
        *,
        disk_used_fraction: float = DISK_USED_LIMIT,
        skew_warn_s: float = CLOCK_SKEW_WARN_S,
    ) -> DoctorFindings:
        """As [`Executor.doctor`] of the login node, plus what a Slurm target needs
        ([`slurm_checks`]): its commands, the partition, how Slurm contains a job, and
        a test job proving the workdir is shared with the compute nodes (up to 20 s).
        A probe that cannot run gives one `slurm` check, missing."""
        found = super().doctor(disk_used_fraction=disk_used_fraction, skew_warn_s=skew_warn_s)
        args = [self.workdir, _secrets.token_hex(8), self._options.partition or ""]
        if self._options.account is not None:
            args.append(f"--account={self._options.account}")
        script = Script(sh("slurm_doctor"), (*args, *self._options.sbatch_args))
        try:
            result = self._run(script, "doctor", timeout_s=DOCTOR_SLURM_TIMEOUT_S)
        except ExecError as error:
            checks = [make_check("slurm", "missing", str(error), _NO_SLURM)]
        else:
            text = result.stdout.decode("utf-8", "replace")
            pairs = dict(line.split("=", 1) for line in text.splitlines() if "=" in line)
            checks = slurm_checks(pairs, self.workdir)
        return dataclasses.replace(found, checks=(*found.checks, *checks))

    def release(self, job: JobId) -> None:
        """Nothing: Slurm ends what is left of a job when its batch script ends
        (through its `ProctrackType`)."""
