"""One `runwarden check-trainer`: launches a training command on a local target of a
running service, lets it warm up, asks a snapshot, watches the stop through to the
job's end on the run directory itself, resumes from the checkpoint, and judges
(`conformance.verdict`). The private service around it: `conformance.private`.

Time is bounded throughout: the warm-up by `start_timeout_s`, the stop by the proof
and end timeouts (which the run is launched with, so the service cancels a job that
misses them) plus a margin, the loading of the checkpoint and the resume by their
own deadlines. Whatever the job does, the check returns a report and leaves no run
of its own running (the resumed run is cancelled once it logged a step).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from schemas import RunRecord, RunState
from schemas.budget import StopTimeouts
from schemas.errors import BadRequest, RunwardenError
from schemas.events import LaunchSpec
from schemas.protocol import CANCELLING_FILE, EXIT_FILE, JOB_LOG, SNAPSHOT_FILE, SNAPSHOT_REQUEST

from ..api import Runwarden
from . import observe
from .verdict import Check, Loaded, Observation, Resumed, judge

__all__ = ["Report", "TrainerCheck", "run_check"]

POLL_S: Final = 0.05
"""How often the run directory is looked at while a stop is under way (seconds)."""
LOAD_TIMEOUT_S: Final = 300.0
"""How long loading the checkpoint may take (seconds)."""
ARTIFACTS_TIMEOUT_S: Final = 120.0
"""How long the checkpoint's retrieval, which a resume needs, may take (seconds)."""
STOP_MARGIN_S: Final = 60.0
"""How long past its proof and end timeouts a stop is watched before the check gives
up on it (the service's own cancel comes within that)."""
_LOADCHECK: Final = Path(__file__).with_name("loadcheck.py")
_PYTHON: Final = re.compile(r"python[0-9.]*")


@dataclass(frozen=True)
class TrainerCheck:
    """What to check and how long to give it.

    `command`: the training command's words, run in the run directory. With `ranks`
    above 1 and a command that starts with a Python interpreter (`python train.py
    ...`), it runs under `python -m torch.distributed.run --standalone
    --nproc-per-node=RANKS`; a command that starts its ranks itself (`torchrun ...`,
    `accelerate launch ...`, `python -m ...`) runs as given, and `ranks` says how many
    to expect.

    Raises:
        BadRequest: an empty command, or a count or time out of range.
    """

    command: tuple[str, ...]
    ranks: int = 1
    warmup_steps: int = 3
    proof_timeout_s: float = 120.0
    end_timeout_s: float = 60.0
    max_lag: int = 2
    start_timeout_s: float = 300.0

    def __post_init__(self) -> None:
        if not self.command or not self.command[0]:
            raise BadRequest("the training command is empty: give it after `--`")
        if not 1 <= self.ranks <= 64:
            raise BadRequest(f"ranks must be between 1 and 64, not {self.ranks}")
        if not 1 <= self.warmup_steps <= 1_000_000 or not 0 <= self.max_lag <= 1_000_000:
            raise BadRequest("the warm-up must be at least 1 step and the lag at least 0")
        for name in ("proof_timeout_s", "end_timeout_s", "start_timeout_s"):
            if not 1 <= getattr(self, name) <= 86_400:
                raise BadRequest(f"{name} must be between 1 s and a day")

    @property
    def launch_words(self) -> list[str]:
        """The command as launched (see the class)."""
        words = list(self.command)
        if self.ranks > 1 and self._python_first and words[1:2] != ["-m"]:
            head = ["-m", "torch.distributed.run", "--standalone"]
            return [words[0], *head, f"--nproc-per-node={self.ranks}", *words[1:]]
        return words

    @property
    def interpreter(self) -> str:
        """The Python that loads the checkpoint: the command's, else this one."""
        return self.command[0] if self._python_first else sys.executable

    @property
    def _python_first(self) -> bool:
        return _PYTHON.fullmatch(os.path.basename(self.command[0])) is not None


@dataclass
class Report:
    """The outcome of one check, for a table and for `--json`."""

    command: str
    ranks: int
    checks: list[Check]
    run_id: str | None = None
    resumed_id: str | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        """Whether every check passed (the command's exit code is 0 only then)."""
        return bool(self.checks) and all(check.passed for check in self.checks)

    def to_json(self) -> dict[str, Any]:
        """The report as a JSON object."""
        return {
            "passed": self.passed,
            "command": self.command,
            "ranks": self.ranks,
            "run": self.run_id,
            "resumed_run": self.resumed_id,
            "checks": [vars(check) for check in self.checks],
            "notes": self.notes,
        }


