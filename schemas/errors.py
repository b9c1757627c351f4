"""The error tree of runwarden: one root, [`RunwardenError`], for every error the
package raises on purpose, so a caller can catch one class. Library errors (Redis,
paramiko, OSError, pydantic) are translated at the edges with `raise ... from`, so the
cause stays visible.

    RunwardenError                       (schemas.errors)
    ├── SchemaError (ValueError)         input that does not fit a shape
    │   ├── InvalidRunId
    │   ├── InvalidPath
    │   ├── BadRequest                   a task body that does not fit its schema
    │   │   └── Unauthenticated          not signed by a known producer, or a target
    │   │                                not signed by the operator or older than
    │   │                                one seen (schemas.auth, schemas.target_sig)
    │   ├── SecretsError                 a secret cannot be read or written
    │   │                                (schemas.secrets)
    │   ├── BadForm                      a web form that is not a small urlencoded
    │   │                                form (producers.web.security)
    │   └── WebhookConfigError           RUNWARDEN_WEBHOOKS cannot be read or does
    │                                    not fit, or a webhook's secret cannot be
    │                                    read (schemas.webhooks)
    ├── RunError                         the run store and the operations on runs
    │   ├── StoreError                   Redis unreachable, refused, or a stored value
    │   │   │                            unreadable
    │   │   └── NotReplicated            a write no replica acknowledged in time
    │   │                                (Redis's WAIT; it may be lost in a failover)
    │   ├── NotFound                     no such run (run_id)
    │   ├── UnknownTarget                no such target (name)
    │   ├── NotStarted                   the run has no job yet (run_id)
    │   ├── NotRunning                   the run already ended (run_id, state)
    │   ├── NoSnapshots                  the run's job cannot save a snapshot (run_id)
    │   ├── NotResumable                 the run cannot be resumed (run_id, why)
    │   ├── Conflict                     a compare-and-set lost (run_id, state, wanted)
    │   ├── OperationFailed              a task failed or no worker answered
    │   │                                (producers.api)
    │   ├── NotServing                   nothing serves the embedded Redis
    │   │                                (producers.embedded)
    │   └── ServeError                   a part of the service cannot start
    │                                    (producers.service)
    ├── ExecError                        a target could not be reached or acted on
    │   │                                (workers.executors.errors)
    │   ├── IoError                      a local file could not be read or written
    │   ├── SpawnError                   a local program could not be started
    │   ├── CommandError                 a command on the target failed
    │   │   └── ScriptTimeout            a script passed its deadline (killed)
    │   ├── SshError                     the SSH connection failed or broke (kind)
    │   ├── InvalidSecret                a secret cannot be passed to the job
    │   ├── InvalidArgument              an argument cannot be used
    │   └── ProtocolError                the target answered something unexpected
    │       └── UnsafeArchive            an archive member would leave its destination
    ├── MissingExtra                     a part of runwarden is used without the
    │                                    optional packages it needs (extra, what,
    │                                    module): names the extra to install
    └── WorkerError                      a task of the workers failed (workers.errors)
        ├── ProducerNotAllowed           a producer the target does not allow
        ├── LaunchError                  a launch could not be carried out
        │   ├── SecretMissing            a secret the launch names is not set
        │   ├── SecretUnusable           a secret's value no job can receive
        │   └── NotAllowed               a secret or an upload its target forbids
        └── RetrievalError               artifacts not retrieved (retryable or not)
            ├── ArtifactMismatch         the download and the target's manifest differ
            ├── ArtifactQuotaExceeded    a quota or the disk reserve would be passed
            └── StoredArtifactsInvalid   a stored retrieval is missing or damaged

Each error's `args` are its constructor's arguments (its message is `str()`), so it
is rebuilt as itself by pickle and by Celery's JSON result backend (`cls(*args)`).

Pydantic's own `ValidationError` is raised by model validation, as pydantic
documents; the functions of this package that validate plain strings raise
[`SchemaError`] subclasses, and [`validation_message`] turns a `ValidationError` into
the one line a person reads. `NotStarted`, `NotRunning`, `NoSnapshots` and `NotFound`
keep the names of the tool the on-target protocol comes from (docs/protocol.md).
Every message is meant to be shown to a person as is.
"""

from __future__ import annotations

import importlib.util

from pydantic import ValidationError

__all__ = [
    "BadRequest",
    "Conflict",
    "InvalidPath",
    "InvalidRunId",
    "MissingExtra",
    "NoSnapshots",
    "NotFound",
    "NotReplicated",
    "NotResumable",
    "NotRunning",
    "NotStarted",
    "RunError",
    "RunwardenError",
    "SchemaError",
    "StoreError",
    "UnknownTarget",
    "require_extra",
    "validation_message",
]


class RunwardenError(Exception):
    """Root of every error runwarden raises on purpose (see the tree above)."""


class SchemaError(RunwardenError, ValueError):
    """Root of every error raised by `schemas` functions (not pydantic models)."""


class InvalidRunId(SchemaError):
    """A run id breaks the run-id rules of [`schemas.ids.validate_run_id`]."""


