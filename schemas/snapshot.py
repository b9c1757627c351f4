"""Snapshots: the request that asks a job for one, the proof the job leaves, and the
default limits of a stop (docs/protocol.md, "Snapshots").

Anyone who can write the run directory asks for a snapshot by writing
`snapshot.request` there, holding the reason. The job's plugin saves a checkpoint at
the end of its current step, stops, and writes `snapshot.json`, the proof.
"""

from __future__ import annotations

import json
import math
from datetime import UTC, datetime
from enum import StrEnum
from typing import Annotated, Final, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from .protocol import OUTPUT_DIR, SNAPSHOT_FILE

__all__ = [
    "END_TIMEOUT_S",
    "PROOF_TIMEOUT_S",
    "Proof",
    "ProofInvalid",
    "ProofNone",
    "ProofSaved",
    "Snapshot",
    "SnapshotReason",
    "expected_checkpoint",
    "parse_proof",
    "proof_moment",
]

PROOF_TIMEOUT_S: Final = 30 * 60.0
"""How long a stop waits for the proof before it cancels the job, in seconds: a job
that neither wrote it nor ended by then will not."""
END_TIMEOUT_S: Final = 10 * 60.0
"""How long a job that proved may take to end before it is cancelled, in seconds: its
checkpoint is saved, what is left is the final save of the model."""

_U64_MAX: Final = 2**64 - 1
# Rust's `u8::is_ascii_whitespace`: no vertical tab, unlike `bytes.isspace`.
_ASCII_WHITESPACE: Final = frozenset(b" \t\n\r\x0c")


class SnapshotReason(StrEnum):
    """Why a snapshot was taken; the lowercase name is what the request and the proof
    hold."""

    REQUESTED = "requested"
    """Asked for by a person or a service (`runwarden stop`)."""
    DEADLINE = "deadline"
    """The run's `max_hours` was near."""
    COST = "cost"
    """The run's spending cap (`max_cost_usd`) was near."""
    DISK = "disk"
    """The target's disk was nearly full."""
    PREEMPTED = "preempted"
    """The job was told it is about to be ended from outside (a preemption or shutdown
    signal such as SIGTERM or SIGUSR1, turned into a request at the job's next step
    end by `runwarden_job.install_preemption_signals`). A reader that does not know
    this reason (an older job side or tool) reads it as `requested`."""

    @classmethod
    def parse(cls, text: str | bytes | None) -> SnapshotReason:
        """The reason `text` names, surrounding whitespace ignored; any other text, or
        none, is [`SnapshotReason.REQUESTED`]. Never raises: a request file is
        written by anyone, and any request is a request."""
        if isinstance(text, bytes):
            text = text.decode("utf-8", "replace")
        name = (text or "").strip()
        try:
            return cls(name)
        except ValueError:
            return cls.REQUESTED


def expected_checkpoint(step: int) -> str:
    """The only checkpoint a proof may name for a snapshot at `step`: where the trainer
    saves it, `output/checkpoint-<step>`."""
    return f"{OUTPUT_DIR}/checkpoint-{step}"


