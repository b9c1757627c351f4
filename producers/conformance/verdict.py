"""The checks of `runwarden check-trainer`, judged from what was observed of one run
and its resume ([`Observation`], filled by `conformance.session`). Pure: no I/O.

The checks, in order (docs/job-side.md, "Checking a training script"):

- `started`: the job logged the warm-up's steps (`log` metrics lines) and was running
  when the snapshot was asked.
- `proof`: a proof (`snapshot.json`) came within the proof timeout of the request;
  measured: seconds from the request file to the proof.
- `lag`: steps run after the request: the proof's step minus the last step logged
  before the request file appeared; at most `max_lag`. A stop at the end of the step
  in progress gives 0 or 1, or 2 where a step's `log` line is written after the
  request was looked for (the Hugging Face Trainer logs after its step-end
  callbacks); a loop that looks every N steps gives up to N.
- `checkpoint`: complete before the proof: the directory the proof names exists,
  no file in it is newer than the proof (to the file system's clock tick), nothing
  in it changed after the proof, and it loads when its framework is known (`conformance.loadcheck`).
- `ranks`: every rank reported stopping (`runwarden_job.report_stop`) at the proof's
  step; one rank without a report is judged by the proof alone.
- `end`: the job exited on its own, with 0, within the end timeout of the proof;
  measured: seconds from the proof to the exit.
- `resume`: the run resumed from the checkpoint continues the step count: its first
  logged step is after the checkpoint's, by no more than the first run logged steps
  apart (and its `begin` line's `first_step`, the first step it runs, when there is
  one, is the one after the checkpoint's).

A check that cannot be judged because an earlier one failed fails too, saying so.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any, Final

from .observe import Listing

__all__ = ["CHECKS", "Check", "Loaded", "Observation", "Resumed", "judge"]

CHECKS: Final = ("started", "proof", "lag", "checkpoint", "ranks", "end", "resume")


@dataclass(frozen=True)
class Check:
    """One check's outcome, for people and for `--json`."""

    name: str
    passed: bool
    value: str
    """What was measured ("1.84 s", "1 step"), or "-"."""
    detail: str


@dataclass(frozen=True)
class Loaded:
    """What `conformance.loadcheck` made of a checkpoint."""

    framework: str | None
    """`torch`, `safetensors`, `lightning`, `hugging-face`... None: no file it knows."""
    files: int = 0
    """Files it loaded."""
    error: str | None = None


@dataclass(frozen=True)
class Resumed:
    """What was seen of the run resumed from the checkpoint."""

    first_step: int | None = None
    """Its first logged step, None: none within the start timeout."""
    begin_first_step: int | None = None
    """`first_step` of its `begin` line, when it wrote one with it."""
    error: str | None = None
    """Why it could not be resumed or followed."""


@dataclass
class Observation:
    """Everything one check of a training command saw (times are unix seconds)."""

    ranks: int
    warmup_steps: int
    proof_timeout_s: float
    end_timeout_s: float
    max_lag: int
    start_error: str | None = None
    """Why the warm-up was not reached; None: it was."""
    asked_at: float | None = None
    request_at: float | None = None
    """When the request file appeared on the target (its mtime), else None."""
    steps: list[tuple[int, float]] = field(default_factory=list)
    proof: dict[str, Any] | None = None
    proof_ns: int | None = None
    """The proof's mtime, in the file system's nanoseconds (the checkpoint's files'
    are compared with it exactly)."""
    state: str = ""
    message: str | None = None
    checkpoint_found: bool = False
    at_proof: Listing | None = None
    """The checkpoint's files when the proof was first seen."""
    final: Listing = field(default_factory=dict)
    whole: bool = True
    loaded: Loaded | None = None
    reports: dict[int, dict[str, Any]] = field(default_factory=dict)
    exit_code: int | None = None
    exit_at: float | None = None
    cancelled: bool = False
    """runwarden cancelled the job (its `cancelling` file)."""
    resumed: Resumed | None = None


def _files(count: int) -> str:
    return f"{count} file" if count == 1 else f"{count} files"


def _loads(count: int) -> str:
    return "1 file loads" if count == 1 else f"{count} files load"


def _s(seconds: float) -> str:
    return f"{seconds:.2f} s"


def _proof_at(o: Observation) -> float | None:
    return None if o.proof_ns is None else o.proof_ns / 1e9


def _proof_step(o: Observation) -> int | None:
    step = None if o.proof is None else o.proof.get("step")
    return step if isinstance(step, int) and not isinstance(step, bool) else None


def _started(o: Observation) -> Check:
    if o.start_error is not None:
        return Check("started", False, "-", o.start_error)
    last = o.steps[-1][0] if o.steps else None
    return Check("started", True, f"step {last}", f"warm-up of {o.warmup_steps} steps logged")


def _proof(o: Observation) -> Check:
    step, proved = _proof_step(o), _proof_at(o)
    if o.proof is None or step is None or proved is None:
        why = f"no proof within the proof timeout ({o.proof_timeout_s:g} s)"
        return Check("proof", False, "-", f"{why}; the run ended {o.state or 'unknown'}")
    start = o.request_at if o.request_at is not None else o.asked_at
    took = proved - (start if start is not None else proved)
    ok = took <= o.proof_timeout_s
    detail = f"proof at step {step} naming {o.proof.get('checkpoint')}"
    if not ok:
        detail += f"; later than the proof timeout ({o.proof_timeout_s:g} s)"
    return Check("proof", ok, _s(took), detail)