def _wait(condition: Callable[[], bool], timeout_s: float, poll_s: float = POLL_S) -> bool:
    deadline = time.monotonic() + timeout_s
    while True:
        if condition():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(poll_s)


def _warm_up(api: Runwarden, run: RunRecord, check: TrainerCheck, seen: Observation) -> None:
    """Waits for the warm-up's steps; sets `seen.start_error` when they do not come."""
    reader = observe.MetricsReader(Path(run.remote_dir))
    ended: list[RunRecord] = []

    def warm() -> bool:
        reader.poll()
        if (reader.last_step or 0) >= check.warmup_steps:
            return True
        current = api.get_run(run.id)
        if current.state.is_terminal:
            ended.append(current)
            return True
        return False

    reached = _wait(warm, check.start_timeout_s, 0.1)
    seen.steps = reader.steps
    if ended:
        why = f": {ended[0].message}" if ended[0].message else ""
        log = observe.tail(Path(run.remote_dir) / JOB_LOG)
        seen.start_error = f"the job ended {ended[0].state} before its warm-up{why}" + (
            f"; its log ends: {log}" if log else ""
        )
    elif not reached:
        last = reader.last_step
        logged = "no step logged" if last is None else f"last step logged {last}"
        seen.start_error = (
            f"{logged} within {check.start_timeout_s:g} s (warm-up: {check.warmup_steps} "
            "steps; the script logs steps with runwarden_job.Metrics, or a callback does)"
        )


def _watch_stop(
    api: Runwarden, run: RunRecord, check: TrainerCheck, seen: Observation
) -> RunRecord:
    """Asks the snapshot, then watches the run directory (the request's and the
    proof's arrival, the checkpoint when the proof is first seen) until the run ended
    or the stop's timeouts and a margin passed; the run as it stands then."""
    run_dir = Path(run.remote_dir)
    seen.asked_at = time.time()
    api.stop(run.id, asked_by="check-trainer")
    current = [run]

    def ended() -> bool:
        if seen.request_at is None:
            seen.request_at = observe.mtime(run_dir / SNAPSHOT_REQUEST)
        if seen.at_proof is None:
            proof = observe.read_json(run_dir / SNAPSHOT_FILE)
            checkpoint = None if proof is None else proof.get("checkpoint")
            if isinstance(checkpoint, str) and observe.inside(checkpoint):
                seen.at_proof = observe.listing(run_dir / checkpoint)[0]
        current[0] = api.get_run(run.id)
        return current[0].state.is_terminal

    _wait(ended, check.proof_timeout_s + check.end_timeout_s + STOP_MARGIN_S)
    return current[0]


def _after_end(run: RunRecord, check: TrainerCheck, seen: Observation) -> None:
    """Reads what the ended run left: its metrics, proof, checkpoint, exit, the ranks'
    reports, and loads the checkpoint."""
    run_dir = Path(run.remote_dir)
    reader = observe.MetricsReader(run_dir)
    reader.read_all()
    seen.steps = reader.steps
    seen.state, seen.message = str(run.state), run.message
    seen.proof = observe.read_json(run_dir / SNAPSHOT_FILE)
    seen.proof_ns = observe.mtime_ns(run_dir / SNAPSHOT_FILE) if seen.proof else None
    text = observe.read_small(run_dir / EXIT_FILE, 64)
    if text is not None and text.strip().lstrip(b"-").isdigit():
        seen.exit_code = int(text.strip())
        seen.exit_at = observe.mtime(run_dir / EXIT_FILE)
    seen.cancelled = (run_dir / CANCELLING_FILE).exists()
    checkpoint = None if seen.proof is None else seen.proof.get("checkpoint")
    if isinstance(checkpoint, str) and observe.inside(checkpoint):
        where = run_dir / checkpoint
        seen.checkpoint_found = where.is_dir() and not where.is_symlink()
        if seen.checkpoint_found:
            seen.final, seen.whole = observe.listing(where)
            seen.loaded = _load(check, where)


