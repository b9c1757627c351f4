"""Every shape that crosses a process or a wire, as pydantic v2 models, and the pure
rules on them (a run's state changes, a stop's timeouts, the policies, the service's
health), the wire contract (`events.py`), the settings and the one error root
(`errors.py`).

`schemas` imports nothing of `store`, `workers` or `producers`; they all import it.
It talks to no Redis, no network and no process; only three modules touch the
machine: `secrets.py` (the files of the secrets directory), `settings.py` (the
`RUNWARDEN_*` environment variables and `$CREDENTIALS_DIRECTORY`) and `webhooks.py`
(the file `RUNWARDEN_WEBHOOKS` names).

The names below are loaded on first use (PEP 562): `import schemas` or
`from schemas.text import clean_text` costs nothing of the models it does not name, so
a command that needs one module does not pay for building every model.
"""

from __future__ import annotations

import importlib as _importlib
import typing as _typing

if _typing.TYPE_CHECKING:
    from .errors import (
        BadRequest,
        Conflict,
        InvalidPath,
        InvalidRunId,
        NoSnapshots,
        NotFound,
        NotResumable,
        NotRunning,
        NotStarted,
        RunError,
        RunwardenError,
        SchemaError,
        StoreError,
        UnknownTarget,
        validation_message,
    )
    from .ids import (
        MAX_PID,
        RUN_ID_MAX_LEN,
        Pid,
        RunId,
        check_pid,
        new_run_id,
        next_run_id,
        slugify,
        validate_run_id,
    )
    from .job import (
        Container,
        JobCommand,
        JobId,
        JobStatus,
        check_absolute_path,
        check_env_name,
        check_secret_name,
        check_secret_value,
    )
    from .paths import join_run_path, safe_relpath
    from .preemption import Preemption, PreemptionMode, RunNotice, WatchedCloud, WatcherState
    from .progress import Progress
    from .run import (
        TERMINAL_STATES,
        Artifacts,
        ArtifactsPhase,
        Outcome,
        RunLimits,
        RunRecord,
        RunState,
        decide_outcome,
    )
    from .settings import Settings
    from .snapshot import (
        END_TIMEOUT_S,
        PROOF_TIMEOUT_S,
        Proof,
        ProofInvalid,
        ProofNone,
        ProofSaved,
        Snapshot,
        SnapshotReason,
        expected_checkpoint,
        parse_proof,
    )
    from .stops import (
        STOP_ID_PATTERN,
        Deadline,
        DeadlineKind,
        StopId,
        StopPhase,
        StopState,
        UtcDatetime,
        new_stop_id,
    )
    from .targets import SshOptions, TargetConfig, TargetName, check_user_name

__all__ = [
    "END_TIMEOUT_S",
    "MAX_PID",
    "PROOF_TIMEOUT_S",
    "RUN_ID_MAX_LEN",
    "STOP_ID_PATTERN",
    "TERMINAL_STATES",
    "Artifacts",
    "ArtifactsPhase",
    "BadRequest",
    "Conflict",
    "Container",
    "Deadline",
    "DeadlineKind",
    "InvalidPath",
    "InvalidRunId",
    "JobCommand",
    "JobId",
    "JobStatus",
    "NoSnapshots",
    "NotFound",
    "NotResumable",
    "NotRunning",
    "NotStarted",
    "Outcome",
    "Pid",
    "Preemption",
    "PreemptionMode",
    "Progress",
    "Proof",
    "ProofInvalid",
    "ProofNone",
    "ProofSaved",
    "RunError",
    "RunId",
    "RunLimits",
    "RunNotice",
    "RunRecord",
    "RunState",
    "RunwardenError",
    "SchemaError",
    "Settings",
    "Snapshot",
    "SnapshotReason",
    "SshOptions",
    "StopId",
    "StopPhase",
    "StopState",
    "StoreError",
    "TargetConfig",
    "TargetName",
    "UnknownTarget",
    "UtcDatetime",
    "WatchedCloud",
    "WatcherState",
    "check_absolute_path",
    "check_env_name",
    "check_pid",
    "check_secret_name",
    "check_secret_value",
    "check_user_name",
    "decide_outcome",
    "expected_checkpoint",
    "join_run_path",
    "new_run_id",
    "new_stop_id",
    "next_run_id",
    "parse_proof",
    "safe_relpath",
    "slugify",
    "validate_run_id",
    "validation_message",
]

# Where each public name lives; tests/unit/schemas/test_lazy.py checks it matches the
# imports above.
_WHERE: _typing.Final[dict[str, str]] = {
    "BadRequest": "errors",
    "Conflict": "errors",
    "InvalidPath": "errors",
    "InvalidRunId": "errors",
    "NoSnapshots": "errors",
    "NotFound": "errors",
    "NotResumable": "errors",
    "NotRunning": "errors",
    "NotStarted": "errors",
    "RunError": "errors",
    "RunwardenError": "errors",
    "SchemaError": "errors",
    "StoreError": "errors",
    "UnknownTarget": "errors",
    "validation_message": "errors",
    "MAX_PID": "ids",
    "RUN_ID_MAX_LEN": "ids",
    "Pid": "ids",
    "RunId": "ids",
    "check_pid": "ids",
    "new_run_id": "ids",
    "next_run_id": "ids",
    "slugify": "ids",
    "validate_run_id": "ids",
    "Container": "job",
    "JobCommand": "job",
    "JobId": "job",
    "JobStatus": "job",
    "check_absolute_path": "job",
    "check_env_name": "job",
    "check_secret_name": "job",
    "check_secret_value": "job",
    "join_run_path": "paths",
    "safe_relpath": "paths",
    "Preemption": "preemption",
    "PreemptionMode": "preemption",
    "RunNotice": "preemption",
    "WatchedCloud": "preemption",
    "WatcherState": "preemption",
    "Progress": "progress",
    "TERMINAL_STATES": "run",
    "Artifacts": "run",
    "ArtifactsPhase": "run",
    "Outcome": "run",
    "RunLimits": "run",
    "RunRecord": "run",
    "RunState": "run",
    "decide_outcome": "run",
    "Settings": "settings",
    "END_TIMEOUT_S": "snapshot",
    "PROOF_TIMEOUT_S": "snapshot",
    "Proof": "snapshot",
    "ProofInvalid": "snapshot",
    "ProofNone": "snapshot",
    "ProofSaved": "snapshot",
    "Snapshot": "snapshot",
    "SnapshotReason": "snapshot",
    "expected_checkpoint": "snapshot",
    "parse_proof": "snapshot",
    "STOP_ID_PATTERN": "stops",
    "Deadline": "stops",
    "DeadlineKind": "stops",
    "StopId": "stops",
    "StopPhase": "stops",
    "StopState": "stops",
    "UtcDatetime": "stops",
    "new_stop_id": "stops",
    "SshOptions": "targets",
    "TargetConfig": "targets",
    "TargetName": "targets",
    "check_user_name": "targets",
}


def __getattr__(name: str) -> _typing.Any:
    """Imports the submodule that defines `name` on first use and caches the name."""
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(_importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_WHERE])
