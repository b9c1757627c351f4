"""Runs: the record of one job launched on a target, its states, the rules of a state
change, and how a finished job's outcome is decided (docs/architecture.md, "Runs")."""

from __future__ import annotations

from datetime import UTC, datetime
from enum import StrEnum
from typing import Annotated, Final

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from .budget import StopTimeouts
from .chain import Continuation, OnPreempt, is_preempted
from .errors import Conflict, NoSnapshots, NotResumable, NotRunning, NotStarted
from .ids import RunId
from .job import WATCHDOG_MAX_S, JobEnd, JobId, JobStatus, check_absolute_path
from .labels import Labels
from .preemption import Preemption, PreemptionMode
from .snapshot import ProofInvalid, ProofNone, ProofSaved, Snapshot, SnapshotReason

__all__ = [
    "ADOPTED_COMMAND",
    "NOTICE_SIGNALS",
    "TERMINAL_STATES",
    "Artifacts",
    "ArtifactsPhase",
    "Outcome",
    "RunLimits",
    "RunRecord",
    "RunState",
    "check_cancel",
    "check_resumable",
    "check_snapshot_request",
    "decide_outcome",
    "lost_after_notice",
    "transitioned",
]


class RunState(StrEnum):
    """Where a run stands: `preparing -> running -> succeeded | failed | cancelled |
    stopped`."""

    PREPARING = "preparing"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"
    STOPPED = "stopped"
    """Ended with a valid snapshot: the checkpoint of [`RunRecord.snapshot`]."""

    @property
    def is_terminal(self) -> bool:
        """Whether the state is final: never overwritten by a later, different one."""
        return self in TERMINAL_STATES


ADOPTED_COMMAND: Final = "(adopted)"
"""The `command` of a run adopted from a directory started elsewhere: unknown."""

TERMINAL_STATES: Final = frozenset(
    {RunState.SUCCEEDED, RunState.FAILED, RunState.CANCELLED, RunState.STOPPED}
)
_RANK: Final = {RunState.PREPARING: 0, RunState.RUNNING: 1} | dict.fromkeys(TERMINAL_STATES, 2)


_Hours = Annotated[float, Field(gt=0, le=WATCHDOG_MAX_S / 3600, allow_inf_nan=False)]


class RunLimits(BaseModel):
    """Policy limits a run was launched with; each is optional."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    max_hours: _Hours | None = None
    """Wall-clock budget of the run in hours (at most about 31 years: the watchdog's
    limit), counted from its start: a `deadline` snapshot is asked the settings' lead
    time (15 min) before it, by the policies and by the watchdog on the target."""
    max_cost_usd: Annotated[float, Field(gt=0, allow_inf_nan=False)] | None = None
    """Cost cap in USD: a `cost` snapshot is asked when the run's cost so far
    (hours since its start times `usd_per_hour`) reaches 95 % of it."""
    usd_per_hour: Annotated[float, Field(gt=0, allow_inf_nan=False)] | None = None
    disk: bool = True
    """Whether the disk policy watches the run directory's filesystem (a `disk`
    snapshot when it is 92 % used, or its free space is below 1.5x the newest
    checkpoint)."""

    @model_validator(mode="after")
    def _cost(self) -> RunLimits:
        if self.max_cost_usd is not None and self.usd_per_hour is None:
            raise ValueError("max_cost_usd needs usd_per_hour")
        return self


class ArtifactsPhase(StrEnum):
    """Where the retrieval of a run's artifacts stands."""

    PENDING = "pending"
    """Waiting for its first attempt, or for the next one after a failure."""
    DONE = "done"
    """In the artifact store, verified against the target's manifest."""
    FAILED = "failed"
    """Given up after the configured attempts; `runwarden retrieve` tries again."""