def _load(check: TrainerCheck, checkpoint: Path) -> Loaded:
    """Loads `checkpoint` with the job's interpreter (`conformance.loadcheck`)."""
    try:
        done = subprocess.run(
            [check.interpreter, str(_LOADCHECK), str(checkpoint)],
            capture_output=True, timeout=LOAD_TIMEOUT_S, check=False,
            env={**os.environ, "PYTHONSAFEPATH": "1"},
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        return Loaded("unknown", error=f"loading took more than {LOAD_TIMEOUT_S:g} s")
    except OSError as error:
        return Loaded("unknown", error=f"{check.interpreter} could not run: {error}")
    try:
        answer = json.loads(done.stdout.decode("utf-8", "replace").strip().splitlines()[-1])
        return Loaded(answer["framework"], int(answer["files"]), answer["error"])
    except (ValueError, IndexError, KeyError, TypeError):
        why = done.stderr.decode("utf-8", "replace").strip().splitlines()[-1:] or ["no answer"]
        return Loaded("unknown", error=f"the loader failed: {why[0][:300]}")


def _cancel(api: Runwarden, run_id: str | None) -> None:
    """Cancels the run `run_id` unless it ended (or is None); a cancel that fails is
    the service's to retry (`reconcile`), never the check's error."""
    if run_id is None:
        return
    with contextlib.suppress(RunwardenError):
        if not api.get_run(run_id).state.is_terminal:
            api.cancel(run_id)


def _resume(api: Runwarden, run: RunRecord, check: TrainerCheck) -> tuple[Resumed, str | None]:
    """Resumes `run` from its checkpoint (once retrieved, as any resume), waits for
    the first logged step, and cancels the resumed run; what was seen, and its id."""

    def retrieved() -> bool:
        artifacts = api.get_run(run.id).artifacts
        return artifacts is not None and artifacts.phase != "pending"

    _wait(retrieved, ARTIFACTS_TIMEOUT_S, 0.1)
    try:
        resumed = api.launch(api.resume_spec(run.id), wait_s=check.start_timeout_s)
    except RunwardenError as refused:
        return Resumed(error=f"the resume could not be launched: {refused}"), None
    reader = observe.MetricsReader(Path(resumed.remote_dir))
    state = [resumed]

    def logged() -> bool:
        reader.poll()
        if reader.steps:
            return True
        state[0] = api.get_run(resumed.id)
        return state[0].state.is_terminal

    try:
        _wait(logged, check.start_timeout_s, 0.1)
    finally:
        _cancel(api, resumed.id)
    begin = None if reader.begin is None else reader.begin.get("first_step")
    first = reader.steps[0][0] if reader.steps else None
    error = None
    if first is None:
        error = f"the resumed run logged no step (it is {state[0].state})"
    begin_step = begin if isinstance(begin, int) and not isinstance(begin, bool) else None
    return Resumed(first, begin_step, error), resumed.id


def run_check(
    api: Runwarden, target: str, check: TrainerCheck, scratch: Path,
    say: Callable[[str], None] = lambda _: None,
) -> Report:  # fmt: skip
    """Runs `check` on the local target `target` of the service `api` talks to;
    `scratch` is a directory of the caller's for the ranks' reports; `say` is told
    each phase, for people. Never raises for what the job does: that is the report.

    Raises:
        RunwardenError: the service refused the launch (an unknown target, ...).
    """
    reports = scratch / "ranks"
    reports.mkdir(parents=True, exist_ok=True)
    command = shlex.join(["env", f"RUNWARDEN_RANK_REPORT={reports}", *check.launch_words])
    report = Report(shlex.join(check.launch_words), check.ranks, [])
    seen = Observation(
        ranks=check.ranks, warmup_steps=check.warmup_steps,
        proof_timeout_s=check.proof_timeout_s, end_timeout_s=check.end_timeout_s,
        max_lag=check.max_lag,
    )  # fmt: skip
    timeouts = StopTimeouts(
        proof_timeout_s=check.proof_timeout_s, end_timeout_s=check.end_timeout_s
    )
    spec = LaunchSpec(target=target, command=command, name="check-trainer", timeouts=timeouts)
    say("launching")
    run = api.launch(spec, wait_s=check.start_timeout_s)
    report.run_id = run.id
    try:
        say(f"run {run.id}: warming up ({check.warmup_steps} steps)")
        _warm_up(api, run, check, seen)
        if seen.start_error is None:
            say("asking a snapshot")
            run = _watch_stop(api, run, check, seen)
            if not run.state.is_terminal:
                report.notes.append(f"the run was still {run.state} after its timeouts")
        _cancel(api, run.id)
        run = api.get_run(run.id)
        _after_end(run, check, seen)
        seen.reports = observe.rank_reports(reports, check.ranks)
        if seen.start_error is None and run.state is RunState.STOPPED:
            say("resuming from the checkpoint")
            seen.resumed, report.resumed_id = _resume(api, run, check)
    finally:
        # However the check ends (an interrupt included), no run of it goes on.
        for started in (report.run_id, report.resumed_id):
            _cancel(api, started)
    report.checks = judge(seen)
    return report
