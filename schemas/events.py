"""The wire contract (docs/architecture.md, "Tasks"): the task names, the queues and
routes, the serializer, and the bodies producers publish. The workers' Celery app,
the producers' app and `runwarden serve` all take them from here. A producer in
another service needs only `celery` and these names; every body is JSON.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Final

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from .budget import StopTimeouts
from .chain import OnPreempt
from .idempotency import LaunchKey
from .ids import RunId
from .job import check_absolute_path, check_secret_name
from .labels import Labels, check_name_glob
from .preemption import PreemptionMode
from .run import RunLimits, RunRecord
from .settings import Settings
from .snapshot import SnapshotReason
from .stops import AskedBy, StopId
from .targets import TargetName

__all__ = [
    "DEFAULT_QUEUE",
    "NOT_KEPT",
    "QUEUE",
    "QUEUE_RETRIEVE",
    "QUEUE_WATCH",
    "RECORD_FIELD",
    "SERIALIZER",
    "TASK_CANCEL",
    "TASK_CONTINUE",
    "TASK_DOCTOR",
    "TASK_END_TIMEOUT",
    "TASK_FOLLOW",
    "TASK_FOLLOW_TICK",
    "TASK_LAUNCH",
    "TASK_POLICY_TARGET",
    "TASK_POLICY_TICK",
    "TASK_PROOF_TIMEOUT",
    "TASK_RECONCILE",
    "TASK_RETRIEVE",
    "TASK_ROUTES",
    "TASK_SNAPSHOT_REQUEST",
    "TASK_STOP_MANY",
    "TASK_WATCH_TARGET",
    "CancelBody",
    "ContinueBody",
    "DoctorBody",
    "FollowBody",
    "LaunchSpec",
    "RetrieveBody",
    "SnapshotRequestBody",
    "StopManyBody",
    "StopManyRefusal",
    "StopManySummary",
    "TimeoutBody",
    "describe",
    "launch_settings",
    "resume_spec",
    "wire_config",
]

TASK_LAUNCH: Final = "runwarden.launch"
TASK_FOLLOW: Final = "runwarden.follow"
TASK_SNAPSHOT_REQUEST: Final = "runwarden.snapshot_request"
TASK_CANCEL: Final = "runwarden.cancel"
TASK_STOP_MANY: Final = "runwarden.stop_many"
"""A bulk stop: every running run of the named targets that a selection picks
(`StopManyBody`), asked for a snapshot, one batched write per target; answers a
`StopManySummary`."""
TASK_PROOF_TIMEOUT: Final = "runwarden.proof_timeout"
TASK_END_TIMEOUT: Final = "runwarden.end_timeout"
TASK_FOLLOW_TICK: Final = "runwarden.follow_tick"
TASK_RECONCILE: Final = "runwarden.reconcile"
TASK_POLICY_TICK: Final = "runwarden.policy_tick"
TASK_RETRIEVE: Final = "runwarden.retrieve"
TASK_DOCTOR: Final = "runwarden.doctor"
"""Check a target as the worker sees it; answers a `schemas.doctor.DoctorReport`."""

TASK_WATCH_TARGET: Final = "runwarden.watch_target"
"""Internal: one target's share of a follow tick (fanned out by `follow_tick`, one
task per target so workers share the load)."""
TASK_POLICY_TARGET: Final = "runwarden.policy_target"
"""Internal: one target's share of a policy tick (fanned out by `policy_tick`)."""
TASK_CONTINUE: Final = "runwarden.continue"
"""Internal: continue a preempted run on its next target (`schemas.chain`); sent when
its checkpoint is retrieved, and by `reconcile` for a continuation still waiting."""

QUEUE: Final = "runwarden"
"""The queue of every task but retrievals and the follow ticks."""
DEFAULT_QUEUE: Final = "celery"
"""Celery's default queue, which a bare `Celery(broker=...).send_task(...)` of another
service publishes to: the workers consume it too, so such a message is never left
unread."""
QUEUE_RETRIEVE: Final = "runwarden.retrieve"
"""The queue of `runwarden.retrieve` alone: a retrieval may download for hours, and
must never hold a worker process that a stop's deadline or a follow tick needs.
`runwarden serve` (and compose) run one worker for it; a worker started without
`-Q` consumes both queues."""
QUEUE_WATCH: Final = "runwarden.watch"
"""The queue of the follow ticks (`runwarden.follow_tick` and its per-target
`runwarden.watch_target`): a storm of stops (a cancel holds its
process up to 20 s while its job dies) must never hold back the reading of every
other run. `runwarden serve` (and compose) run one worker for it; a worker started
without `-Q` consumes every queue."""
TASK_ROUTES: Final = {
    TASK_RETRIEVE: {"queue": QUEUE_RETRIEVE},
    TASK_FOLLOW_TICK: {"queue": QUEUE_WATCH},
    TASK_WATCH_TARGET: {"queue": QUEUE_WATCH},
    TASK_DOCTOR: {"queue": QUEUE},
}
SERIALIZER: Final = "json"
"""The only serializer on the wire, for tasks, results and events: never pickle."""