class Snapshot(BaseModel):
    """The snapshot of a stopped run: its checkpoint, relative to the run directory,
    which is always exactly `output/checkpoint-<step>`."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    checkpoint: str
    step: Annotated[int, Field(strict=True, ge=0, le=_U64_MAX)]
    reason: SnapshotReason

    @model_validator(mode="after")
    def _checkpoint(self) -> Snapshot:
        if self.checkpoint != expected_checkpoint(self.step):
            raise ValueError(f"{SNAPSHOT_FILE} names an invalid checkpoint path")
        return self


class ProofNone(BaseModel):
    """No proof: the job was not stopped with a snapshot (missing or blank file)."""

    model_config = ConfigDict(frozen=True)
    kind: Literal["none"] = "none"


class ProofSaved(BaseModel):
    """A snapshot was saved."""

    model_config = ConfigDict(frozen=True)
    kind: Literal["saved"] = "saved"
    snapshot: Snapshot
    time: float | None = None
    """When the job says it wrote the proof (its `time`: seconds since the epoch, on
    the target's clock); None when the proof holds no finite number there. Never
    trusted alone: [`proof_moment`] bounds it by when runwarden asked and saw."""


class ProofInvalid(BaseModel):
    """The file exists but cannot be used; `why` says why, for a person."""

    model_config = ConfigDict(frozen=True)
    kind: Literal["invalid"] = "invalid"
    why: str


Proof = Annotated[ProofNone | ProofSaved | ProofInvalid, Field(discriminator="kind")]
"""What a run directory's `snapshot.json` says."""


class _NotStrictJson(ValueError):
    """JSON that Python accepts but serde_json (overbrainer's parser) refuses."""


def _reject_constant(name: str) -> object:
    raise _NotStrictJson(f"{name} is not JSON")


def _unique_keys(pairs: list[tuple[str, object]]) -> dict[str, object]:
    result = dict(pairs)
    if len(result) != len(pairs):
        raise _NotStrictJson("a key is repeated")
    return result


def parse_proof(content: bytes) -> ProofNone | ProofSaved | ProofInvalid:
    """Reads the proof `content` of a `snapshot.json` (at most its first 64 KiB, as
    read from the target). Never raises, whatever the bytes.

    - Empty or ASCII-whitespace-only content is no proof.
    - Content that is not one JSON object with a string `checkpoint` and a
      non-negative integer `step` (below 2**64) is invalid; a JSON syntax error says
      its line and column. `reason`, when present, is a string or null; `time`,
      when a finite number, is kept (`ProofSaved.time`), else ignored, as are other
      fields. JSON that serde_json would refuse (NaN, Infinity,
      repeated keys, lone surrogate escapes) is invalid here too.
    - The checkpoint must be exactly `output/checkpoint-<step>`: it names local
      directories later, so nothing else (absolute, `..`, `.`, doubled slashes,
      another step) is accepted.
    - An unknown or missing reason reads as `requested`.
    """
    if all(byte in _ASCII_WHITESPACE for byte in content):
        return ProofNone()
    try:
        text = content.decode("utf-8")
    except UnicodeDecodeError as error:
        return ProofInvalid(why=f"{SNAPSHOT_FILE} is not UTF-8 (byte {error.start})")
    try:
        written = json.loads(
            text, parse_constant=_reject_constant, object_pairs_hook=_unique_keys
        )
        # serde_json refuses lone surrogate escapes anywhere; so does the UTF-8 codec.
        json.dumps(written, ensure_ascii=False).encode("utf-8")
    except _NotStrictJson as error:
        return ProofInvalid(why=f"{SNAPSHOT_FILE} is not valid ({error})")
    except UnicodeEncodeError:
        return ProofInvalid(why=f"{SNAPSHOT_FILE} is not valid (a lone surrogate escape)")
    except json.JSONDecodeError as error:
        return ProofInvalid(
            why=f"{SNAPSHOT_FILE} is not valid (line {error.lineno}, column {error.colno})"
        )
    except (RecursionError, ValueError):
        # Nesting deeper than the parser's stack, or an integer past Python's digit
        # limit: no valid proof looks like either.
        return ProofInvalid(why=f"{SNAPSHOT_FILE} is not valid (too deeply nested or too large)")
    if not isinstance(written, dict):
        return ProofInvalid(why=f"{SNAPSHOT_FILE} is not a JSON object")
    checkpoint, step = written.get("checkpoint"), written.get("step")
    if not isinstance(checkpoint, str):
        return ProofInvalid(why=f"{SNAPSHOT_FILE} has no checkpoint string")
    if isinstance(step, bool) or not isinstance(step, int) or not 0 <= step <= _U64_MAX:
        return ProofInvalid(why=f"{SNAPSHOT_FILE} has no valid step")
    reason = written.get("reason")
    if reason is not None and not isinstance(reason, str):
        return ProofInvalid(why=f"{SNAPSHOT_FILE} has a reason that is not a string")
    if checkpoint != expected_checkpoint(step):
        return ProofInvalid(why=f"{SNAPSHOT_FILE} names an invalid checkpoint path")
    return ProofSaved(
        snapshot=Snapshot(
            checkpoint=checkpoint, step=step, reason=SnapshotReason.parse(reason)
        ),
        time=_written_time(written.get("time")),
    )


def _written_time(stamp: object) -> float | None:
    """A proof's `time` when it is a finite number (an integer within a float's
    range), else None: a bad time never makes a proof invalid."""
    if isinstance(stamp, bool) or not isinstance(stamp, int | float):
        return None
    try:
        at = float(stamp)
    except OverflowError:
        return None
    return at if math.isfinite(at) else None


def proof_moment(written: float | None, asked_at: datetime, seen_at: datetime) -> datetime:
    """When a proof counts as written, for its stop's end deadline, the ledger and the
    proof latency: the proof's own `time` (`written`, seconds since the epoch, as
    the job put it), never before the stop was asked (`asked_at`) and never after
    the proof was first seen (`seen_at`); `seen_at` when `written` is None or not
    finite. So a job's clock, or its lie, moves the moment only within the window
    in which the proof really came. Both bounds are timezone-aware; so is the
    result (UTC)."""
    low, high = asked_at.astimezone(UTC), seen_at.astimezone(UTC)
    if high <= low:
        return low  # seen "before" it was asked (workers' clocks disagree): no earlier
    if written is None or not math.isfinite(written):
        return high
    if written <= low.timestamp():
        return low
    if written >= high.timestamp():
        return high
    return datetime.fromtimestamp(written, UTC)