class Artifacts(BaseModel):
    """The retrieval of a finished run's artifacts (`job.log` always; the checkpoint
    and `snapshot.json` of a stopped run; `output/` minus intermediate checkpoints
    of a succeeded run) into the artifact store."""

    model_config = ConfigDict(extra="forbid")

    phase: ArtifactsPhase = ArtifactsPhase.PENDING
    attempts: int = Field(default=0, ge=0)
    error: str | None = None
    """Why the last attempt failed (kept when a later one is pending)."""
    next_attempt: datetime | None = None
    path: str | None = None
    """The run's directory in the artifact store, once retrieved."""
    files: int = Field(default=0, ge=0)
    bytes: int = Field(default=0, ge=0)
    skipped_links: int = Field(default=0, ge=0)
    """Symbolic links of the run directory left out of the retrieval: their targets
    are absolute or lead outside it (each listed, with its target, in the stored
    `manifest.json`). 0 in records written before it was counted."""
    retrieved: datetime | None = None


class RunRecord(BaseModel):
    """One run: a job launched (or adopted) on a target, as stored and shown."""

    model_config = ConfigDict(extra="forbid")

    id: RunId
    target: str = Field(min_length=1, max_length=64)
    created: datetime
    remote_dir: str
    job: JobId | None = None
    mark: Annotated[str, Field(pattern=r"^[0-9a-f]{32}$")] | None = None
    """The run's own token (`schemas.protocol.new_mark`), carried as `RUNWARDEN_MARK`
    by every process of its job; None for an adopted run and one launched before
    marks (its id is its mark then: [`job_mark`])."""
    state: RunState = RunState.PREPARING
    message: str | None = None
    snapshot: Snapshot | None = None
    resumed_from: RunId | None = None
    snapshots: bool = True
    """Whether the job's plugin reads snapshot requests; a run that cannot save one is
    never asked (`NoSnapshots`)."""
    command: str = ""
    limits: RunLimits = Field(default_factory=RunLimits)
    timeouts: StopTimeouts = Field(default_factory=StopTimeouts)
    """The stop timeouts the run was launched with (`LaunchSpec.timeouts`): each one
    given wins over what is learned and configured (`schemas.budget`)."""
    name: str = ""
    labels: Labels = Field(default_factory=dict)
    """The run's labels (`launch --label KEY=VALUE`, `schemas.labels`), by which a bulk
    stop selects it; kept by a resume."""
    upload: str | None = None
    """The worker-side directory uploaded into the run directory (a resume uploads it
    again)."""
    skip: tuple[str, ...] = ()
    secrets: tuple[str, ...] = ()
    """Names of the job's secrets; never their values."""
    started: datetime | None = None
    """When the run became running (the policies' clock starts here)."""
    ended: datetime | None = None
    artifacts: Artifacts | None = None
    on_preempt: OnPreempt | None = None
    """Resume the run elsewhere when it is preempted (`schemas.chain`); None: a
    preempted run stays stopped."""
    chain_preemptions: Annotated[int, Field(ge=0)] = 0
    """Preemptions of the runs this one continues (its `resumed_from` chain), counted
    by the launch from its source run."""
    continuation: Continuation | None = None
    """Where the continuation of this preempted run stands (set when it ends
    preempted with `on_preempt`)."""
    preemption: Preemption | None = None
    """The run's preemption-notice watch (which cloud, the watcher's last state, the
    notice); None when no watcher was started."""
    wait_for_all: bool = False
    """Whether the run stays running until its last process ends (`launch
    --wait-for-all`); False: its leftover processes are ended when its main process
    ends (`JobCommand.wait_for_all`)."""
    preemption_mode: PreemptionMode | None = None
    """The run's own `--preemption` (`LaunchSpec.preemption`), kept for its resumes and
    continuations; None: it took its target's setting."""
    scheduler: str | None = Field(default=None, max_length=300)
    """What the target's scheduler last said of the job, as the follow read it: for a
    Slurm job `Slurm job <id>: <STATE> (<reason>)` (`PENDING (Resources)`, `RUNNING`,
    `TIMEOUT`, ...); None on a target without one."""

    @property
    def job_mark(self) -> str:
        """The mark the run's processes carry: its token, else its id."""
        return self.mark if self.mark is not None else self.id

    @field_validator("remote_dir")
    @classmethod
    def _remote_dir(cls, value: str) -> str:
        return check_absolute_path(value)

    @field_validator("created", "started", "ended")
    @classmethod
    def _created(cls, value: datetime | None) -> datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def transitioned(
    current: RunRecord,
    to_state: RunState,
    now: datetime,
    *,
    message: str | None = None,
    snapshot: Snapshot | None = None,
    job: JobId | None = None,
    expect: set[RunState] | None = None,
) -> RunRecord | None:
    """The record `current` becomes when moved to `to_state` at `now`, or None when
    the move changes nothing. The run store applies it as one compare-and-set.

    Rules:

    1. A terminal record stays as it is: asking for the same terminal state again
       changes nothing (None, whatever `expect` says; the first outcome's message and
       snapshot stay); a different state raises `Conflict`.
    2. `expect`, when given: the current state must be one of these, else `Conflict`.
    3. States only move forward (`preparing -> running -> terminal`); going back
       raises `Conflict`.
    4. When the state changes, `message` replaces the message (None clears it); when
       it stays, a given `message` replaces it. `snapshot` and `job` replace theirs
       when given.
    5. Becoming running stamps `started` (the policies' clock); becoming terminal
       stamps `ended` and, for a run that had a job and no retrieval yet, queues its
       artifacts' retrieval (`artifacts` pending, due at once) in the same change, so
       no crash can leave an ended run never retrieved. A run with `on_preempt` that
       ends preempted (`schemas.chain.is_preempted`) gets its continuation, waiting,
       in the same change: no crash can leave it never continued.

    Raises:
        Conflict: by the rules above (naming the run, its state and the one wanted).
    """
    to_state = RunState(to_state)
    run_id = current.id
    if current.state in TERMINAL_STATES:
        if current.state is to_state:
            return None
        raise Conflict(
            f"run {run_id!r} already ended as {current.state}; it cannot become {to_state}",
            run_id=run_id,
            state=current.state,
            wanted=to_state,
        )
    if expect is not None and current.state not in {RunState(s) for s in expect}:
        shown = ", ".join(sorted(expect))
        raise Conflict(
            f"run {run_id!r} is {current.state}, not {shown}; it was not moved to {to_state}",
            run_id=run_id,
            state=current.state,
            wanted=to_state,
        )
    if _RANK[to_state] < _RANK[current.state]:
        raise Conflict(
            f"run {run_id!r} is {current.state}; it cannot go back to {to_state}",
            run_id=run_id,
            state=current.state,
            wanted=to_state,
        )
    update: dict[str, object] = {"state": to_state}
    if to_state is not current.state or message is not None:
        update["message"] = message
    if to_state is not current.state:
        if to_state is RunState.RUNNING:
            update["started"] = now
        elif to_state in TERMINAL_STATES:
            update["ended"] = now
            if (job or current.job) is not None and current.artifacts is None:
                update["artifacts"] = Artifacts(next_attempt=now)
            if current.on_preempt is not None and is_preempted(snapshot or current.snapshot):
                update["continuation"] = Continuation(
                    preemptions=current.chain_preemptions + 1, at=now
                )
    if snapshot is not None:
        update["snapshot"] = snapshot
    if job is not None:
        update["job"] = job
    return current.model_copy(update=update)