def wire_config(settings: Settings) -> dict[str, Any]:
    """The Celery configuration every runwarden app shares, worker or producer: the
    broker and result backend of `settings`, one visibility timeout for both (longer
    than the longest countdown plus a task's run time, so that a countdown task held
    for its ETA is never redelivered while it waits), JSON only, the default queue and
    the routes; with Redis behind Sentinel (`schemas.sentinel`), kombu's and Celery's
    `sentinel://` transport and backend, the master's name in their transport options.
    Contains the broker URL (with its password, if any): never log it."""
    url = settings.broker_url()
    transport: dict[str, Any] = {"visibility_timeout": int(settings.visibility_timeout_s)}
    sentinel = settings.sentinel_address()
    publish: dict[str, Any] = {}
    if sentinel is not None:
        # Imported here: Celery's processes have redis-py loaded; the schemas alone do not.
        from redis.backoff import NoBackoff  # noqa: PLC0415
        from redis.retry import Retry  # noqa: PLC0415

        # kombu's `sentinel://` transport and Celery's sentinel result backend: the
        # master's name, and the sentinels' own password and bounded waits. A publish
        # is retried through a failover (the sentinels see the primary down after
        # their `down-after-milliseconds`, then promote a replica): about 10 s. Each
        # lookup asks a sentinel once: redis-py's default retry (10 times, backing off)
        # made one that refuses connections cost 12 s on every new connection.
        sentinel_kwargs: dict[str, Any] = {
            "socket_timeout": 2.0,
            "socket_connect_timeout": 2.0,
            "retry": Retry(NoBackoff(), 0),
        }
        if sentinel.sentinel_password is not None:
            sentinel_kwargs["password"] = sentinel.sentinel_password
        transport |= {"master_name": sentinel.master, "sentinel_kwargs": sentinel_kwargs}
        publish = {
            "task_publish_retry_policy": {
                "max_retries": 20, "interval_start": 0, "interval_step": 0.5, "interval_max": 0.5,
            },
        }  # fmt: skip
    return publish | {
        "broker_url": url,
        "result_backend": url,
        "broker_transport_options": transport,
        "result_backend_transport_options": transport,
        "broker_connection_retry_on_startup": True,
        "task_serializer": SERIALIZER,
        "result_serializer": SERIALIZER,
        "event_serializer": SERIALIZER,
        "accept_content": [SERIALIZER],
        "result_accept_content": [SERIALIZER],
        "task_default_queue": QUEUE,
        "task_routes": TASK_ROUTES,
        "task_send_sent_event": True,
    }


