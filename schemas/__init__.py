"""Every shape that crosses a process or a wire, as pydantic v2 models.

`schemas` imports neither `producers` nor `workers`; both import it.
"""

from __future__ import annotations

from .errors import InvalidPath, InvalidRunId, SchemaError
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
    check_secret_value,
)
from .paths import join_run_path, safe_relpath
from .run import TERMINAL_STATES, Outcome, RunLimits, RunRecord, RunState, decide_outcome
from .settings import Settings
from .snapshot import (
    END_TIMEOUT_S,
    PROOF_TIMEOUT_S,
    REQUEST_POLL_S,
    STOP_LIMITS,
    Proof,
    ProofInvalid,
    ProofNone,
    ProofSaved,
    Snapshot,
    SnapshotReason,
    StopLimits,
    expected_checkpoint,
    parse_proof,
)

__all__ = [
    "END_TIMEOUT_S",
    "MAX_PID",
    "PROOF_TIMEOUT_S",
    "REQUEST_POLL_S",
    "RUN_ID_MAX_LEN",
    "STOP_LIMITS",
    "TERMINAL_STATES",
    "Container",
    "InvalidPath",
    "InvalidRunId",
    "JobCommand",
    "JobId",
    "JobStatus",
    "Outcome",
    "Pid",
    "Proof",
    "ProofInvalid",
    "ProofNone",
    "ProofSaved",
    "RunId",
    "RunLimits",
    "RunRecord",
    "RunState",
    "SchemaError",
    "Settings",
    "Snapshot",
    "SnapshotReason",
    "StopLimits",
    "check_absolute_path",
    "check_env_name",
    "check_pid",
    "check_secret_value",
    "decide_outcome",
    "expected_checkpoint",
    "join_run_path",
    "new_run_id",
    "next_run_id",
    "parse_proof",
    "safe_relpath",
    "slugify",
    "validate_run_id",
]