def check_snapshot_request(run: RunRecord) -> JobId:
    """The run's job when a snapshot may be asked of it, else raises, as overbrainer
    does (docs/protocol.md).

    Raises:
        NotStarted: the run has no job; NotRunning: it is not running;
        NoSnapshots: its job does not read requests.
    """
    if run.job is None:
        raise NotStarted(run.id)
    if run.state is not RunState.RUNNING:
        raise NotRunning(run.id, run.state)
    if not run.snapshots:
        raise NoSnapshots(run.id)
    return run.job


def check_cancel(run: RunRecord) -> JobId:
    """The run's job when it may be cancelled, else raises.

    Raises:
        NotStarted: the run has no job; NotRunning: it already ended.
    """
    if run.job is None:
        raise NotStarted(run.id)
    if run.state.is_terminal:
        raise NotRunning(run.id, run.state)
    return run.job


def check_resumable(run: RunRecord) -> Snapshot:
    """The snapshot `run` would be resumed from, when the record allows a resume: the
    run ended with a snapshot (stopped, or failed after its job proved one) and its
    artifacts were retrieved. (The worker also checks the stored files themselves
    before it uploads them.)

    Raises:
        NotResumable: saying why.
    """
    if run.snapshot is None or run.state not in (RunState.STOPPED, RunState.FAILED):
        raise NotResumable(run.id, f"it is {run.state}, not stopped with a snapshot")
    artifacts = run.artifacts
    if artifacts is None or artifacts.phase is not ArtifactsPhase.DONE:
        if artifacts is None:
            state = "no retrieval was recorded"
        else:
            state = f"its retrieval is {artifacts.phase}"
            if artifacts.error:
                state += f" (last error: {artifacts.error})"
        raise NotResumable(run.id, f"its checkpoint is not in the artifact store: {state}")
    return run.snapshot