class _Body(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class LaunchSpec(_Body):
    """What to run where: `runwarden.launch`'s body."""

    target: TargetName
    command: str = Field(min_length=1)
    """POSIX shell command of the job, run in its run directory."""
    name: str = ""
    """Free text; its slug goes into the run id."""
    labels: Labels = Field(default_factory=dict)
    """`key=value` pairs kept on the run's record (`schemas.labels`: at most 16, keys
    and values of a short grammar), by which a bulk stop (`runwarden.stop_many`)
    selects runs."""
    upload: Path | None = None
    """A directory on the worker whose content is copied into the run directory."""
    skip: tuple[str, ...] = ()
    """Top-level entries of `upload` that never leave the worker."""
    secrets: tuple[str, ...] = ()
    """Names of the job's secret environment variables, each read on the worker from
    the secrets directory's file `<NAME>` (with `RUNWARDEN_SECRETS_FROM_ENV`, from the
    worker's `RUNWARDEN_SECRET_<NAME>` when that file is missing); values never enter
    Redis."""
    limits: RunLimits = Field(default_factory=RunLimits)
    timeouts: StopTimeouts = Field(default_factory=StopTimeouts)
    """The run's own stop timeouts (`--proof-timeout`, `--end-timeout`), kept on its
    record and used by each of its stops instead of the learned or configured ones."""
    resume_from: RunId | None = None
    snapshots: bool = True
    """Whether the job reads snapshot requests (the job-side plugin)."""
    on_preempt: OnPreempt | None = None
    """Resume the run elsewhere when it is preempted (`schemas.chain`); None: a
    preempted run stays stopped."""
    key: LaunchKey | None = None
    """The launch's idempotency key (`schemas.idempotency`: 1-128 of `[A-Za-z0-9_.-]`,
    starting with a letter or digit), chosen by the producer: every launch with the
    same key is the same run, started once. `producers.api.Runwarden.launch` (and so
    the CLI) picks a random one when none is given; a message without one gets a key
    derived from its own task id on the worker, so a redelivered message still finds
    its run."""
    preemption: PreemptionMode | None = None
    """Whose preemption notices to watch on the target (`aws`, `gcp`, `azure`,
    `auto`) or `off`; None: the target's setting (`TargetConfig.preemption`). A run
    that reads snapshot requests then gets the notice watcher beside its job."""
    wait_for_all: bool = False
    """Whether the run stays running until its last process ends (`--wait-for-all`);
    False: when its main process ends, its leftover processes (its process group,
    every process carrying its mark) are ended, SIGKILL after 10 s."""

    @field_validator("secrets")
    @classmethod
    def _names(cls, names: tuple[str, ...]) -> tuple[str, ...]:
        for name in names:
            check_secret_name(name)
        return names

    @field_validator("command")
    @classmethod
    def _command(cls, command: str) -> str:
        if "\0" in command:
            raise ValueError("a command cannot hold a NUL byte")
        return command

    @model_validator(mode="after")
    def _preempt(self) -> LaunchSpec:
        if self.on_preempt is not None and not self.snapshots:
            raise ValueError(
                "on_preempt needs a job that reads snapshot requests: a job that "
                "cannot save a snapshot cannot be resumed"
            )
        return self


NOT_KEPT: Final = frozenset({"target", "command", "resume_from", "key"})
"""The [`LaunchSpec`] fields a resume does not copy from its source: where and what
it runs (the resume's choice, the source's by default), the run it resumes, and its
own idempotency key. Every other field is a per-run launch setting, kept."""
RECORD_FIELD: Final = {"preemption": "preemption_mode"}
"""A launch setting kept on the run record under another name (the record's
`preemption` is the watch itself)."""


def launch_settings(run: RunRecord) -> dict[str, Any]:
    """The per-run launch settings of `run`, as [`LaunchSpec`] fields: every field but
    [`NOT_KEPT`], read from the record field of the same name (or [`RECORD_FIELD`]'s).
    Derived from the spec's own fields, so a setting added to both is kept by every
    resume and continuation without more code; a spec field the record does not keep
    is left to its default (`tests/unit/schemas/test_resume_spec.py` fails for one)."""
    settings: dict[str, Any] = {}
    for name in LaunchSpec.model_fields:
        kept = RECORD_FIELD.get(name, name)
        if name not in NOT_KEPT and kept in RunRecord.model_fields:
            settings[name] = getattr(run, kept)
    return settings


def resume_spec(
    run: RunRecord, *, target: str | None = None, command: str | None = None, key: str | None = None
) -> LaunchSpec:
    """The launch that continues `run` from its snapshot: its target and command
    unless overridden, and every per-run launch setting of the run
    ([`launch_settings`]: upload, skip list, secret names, limits, stop timeouts,
    name, snapshots, on-preempt plan, `--preemption`...), with `resume_from` set (the
    worker checks that it can be resumed). `runwarden resume` and the continuation of
    a preempted run (`workers.chain`) both launch this.

    Preemption: the run's own `--preemption` is kept on any target. A run that took
    its target's setting watches, on its own target, the cloud it watched; on another
    target, that target's setting applies (a cloud is a property of where the job
    runs)."""
    settings = launch_settings(run)
    same_target = target is None or target == run.target
    if run.preemption_mode is None:
        watched = run.preemption.cloud if run.preemption is not None else None
        settings["preemption"] = watched if same_target else None
    if settings.get("upload") is not None:
        settings["upload"] = Path(settings["upload"])
    return LaunchSpec(
        **settings,
        target=target or run.target,
        command=command or run.command,
        resume_from=run.id,
        key=key,
    )


class FollowBody(_Body):
    """`runwarden.follow`: (re)start following a run, or adopt a run directory
    started elsewhere (by hand, or by overbrainer) on a target: its pid is read from
    its `job.pid`."""

    run_id: RunId | None = None
    target: TargetName | None = None
    dir: str | None = None

    @model_validator(mode="after")
    def _one(self) -> FollowBody:
        if (self.run_id is None) == (self.dir is None):
            raise ValueError("follow takes a run id, or a target and a run directory")
        if self.dir is not None:
            if self.target is None:
                raise ValueError("adopting a run directory needs its target")
            check_absolute_path(self.dir)
        return self


class SnapshotRequestBody(_Body):
    """`runwarden.snapshot_request`: ask the run's job for a snapshot."""

    run_id: RunId
    reason: SnapshotReason = SnapshotReason.REQUESTED
    asked_by: AskedBy = "api"
    only_if_none_open: bool = False
    """A policy's request: when a stop is already open, change nothing (its first
    reason stays). Without it, asking again changes only the open stop's reason."""


MAX_STOP_MANY_TARGETS: Final = 100
"""Targets one bulk stop may name."""


class StopManyBody(_Body):
    """`runwarden.stop_many`: ask a snapshot of every running run of `targets` that
    the selection picks: `all`, or runs carrying every label of `labels` and whose
    name matches `name_glob` (both when both are given). A run on a target the
    producer may not act on (`TargetConfig.producers`) is refused, reported in the
    summary with why; the others are asked. The selectors combine: `all` with labels
    or a glob selects what they select. Each selected run's stop is opened as a
    single stop opens it (its proof deadline in the deadline table first), and the
    request files of each target are written by one script."""

    targets: tuple[TargetName, ...] = Field(min_length=1, max_length=MAX_STOP_MANY_TARGETS)
    all: bool = False
    labels: Labels = Field(default_factory=dict)
    name_glob: str | None = None
    reason: SnapshotReason = SnapshotReason.REQUESTED
    asked_by: AskedBy = "api"

    @field_validator("name_glob")
    @classmethod
    def _glob(cls, glob: str | None) -> str | None:
        return None if glob is None else check_name_glob(glob)

    @field_validator("targets")
    @classmethod
    def _targets(cls, targets: tuple[str, ...]) -> tuple[str, ...]:
        return tuple(dict.fromkeys(targets))

    @model_validator(mode="after")
    def _selects(self) -> StopManyBody:
        if not self.all and not self.labels and self.name_glob is None:
            raise ValueError("a bulk stop selects runs: all, labels or a name glob (at least one)")
        return self


class StopManyRefusal(_Body):
    """A selected run that was not asked, and why."""

    run_id: RunId
    why: str


class StopManySummary(_Body):
    """What a bulk stop did with the runs it selected on its targets: `asked` (a stop
    opened for each now, its request written), `already_stopping` (a stop was open:
    its reason is the one asked now, as a single stop does, and its request written
    again), `not_running` (selected but not running: preparing or ended; no stop),
    `refused` (a target this producer may not act on, a job that reads no requests, a
    request that could not be reached: no stop left open). Run ids, each list in the
    order of the targets, newest run first within a target."""

    asked: tuple[str, ...] = ()
    already_stopping: tuple[str, ...] = ()
    not_running: tuple[str, ...] = ()
    refused: tuple[StopManyRefusal, ...] = ()


class RetrieveBody(_Body):
    """`runwarden.retrieve`: bring a finished run's artifacts into the artifact store
    now (again after a failure), verified against the target's manifest."""

    run_id: RunId
    force: bool = False
    """Try again even when the retrieval is done or was given up."""


class CancelBody(_Body):
    """`runwarden.cancel`: cancel the run's job now."""

    run_id: RunId


class ContinueBody(_Body):
    """`runwarden.continue`: launch the next run of a preempted run's chain."""

    run_id: RunId


class DoctorBody(_Body):
    """`runwarden.doctor`: check that the target has what runwarden needs, through the
    worker's own executor of it (its SSH keys, its change of user, its clock)."""

    target: TargetName


class TimeoutBody(_Body):
    """`runwarden.proof_timeout` / `runwarden.end_timeout`: a stop's countdown."""

    run_id: RunId
    stop_id: StopId
    reason: SnapshotReason | None = None
    """The stop's reason, for people (Flower shows it): never acted on."""


_WHAT: Final = {
    TASK_LAUNCH: "launch",
    TASK_FOLLOW: "follow",
    TASK_SNAPSHOT_REQUEST: "snapshot",
    TASK_CANCEL: "cancel",
    TASK_STOP_MANY: "bulk stop",
    TASK_PROOF_TIMEOUT: "proof deadline",
    TASK_END_TIMEOUT: "end deadline",
    TASK_RETRIEVE: "retrieve",
    TASK_CONTINUE: "continue after a preemption",
}


def describe(task: str, body: Any) -> str:
    """What a message of `task` with `body` does, for people, in one short line (its
    `kwargsrepr`, which Flower shows in place of the arguments, so a signature is never
    shown): `<run> · <what> · <reason> · <who asked>` with what the body has, e.g.
    `20261130-180713-deaf · proof deadline · cost`."""
    what = _WHAT.get(task, task.removeprefix("runwarden."))
    if not isinstance(body, dict):
        return what
    targets = body.get("targets")
    where = ",".join(str(t) for t in targets) if isinstance(targets, list) else ""
    parts = [str(body.get("run_id") or body.get("target") or where)[:64], what]
    for field in ("reason", "asked_by"):
        value = body.get(field)
        if isinstance(value, str) and value:
            parts.append(value[:64])
    return " · ".join(p for p in parts if p)