def _lag(o: Observation) -> Check:
    step = _proof_step(o)
    if step is None:
        return Check("lag", False, "-", "no proof: no stop step")
    start = o.request_at if o.request_at is not None else o.asked_at
    before = [s for s, t in o.steps if start is not None and t <= start]
    if not before:
        return Check("lag", False, "-", "no step was logged before the request")
    lag = step - max(before)
    unit = "step" if abs(lag) == 1 else "steps"
    detail = f"last step logged before the request {max(before)}, stopped at {step}"
    if lag < 0:
        return Check("lag", False, f"{lag} {unit}", detail + ": the proof names an older step")
    ok = lag <= o.max_lag
    if not ok:
        detail += f"; more than {o.max_lag} (--max-lag)"
    return Check("lag", ok, f"{lag} {unit}", detail)


def _checkpoint(o: Observation) -> Check:
    if o.proof is None or _proof_at(o) is None:
        return Check("checkpoint", False, "-", "no proof: nothing to check")
    if not o.checkpoint_found:
        return Check("checkpoint", False, "-", f"{o.proof.get('checkpoint')} is not a directory")
    count = _files(len(o.final))
    if not o.final:
        return Check("checkpoint", False, count, "the checkpoint is empty")
    # Strictly newer: a file of the proof's own clock tick cannot be told apart.
    newer = sorted(p for p, (_, m) in o.final.items() if m > (o.proof_ns or 0))
    if newer:
        return Check("checkpoint", False, count, f"written after the proof: {', '.join(newer[:3])}")
    if o.at_proof is not None and o.at_proof != o.final:
        changed = sorted(set(o.at_proof.items()) ^ set(o.final.items()))
        names = ", ".join(sorted({p for p, _ in changed})[:3])
        return Check("checkpoint", False, count, f"changed after the proof: {names}")
    if not o.whole:
        return Check("checkpoint", False, count, "too many files to check")
    loaded = o.loaded
    if loaded is not None and loaded.error is not None:
        return Check("checkpoint", False, count, f"does not load: {loaded.error}")
    if loaded is None or loaded.framework is None:
        detail = "complete before the proof (no file format known to load)"
        return Check("checkpoint", True, count, detail)
    return Check(
        "checkpoint", True, count,
        f"complete before the proof; {_loads(loaded.files)} ({loaded.framework})",
    )  # fmt: skip


def _ranks(o: Observation) -> Check:
    step = _proof_step(o)
    if step is None:
        return Check("ranks", False, "-", "no proof: no stop step")
    steps = {rank: report["step"] for rank, report in o.reports.items()}
    if o.ranks == 1 and not steps:
        return Check("ranks", True, "1/1 rank", f"one rank: stopped at the proof's step {step}")
    missing = [r for r in range(o.ranks) if r not in steps]
    wrong = {r: s for r, s in steps.items() if s != step}
    value = f"{len(steps)}/{o.ranks} " + ("rank" if o.ranks == 1 else "ranks")
    if missing:
        names = ", ".join(map(str, missing))
        return Check("ranks", False, value, f"no stop reported by rank {names}")
    if wrong:
        said = ", ".join(f"rank {r} at {s}" for r, s in sorted(wrong.items()))
        return Check("ranks", False, value, f"not at the proof's step {step}: {said}")
    return Check("ranks", True, value, f"every rank stopped at step {step}")


def _end(o: Observation) -> Check:
    proved = _proof_at(o)
    if proved is None:
        return Check("end", False, "-", "no proof: the end is not timed")
    if o.cancelled:
        why = f"cancelled by runwarden: no exit within {o.end_timeout_s:g} s of the proof"
        return Check("end", False, "-", why)
    if o.exit_code is None or o.exit_at is None:
        return Check("end", False, "-", f"no exit recorded; the run ended {o.state}")
    took = max(0.0, o.exit_at - proved)
    if o.exit_code != 0:
        return Check("end", False, _s(took), f"exited with {o.exit_code}")
    ok = took <= o.end_timeout_s
    late = f", later than the end timeout ({o.end_timeout_s:g} s)"
    detail = "exited with 0" + ("" if ok else late)
    return Check("end", ok, _s(took), detail)


def _resume(o: Observation) -> Check:
    step = _proof_step(o)
    resumed = o.resumed
    if step is None or resumed is None:
        return Check("resume", False, "-", "no checkpoint to resume from")
    if resumed.error is not None:
        return Check("resume", False, "-", resumed.error)
    first = resumed.first_step
    if first is None:
        return Check("resume", False, "-", "the resumed run logged no step")
    logged = [s for s, _ in o.steps]
    gaps = [b - a for a, b in itertools.pairwise(logged) if b > a]
    every = min(gaps) if gaps else 1
    value = f"step {first}"
    if resumed.begin_first_step is not None and resumed.begin_first_step != step + 1:
        return Check(
            "resume", False, value,
            f"its `begin` line's first step is {resumed.begin_first_step}, not the step "
            f"after the checkpoint's ({step})",
        )  # fmt: skip
    if not step < first <= step + every:
        return Check(
            "resume", False, value,
            f"first step logged {first} after a checkpoint of step {step}: "
            f"the step count does not continue",
        )  # fmt: skip
    return Check("resume", True, value, f"continues from the checkpoint's step {step}")


def judge(o: Observation) -> list[Check]:
    """Every check of [`CHECKS`], in order; a run that never warmed up fails the rest
    with that reason."""
    started = _started(o)
    if not started.passed:
        why = "not judged: the job did not warm up"
        rest = [Check(name, False, "-", why) for name in CHECKS[1:]]
        return [started, *rest]
    return [started, _proof(o), _lag(o), _checkpoint(o), _ranks(o), _end(o), _resume(o)]