class Outcome(BaseModel):
    """The recorded end of a run: its final state, a message for a person, and the
    snapshot of a stopped run."""

    model_config = ConfigDict(frozen=True)

    state: RunState
    message: str | None = None
    snapshot: Snapshot | None = None


NOTICE_SIGNALS: Final = frozenset({"HUP", "TERM", "USR1", "USR2", "XCPU"})
"""The signals that ask a job for a snapshot (schedulers' notices, the job side's
`install_preemption_signals`): a job that proved a `preempted` or `deadline` snapshot
and then ended on one of these is stopped, not failed."""
_LINUX_SIGNALS: Final = {129: "HUP", 143: "TERM", 138: "USR1", 140: "USR2", 152: "XCPU"}
# A job whose wrapper recorded no signal name (adopted, or started before it did):
# its code read by Linux's numbering.
_ASKING_REASONS: Final = frozenset({SnapshotReason.PREEMPTED, SnapshotReason.DEADLINE})


def _processes(count: int) -> str:
    return f"{count} leftover process" + ("" if count == 1 else "es")


def _end_words(end: JobEnd | None) -> list[str]:
    if end is None:
        return []
    words = []
    if end.leftovers:
        ended = end.leftovers - min(end.survived, end.leftovers)
        words.append(
            f"{_processes(end.leftovers)} ended"
            if not end.survived
            else f"{_processes(end.leftovers)}: {ended} ended, {end.survived} survived SIGKILL"
        )
    if end.waited:
        words.append(f"waited for {_processes(end.waited)}")
    return words


def decide_outcome(
    status: JobStatus,
    proof: ProofNone | ProofSaved | ProofInvalid | None,
    end: JobEnd | None = None,
) -> Outcome:
    """How a finished job's run ends, as overbrainer decides it, except that a proof
    is never thrown away.

    exited 0 -> succeeded; exited N -> failed; cancelled -> cancelled; lost -> failed.
    When that is succeeded or cancelled, the proof (read after the job ended) decides
    further: a valid proof makes the run stopped with its snapshot (also when the job
    was cancelled after writing it); an invalid proof leaves cancelled as cancelled
    and turns succeeded into failed. A job that proved a valid snapshot and then
    exited non-zero or was lost is failed, with its snapshot kept in the record (its
    checkpoint is retrieved, and it can be resumed from), and the message says so;
    except a job that proved a `preempted` or `deadline` snapshot and then ended on
    one of [`NOTICE_SIGNALS`] (`end.signal`, else a code of 128 + its Linux number):
    the signal that asked for the snapshot, as a scheduler's SIGTERM ends a job that
    saved; that run is stopped, and the message names the signal. `None` means the
    proof could not be read, which is treated as no proof.

    `end` (the wrapper's `.runwarden/ended`, None when absent) adds the run's leftover
    processes to the message ("2 leftover processes ended").

    Raises:
        ValueError: for a running status: a running job has no outcome.
    """
    outcome = _decide(status, proof, end)
    words = _end_words(end) if status.kind == "exited" else []
    if not words:
        return outcome
    message = "; ".join([*([outcome.message] if outcome.message else []), *words])
    return outcome.model_copy(update={"message": message})