class BadRequest(SchemaError):
    """A task body (or another message from outside) does not fit its schema; the
    message says what is wrong, never the input's values."""


class InvalidPath(SchemaError):
    """A path is not acceptable where it is used: not absolute, not relative, holds a NUL
    byte, or would leave the directory it is relative to."""


class MissingExtra(RunwardenError):
    """A part of runwarden is used without the optional packages it needs (the web
    view, Flower, the workers' SSH client): the message names the extra that
    installs them, as `pip install 'runwarden[web]'`."""

    def __init__(self, extra: str, what: str, module: str) -> None:
        self.extra, self.what, self.module = extra, what, module
        super().__init__(extra, what, module)

    def __str__(self) -> str:
        return (
            f"{self.what} needs the {self.extra!r} extra ({self.module} is not installed): "
            f"pip install 'runwarden[{self.extra}]'"
        )


def require_extra(extra: str, what: str, *modules: str) -> None:
    """Checks, without importing them, that the top-level `modules` of the extra
    `extra` are installed, before the caller imports the code that needs them; `what`
    names that code for a person ("the web view (--web)").

    Raises:
        MissingExtra: naming the first module missing.
    """
    for module in modules:
        if importlib.util.find_spec(module) is None:
            raise MissingExtra(extra, what, module)


class RunError(RunwardenError):
    """Root of the run store's errors and of the refusals of run operations."""


class StoreError(RunError):
    """The run store failed: Redis is unreachable, timed out or refused a command, or a
    stored value is unreadable. The Redis exception (or validation error) is the
    `__cause__`. When Redis dropped mid-command, the operation may or may not have
    taken effect (see `store` on retrying)."""


class NotReplicated(StoreError):
    """A write a deadline depends on was done on the primary, but fewer replicas than
    `RUNWARDEN_REDIS_MIN_REPLICAS` acknowledged it within `RUNWARDEN_REDIS_WAIT_S`
    (Redis's `WAIT`): a failover may lose it, or keep it. Taken as a failed write:
    its caller tries again, and every write it may be retried with is a
    compare-and-set (docs/architecture.md, "Durability")."""


class NotFound(RunError):
    """There is no run with this id."""

    def __init__(self, run_id: str) -> None:
        self.run_id = run_id
        super().__init__(run_id)

    def __str__(self) -> str:
        return f"no run {self.run_id!r}"


class UnknownTarget(RunError):
    """There is no target with this name."""

    def __init__(self, name: str) -> None:
        self.name = name
        super().__init__(name)

    def __str__(self) -> str:
        return f"no target {self.name[:80]!r} (see `runwarden targets ls`)"


class NotStarted(RunError):
    """The run has no job yet: there is nothing to stop or follow."""

    def __init__(self, run_id: str) -> None:
        self.run_id = run_id
        super().__init__(run_id)

    def __str__(self) -> str:
        return f"run {self.run_id!r} has not started a job yet"


class NotRunning(RunError):
    """The run already ended (or is not running): it cannot be asked for a snapshot."""

    def __init__(self, run_id: str, state: str) -> None:
        self.run_id = run_id
        self.state = str(state)
        super().__init__(run_id, self.state)

    def __str__(self) -> str:
        return f"run {self.run_id!r} is not running (it is {self.state})"


class NoSnapshots(RunError):
    """The run's job does not read snapshot requests, so it cannot save one."""

    def __init__(self, run_id: str) -> None:
        self.run_id = run_id
        super().__init__(run_id)

    def __str__(self) -> str:
        return (
            f"run {self.run_id!r} cannot save a snapshot (its job does not read snapshot "
            "requests); cancel it instead"
        )


class NotResumable(RunError):
    """A run cannot be resumed: it is not stopped, or its checkpoint is not (or not
    intact) in the artifact store. `why` says which, for a person."""

    def __init__(self, run_id: str, why: str) -> None:
        self.run_id = run_id
        self.why = why
        super().__init__(run_id, why)

    def __str__(self) -> str:
        return f"run {self.run_id!r} cannot be resumed: {self.why}"


class Conflict(RunError):
    """A compare-and-set lost: the stored state is not the one the change needs (a
    run already ended differently, a state outside `expect`, or too many concurrent
    writers). Nothing was changed by the call that raised it.

    `run_id`, `state` (the stored state) and `wanted` (the state asked for) are set
    when the conflict is about a run's state, else None.
    """

    def __init__(
        self,
        message: str,
        *,
        run_id: str | None = None,
        state: str | None = None,
        wanted: str | None = None,
    ) -> None:
        self.run_id = run_id
        self.state = None if state is None else str(state)
        self.wanted = None if wanted is None else str(wanted)
        super().__init__(message)


def validation_message(error: ValidationError, what: str = "input") -> str:
    """`error` as one line for a person: each problem as `<location>: <message>`,
    joined with `; ` (`what` names the location of a problem with the whole value).
    Never holds the input's values: a rejected secret must not reach a log."""
    return "; ".join(
        f"{'.'.join(str(p) for p in e['loc']) or what}: {e['msg']}"
        for e in error.errors(include_input=False)
    )
