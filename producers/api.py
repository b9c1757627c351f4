"""The typed Python API of producers: publish events by task name (JSON only) and
read runs and stops from the run store. It never imports `workers`: any service
with `celery` and `redis` installed can use it, or publish the same task names
itself (`app.send_task("runwarden.snapshot_request", kwargs={"body": {...}})`).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Final

from pydantic import BaseModel, SecretStr

from schemas import (
    Artifacts,
    NotFound,
    NotResumable,
    RunError,
    RunRecord,
    Settings,
    SnapshotReason,
    StopState,
    TargetConfig,
)
from schemas.auth import (
    OPERATOR,
    new_task_id,
    sign,
)
from schemas.budget import StopBudget, stop_budget
from schemas.chain import MAX_CHAIN
from schemas.doctor import DoctorReport
from schemas.events import (
    TASK_CANCEL,
    TASK_DOCTOR,
    TASK_FOLLOW,
    TASK_LAUNCH,
    TASK_RETRIEVE,
    TASK_SNAPSHOT_REQUEST,
    TASK_STOP_MANY,
    CancelBody,
    DoctorBody,
    FollowBody,
    LaunchSpec,
    RetrieveBody,
    SnapshotRequestBody,
    StopManyBody,
    StopManySummary,
    describe,
    resume_spec,
    wire_config,
)
from schemas.health_report import LATE_AFTER_S, HealthReport
from schemas.idempotency import new_launch_key
from schemas.ledger import LedgerEvent
from schemas.run import ADOPTED_COMMAND, check_cancel, check_resumable, check_snapshot_request
from schemas.secrets import SecretsError, producer_key_file, producer_redis_password_file
from store import RunStore

from .defaults import DOCTOR_WAIT_S
from .health import read_health
from .target_records import TargetRecords

if TYPE_CHECKING:
    from celery import Celery

    from .redis_users import AddedUser, RemovedUser

__all__ = ["OperationFailed", "Runwarden", "producer_app"]

DEFAULT_WAIT_S: Final = 120.0


class OperationFailed(RunError):
    """A task ran and failed, or no worker answered in time; the message says which
    and why (the worker's own error message)."""


def producer_app(settings: Settings) -> Celery:
    """A Celery app that only publishes, with the workers' wire contract
    (`schemas.events.wire_config`): JSON only, the same broker, result backend,
    visibility timeout, queues and routes."""
    # Imported here: a command that only reads the store never loads Celery.
    from celery import Celery  # noqa: PLC0415

    app = Celery("runwarden-producer")
    app.conf.update(wire_config(settings))
    return app


class Runwarden:
    """One client of the service. The constructor stores; connections open on first
    use and are shared by threads."""

    def __init__(self, settings: Settings | None = None) -> None:
        self.settings = settings or Settings()
        self._lock = threading.Lock()
        self._app: Celery | None = None
        self._store: RunStore | None = None

    @property
    def app(self) -> Celery:
        with self._lock:
            if self._app is None:
                self._app = producer_app(self.settings)
            return self._app

    @property
    def store(self) -> RunStore:
        with self._lock:
            if self._store is None:
                self._store = RunStore.from_settings(self.settings)
            return self._store

    def _key(self, producer: str) -> SecretStr:
        key = self.settings.secrets.read(producer_key_file(producer))
        if key is None:
            raise SecretsError(
                f"no key for producer {producer!r} in {self.settings.secrets.path}: "
                "the operator creates one with `runwarden producers add`"
            )
        return key

    def _call(self, task: str, body: BaseModel, wait_s: float | None) -> Any:
        """Publishes `task` with `body`, signed by this client's producer; with
        `wait_s`, waits for its result."""
        from celery.exceptions import TimeoutError as CeleryTimeout  # noqa: PLC0415

        data = body.model_dump(mode="json")
        producer = self.settings.producer
        task_id = new_task_id()
        auth = sign(task, data, producer, self._key(producer), at=time.time(), task_id=task_id)
        result = self.app.send_task(
            task,
            kwargs={"body": data, "auth": auth},
            task_id=task_id,
            kwargsrepr=describe(task, data),
        )
        if wait_s is None:
            return {"task_id": result.id}
        try:
            return result.get(timeout=wait_s, propagate=True)
        except CeleryTimeout as error:
            raise OperationFailed(
                f"{task}: no worker answered within {wait_s:g} s (is `runwarden serve` running?)"
            ) from error
        except RunError:
            raise
        except Exception as error:
            raise OperationFailed(f"{task} failed: {error}") from error
        finally:
            result.forget()

    # --- publishing -----------------------------------------------------------------

    def launch(self, spec: LaunchSpec, wait_s: float = DEFAULT_WAIT_S) -> RunRecord:
        """Launches `spec`; returns the run once running.

        The launch is exactly once for its idempotency key `spec.key`; a spec without
        one gets a random one here. Launching the same spec with the same key again
        (after a timeout, from another process) starts nothing new: it returns the
        run that key started (as it stands: running, ended, or still `preparing`
        while its first launch is at work).

        Raises:
            UnknownTarget: when the target does not exist.
            OperationFailed: when the launch failed (the worker's message).
        """
        self.store.targets.get(spec.target)
        if spec.resume_from is not None:
            check_resumable(self.store.runs.get(spec.resume_from))
        if spec.key is None:
            spec = spec.model_copy(update={"key": new_launch_key()})
        answer = self._call(TASK_LAUNCH, spec, wait_s)
        return self.store.runs.get(answer["run_id"])

    def resume_spec(
        self, run_id: str, *, target: str | None = None, command: str | None = None
    ) -> LaunchSpec:
        """The launch that continues the stopped run `run_id`: its target and command
        unless overridden, and every per-run launch setting (upload, skip list, secret
        names, limits, stop timeouts, name, on-preempt plan, its own `--preemption`,
        `--wait-for-all`:
        `schemas.events.resume_spec`), with `resume_from` set. A continuation of a
        preempted run launches the same.

        Raises:
            NotFound, NotResumable.
        """
        run = self.store.runs.get(run_id)
        check_resumable(run)
        if command is None and run.command == ADOPTED_COMMAND:
            raise NotResumable(run_id, "it was adopted: its command is unknown; give one")
        return resume_spec(run, target=target, command=command)

    def retrieve(self, run_id: str, *, force: bool = True, wait_s: float | None = None) -> Any:
        """Asks for the retrieval of the ended run's artifacts now (again after a
        failure, with `force`). With `wait_s`, waits for it and returns the recorded
        `Artifacts`; else returns at once.

        Raises:
            NotFound, OperationFailed.
        """
        self.store.runs.get(run_id)
        answer = self._call(TASK_RETRIEVE, RetrieveBody(run_id=run_id, force=force), wait_s)
        if wait_s is None:
            return answer
        return Artifacts.model_validate(answer)

    def stop(
        self,
        run_id: str,
        reason: SnapshotReason = SnapshotReason.REQUESTED,
        asked_by: str = "api",
        wait_s: float = 30.0,
    ) -> StopState:
        """Asks the run's job for a snapshot; returns the stop (its phase, deadlines).
        Checked here first, so a bad request fails fast, and again by the worker.

        Raises:
            NotFound, NotStarted, NotRunning, NoSnapshots, OperationFailed.
        """
        check_snapshot_request(self.store.runs.get(run_id))
        body = SnapshotRequestBody(run_id=run_id, reason=reason, asked_by=asked_by)
        return StopState.model_validate(self._call(TASK_SNAPSHOT_REQUEST, body, wait_s))

    def stop_many(
        self,
        targets: str | Sequence[str],
        *,
        all: bool = False,
        labels: Mapping[str, str] | None = None,
        name_glob: str | None = None,
        reason: SnapshotReason = SnapshotReason.REQUESTED,
        asked_by: str = "api",
        wait_s: float = 60.0,
    ) -> StopManySummary:
        """Asks a snapshot of every running run of `targets` that the selection picks:
        `all`, or the runs carrying every label of `labels` and whose name matches
        `name_glob` (`fnmatch`), both when both are given. One task
        (`runwarden.stop_many`); each selected run's stop is opened as `stop` opens
        one, the request files written by one script per target. Returns the summary:
        `asked`, `already_stopping`, `not_running`, `refused` (with why: a target
        this producer may not act on, a job that reads no requests, a target out of
        reach). The selection and the targets are checked here first, before
        anything is published, and again by the worker.

        Raises:
            ValidationError: a selection that does not fit (no selector, a bad label
                or glob, no target); UnknownTarget; OperationFailed.
        """
        names = (targets,) if isinstance(targets, str) else tuple(targets)
        body = StopManyBody(
            targets=names,
            all=all,
            labels=dict(labels or {}),
            name_glob=name_glob,
            reason=reason,
            asked_by=asked_by,
        )
        for name in body.targets:
            self.store.targets.get(name)
        return StopManySummary.model_validate(self._call(TASK_STOP_MANY, body, wait_s))

    def cancel(self, run_id: str, wait_s: float = 90.0) -> RunRecord:
        """Cancels the run's job now; returns the recorded run.

        Raises:
            NotFound, NotStarted, NotRunning, OperationFailed.
        """
        check_cancel(self.store.runs.get(run_id))
        self._call(TASK_CANCEL, CancelBody(run_id=run_id), wait_s)
        return self.store.runs.get(run_id)

    def follow(
        self,
        run_id: str | None = None,
        *,
        target: str | None = None,
        dir: str | None = None,
        wait_s: float = 30.0,
    ) -> RunRecord:
        """Follows a run again, or adopts a run directory started elsewhere."""
        answer = self._call(TASK_FOLLOW, FollowBody(run_id=run_id, target=target, dir=dir), wait_s)
        return self.store.runs.get(answer["run_id"])

    def doctor(self, target: str, wait_s: float = DOCTOR_WAIT_S) -> DoctorReport:
        """Checks that `target` has what runwarden needs, as a worker sees it (the
        `runwarden.doctor` task: `workers/doctor.py` says why a worker and not this
        process): each check's status, what was found and what does not work
        without it, and the target's clock against the worker's.

        Raises:
            UnknownTarget: when the target does not exist.
            OperationFailed: when no worker answered in time, or the task failed.
        """
        self.store.targets.get(target)
        answer = self._call(TASK_DOCTOR, DoctorBody(target=target), wait_s)
        return DoctorReport.model_validate(answer)

    # --- reading --------------------------------------------------------------------

    def get_run(self, run_id: str) -> RunRecord:
        return self.store.runs.get(run_id)

    def list_runs(self, target: str | None = None) -> list[RunRecord]:
        return self.store.runs.find(target=target)

    def chain(self, run_id: str) -> list[RunRecord]:
        """The chain of runs `run_id` belongs to, oldest first: the runs it resumes
        (`resumed_from`, back to the first), itself, and the runs that continued it
        after a preemption (`continuation`, as far as they are launched). At most
        `schemas.chain.MAX_CHAIN` runs; a run whose record is gone ends the walk.

        Raises:
            NotFound: no run `run_id`.
        """
        run = self.store.runs.get(run_id)
        back: list[RunRecord] = []
        seen = {run.id}
        current = run
        while current.resumed_from is not None and len(seen) < MAX_CHAIN:
            if current.resumed_from in seen:
                break
            try:
                current = self.store.runs.get(current.resumed_from)
            except NotFound:
                break
            seen.add(current.id)
            back.append(current)
        chain = [*reversed(back), run]
        current = run
        while len(seen) < MAX_CHAIN:
            done = current.continuation
            if done is None or done.key is None:
                break
            next_id = self.store.launches.launch(done.key)
            if next_id is None or next_id in seen:
                break
            try:
                current = self.store.runs.get(next_id)
            except NotFound:
                break
            seen.add(current.id)
            chain.append(current)
        return chain

    def get_stop(self, run_id: str) -> StopState | None:
        return self.store.stops.get(run_id)

    def list_stops(self) -> list[StopState]:
        return self.store.stops.in_progress()

    def next_stop_budget(self, run: RunRecord) -> tuple[StopBudget, str]:
        """The timeouts the next stop of `run` would get, decided as a worker decides
        them (`schemas.budget.stop_budget`: the run's own timeouts, else learned from
        its saves, else the default), by the rule of the workers' settings: the one
        the newest worker published at its start (`RunStore.budgets.rules`), else this
        client's own. With it, where the rule came from, for people.

        Raises:
            StoreError.
        """
        saves = self.store.budgets.learned(run)
        published = self.store.budgets.rules()
        if published:
            rule, where = published[0].rule, f"the workers' settings ({published[0].worker})"
        else:
            rule = self.settings.budget_rule
            where = "this client's settings: no worker has published its own"
        return stop_budget(run.timeouts, saves, rule), where

    def ledger(self, run_id: str) -> list[LedgerEvent]:
        """The stop ledger of run `run_id`, oldest first (the order recorded): its
        stops, cancels, policy decisions, end and retrievals (`schemas.ledger`).

        Raises:
            NotFound, StoreError.
        """
        self.store.runs.get(run_id)
        return self.store.ledger.events(run_id)

    def ledger_history(self, run_id: str | None = None, limit: int = 500) -> list[LedgerEvent]:
        """The newest `limit` ledger events of run `run_id`, or of every run, newest
        first.

        Raises:
            NotFound (for a run that does not exist), StoreError.
        """
        if run_id is not None:
            self.store.runs.get(run_id)
        return self.store.ledger.history(run_id, limit)

    def webhook_failures(self, limit: int = 100) -> list[dict[str, Any]]:
        """The webhook deliveries given up, newest first (webhook, run, event id and
        kind, attempts, last error, when)."""
        return self.store.webhooks.failures(limit)

    def health(self, late_after_s: float = LATE_AFTER_S) -> HealthReport:
        """The service's health, as `runwarden status` shows it
        (`producers.health.read_health`): bounded in time, never raises for a Redis
        that is down (the report says so)."""
        return read_health(self.settings, late_after_s=late_after_s)

    # --- producers' Redis users -------------------------------------------------------

    def add_producer_user(self, name: str) -> AddedUser:
        """Creates (or updates) producer `name`'s Redis user (`store/acl.py`: it can
        publish the public tasks and read their results, nothing else) on every data
        server (the primary, and behind Sentinel each replica the sentinels list:
        `producers.redis_users`), with a password made once in this machine's secrets
        directory (`schemas.secrets.producer_redis_password_file`), through this
        client's user, which must be allowed `ACL` (the operator's). Returns the user,
        the password file (the producer's `redis-password`), whether it outlives a
        restart of the servers (always for the embedded server, whose configuration
        `runwarden serve` writes with every producer's user at each start; for
        another, when it has an ACL file: `ACL SAVE`), the servers written and the
        replicas missed with the reason (down, unreachable, refused: adding again
        writes them once they are back).

        Raises:
            SecretsError: an invalid name, or the password cannot be written.
            StoreError: the primary refused (no ACL rights) or cannot be reached.
        """
        from .redis_users import add_user  # noqa: PLC0415

        file_name = producer_redis_password_file(name)
        password, _ = self.settings.secrets.ensure(file_name)
        where = self.settings.secrets.path / file_name
        embedded = self.settings.redis_url is None
        return add_user(self.store.client, name, password, where, embedded=embedded)

    def remove_producer_user(self, name: str) -> RemovedUser:
        """Deletes producer `name`'s Redis user on every data server, as
        [`add_producer_user`] writes it (the servers close its connections), then its
        password file. Returns whether it existed on a server written, the servers
        written and the replicas missed with the reason (removing again deletes it
        there once they are back).

        Raises:
            SecretsError: an invalid name.
            StoreError: the primary refused or cannot be reached (the password file
                is then kept).
        """
        from .redis_users import remove_user  # noqa: PLC0415

        removed = remove_user(self.store.client, name)
        self.settings.secrets.remove(producer_redis_password_file(name))
        return removed

    # --- targets: signed records (`producers.target_records`) ------------------------

    @property
    def targets(self) -> TargetRecords:
        """The service's target records, signed with the operator's key."""
        return TargetRecords(self.settings, self.store)

    def resign_targets(self) -> list[str]:
        """As [`TargetRecords.resign`], with this client's operator key."""
        return self.targets.resign(self._key(OPERATOR))

    def add_target(self, config: TargetConfig) -> None:
        """As [`TargetRecords.add`]."""
        self.targets.add(config)

    def list_targets(self) -> list[TargetConfig]:
        """As [`TargetRecords.configs`]."""
        return self.targets.configs()

    def verified_targets(self) -> dict[str, bool | None]:
        """As [`TargetRecords.verified`]."""
        return self.targets.verified()

    def remove_target(self, name: str) -> bool:
        """As [`TargetRecords.remove`]."""
        return self.targets.remove(name)