def _decide(
    status: JobStatus, proof: ProofNone | ProofSaved | ProofInvalid | None, end: JobEnd | None
) -> Outcome:
    if status.kind == "running":
        raise ValueError("a running job has no outcome yet")
    saved = proof.snapshot if isinstance(proof, ProofSaved) else None
    if status.kind in ("exited", "lost") and status != JobStatus.exited(0):
        if status.kind == "exited" and saved is not None and saved.reason in _ASKING_REASONS:
            code = status.code if status.code is not None else 0
            signalled = end.signal if end is not None and end.signal else None
            signalled = signalled or _LINUX_SIGNALS.get(code)
            if code > 128 and signalled in NOTICE_SIGNALS:
                return Outcome(
                    state=RunState.STOPPED,
                    message=f"stopped with a snapshot at step {saved.step} ({saved.reason}); "
                    f"the job then ended on SIG{signalled}",
                    snapshot=saved,
                )
        how = (
            f"the job exited with code {status.code}"
            if status.kind == "exited"
            else "the job stopped without an exit code"
        )
        if saved is not None:
            how += f" after saving a snapshot at step {saved.step} ({saved.reason})"
        return Outcome(state=RunState.FAILED, message=how, snapshot=saved)
    base = RunState.SUCCEEDED if status.kind == "exited" else RunState.CANCELLED
    if saved is not None:
        return Outcome(
            state=RunState.STOPPED,
            message=f"stopped with a snapshot at step {saved.step} ({saved.reason})",
            snapshot=saved,
        )
    if isinstance(proof, ProofInvalid):
        if base is RunState.CANCELLED:
            return Outcome(state=base, message=f"the job was cancelled; {proof.why}")
        return Outcome(
            state=RunState.FAILED,
            message=f"the job stopped with a snapshot, but {proof.why}",
        )
    message = "the job was cancelled" if base is RunState.CANCELLED else None
    return Outcome(state=base, message=message)


def lost_after_notice(run: RunRecord) -> list[tuple[str, str]]:
    """What `show` and the web view's run page say of a run *lost* after a cloud's
    preemption notice (it ended, not succeeded, without a snapshot, once a notice was
    recorded: its machine went away, or it was cancelled, before its job proved the
    `preempted` snapshot), as labelled lines: `lost`, when and how, and, for a run
    launched with `on_preempt`, `continued`: why it was not (it has no verified
    checkpoint of its own to go on from; the chain's last one can be resumed by
    hand). Empty for any other run."""
    notice = run.preemption.notice if run.preemption is not None else None
    if notice is None or not run.state.is_terminal or run.state == "succeeded":
        return []
    if run.snapshot is not None:
        return []  # it saved: continued when preempted, else stopped for another reason
    seen = notice.seen_at or notice.recorded_at
    lines = [
        (
            "lost",
            f"after the {notice.source} notice seen {seen:%Y-%m-%d %H:%M:%S} UTC: the run"
            f" ended {run.state} before its job proved the preempted snapshot",
        )
    ]
    if run.on_preempt is not None:
        why = "no: a run lost after a notice has no verified checkpoint of its own"
        if run.resumed_from is not None:
            why += f"; resume its chain's last one by hand: runwarden resume {run.resumed_from}"
        else:
            why += "; its chain has no earlier one: launch it again"
        lines.append(("continued", why))
    return lines
