"""A randomized chaos campaign over the whole service, for `bench/chaos.py` (the long
campaign and its figures) and tests/integration/service/test_chaos.py (a short,
seeded one).

Runs are drawn at random from the hostile-job matrix (bench/harness/hostile.py) and honest
toy trainers, on the local target (and an SSH target against a real sshd, and a local
target whose jobs run as a user of their own), launched
through the real service (bench/harness/pipeline.py), a bounded number in flight at once;
meanwhile faults are injected at random: kill -9 of a worker or of beat (and a
restart), a Redis restart (AOF), duplicate and late task messages (task bodies sent
again with `send_task`: launches, snapshot requests, cancels, deadline countdowns of
stops open or closed), and sshd killed in the middle of commands (then started
again).

Invariants checked for every run:

1. its final state is the one its plan calls for;
2. its job's process group got at most one SIGTERM per cancel (every job counts the
   TERMs it gets in a file of its run directory);
3. nothing of its job is alive after its end (no process carries its
   `RUNWARDEN_RUN_ID`);
4. one job was launched for it (one "launched" line in the workers' logs);

and for the campaign: no file was written outside a run or artifact directory (a
watched tree compared before and after: the campaign's own directory but for run
directories, artifacts and the service's state, the repository's examples and job
side, /etc/shadow, /tmp's top level), and no secret value was run.

It also measures the lateness of every deadline that fired (the stop leaving
`waiting_proof` or `waiting_end`, seen by a monitor polling the open stops every
50 ms, against the deadline's due time), and tells apart those due while a
component was down or within `RECOVERY_WINDOW_S` after it came back.
"""

from __future__ import annotations

import contextlib
import os
import queue
import random
import re
import signal
import statistics
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from schemas import (
    NotRunning,
    RunLimits,
    RunRecord,
    RunState,
    StopPhase,
)
from schemas.auth import WORKER
from schemas.events import (
    TASK_CANCEL,
    TASK_END_TIMEOUT,
    TASK_LAUNCH,
    TASK_PROOF_TIMEOUT,
    TASK_SNAPSHOT_REQUEST,
    LaunchSpec,
)
from workers.executors import quote
from workers.find_job import DIED_MESSAGE

from .hostile import CASES, SHADOW, Case, file_digest, provide_secrets
from .paths import ROOT, TOY_TRAINER
from .pipeline import (
    Pipeline,
    RunAsPlace,
    read_small,
    runas_target,
    running_pipeline,
    ssh_target,
)
from .processes import job_processes
from .sshd import SshServer, running_sshd
from .users import shared_dir

__all__ = [
    "FAULTS",
    "RECOVERY_WINDOW_S",
    "Campaign",
    "DeadlineEvent",
    "Fault",
    "Plan",
    "Result",
    "draw_plans",
    "percentile",
    "running_campaign",
]

RECOVERY_WINDOW_S = 5.0
"""A deadline due within this long after a faulted component came back counts as
"after a recovery"."""
DEADLINE_AFTER_S = 8.0
"""A hostile run left to its deadline: asked for its `deadline` snapshot this long
after its start (`max_hours`, the lead 0)."""
TERMS_FILE = "chaos-terms.log"
"""Where a job notes each SIGTERM it gets (one line each), in its run directory."""
RUN_TIMEOUT_S = 240.0
"""Longest a run may take from its launch to its end: a cancel whose worker was
killed is retried after 60 s (`workers.cancel_mark.CANCEL_RETRY_S`)."""
CLOCKS = {
    "RUNWARDEN_DEADLINE_LEAD_S": "0",
    # A launch whose worker was killed is settled by reconcile 35 s on.
    "RUNWARDEN_LAUNCH_MAX_RUNTIME_S": "30",
    "RUNWARDEN_LAUNCH_GRACE_S": "5",
}

# The honest job: the toy trainer, noting every SIGTERM in TERMS_FILE and exiting
# 0.3 s after the first (as a real job takes a moment to end). Its own preemption
# handling is off (RUNWARDEN_PREEMPT_SIGNALS empty), so this handler stays.
_TRAINER = """\
import os, signal, sys, threading, time
sys.path.insert(0, {examples!r})
import toy_trainer

timers = []

def on_term(signum, frame):
    with open({terms!r}, "a") as file:
        file.write(f"{{time.time():.3f}}\\n")
    if not timers:
        timers.append(threading.Timer(0.3, os._exit, (143,)))
        timers[0].start()

signal.signal(signal.SIGTERM, on_term)
sys.exit(toy_trainer.main(sys.argv[1:]))
"""

HONEST_ACTIONS: dict[str, tuple[tuple[str, ...], RunState]] = {
    "finish": (("--steps", "30", "--step-time", "0.1"), RunState.SUCCEEDED),
    "stop": (("--steps", "100000", "--step-time", "0.1"), RunState.STOPPED),
    "stop-ignore": (("--steps", "100000", "--step-time", "0.1", "--ignore-requests"),
                    RunState.CANCELLED),
    "stop-hang": (("--steps", "100000", "--step-time", "0.1", "--hang-after-proof"),
                  RunState.STOPPED),
    "cancel": (("--steps", "100000", "--step-time", "0.1"), RunState.CANCELLED),
}  # fmt: skip
"""What an honest run does (the toy trainer's options) and how it must end:
`finish` by itself; `stop` proves and ends; `stop-ignore` never looks for the
request (the proof deadline cancels it); `stop-hang` proves and hangs (the end
deadline cancels it, the proof wins); `cancel` is cancelled through the API."""

FAULTS = ("kill-worker", "kill-beat", "restart-redis", "messages", "kill-sshd")

_T = TypeVar("_T")


@dataclass(frozen=True)
class Plan:
    """One run of the campaign, drawn before it starts."""

    index: int
    target: str
    case: Case | None
    """The hostile case, None for an honest run."""
    action: str
    """Honest: a key of `HONEST_ACTIONS`; hostile: `stop` or `deadline`."""

    @property
    def name(self) -> str:
        return f"{self.case.name if self.case else 'honest'}-{self.action}"

    @property
    def expect(self) -> RunState:
        return RunState.CANCELLED if self.case else HONEST_ACTIONS[self.action][1]


@dataclass
class Result:
    """What became of one run."""

    plan: Plan
    run_id: str = ""
    state: RunState | None = None
    terms: int = 0
    cancels: int = 0
    seconds: float = 0.0
    violations: list[str] = field(default_factory=list)
    launch_failed: str = ""
    """Why its launch failed and no job started (a fault: the target out of reach,
    the launch's worker killed before the spawn); such a run is no violation."""


LAUNCH_CANCELLED = "its launch could not record its job and cancelled it"


def _launch_failed(run: RunRecord) -> bool:
    message = run.message or ""
    return message.startswith("launch failed") or message.startswith(DIED_MESSAGE)


@dataclass(frozen=True)
class Fault:
    """One fault: its kind, when it began and when the component was back (time.time)."""

    kind: str
    began: float
    ended: float
    detail: str = ""


@dataclass(frozen=True)
class DeadlineEvent:
    """A deadline that fired: its due time and when the stop left the phase (time.time)."""

    run_id: str
    kind: str
    due: float
    left: float
    to: str

    @property
    def lateness_s(self) -> float:
        return self.left - self.due


def percentile(values: list[float], q: float) -> float:
    """The `q` quantile (0..1) of `values`, nearest rank; NaN for none."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * len(ordered)) - 1))]


def draw_plans(rng: random.Random, count: int, targets: list[str]) -> list[Plan]:
    """`count` runs: half honest (an action of `HONEST_ACTIONS` each), half a hostile
    case of the matrix (stopped or left to its deadline), each on a random target."""
    plans = []
    for index in range(count):
        target = rng.choice(targets)
        if rng.random() < 0.5:
            plans.append(Plan(index, target, None, rng.choice(list(HONEST_ACTIONS))))
        else:
            plans.append(Plan(index, target, rng.choice(CASES), rng.choice(["stop", "deadline"])))
    return plans


def _retry(call: Callable[[], _T], what: str, timeout_s: float = 120.0) -> _T:
    """`call()`, again after any error (Redis restarting, a worker killed, an answer
    that timed out) until it works; NotRunning is the answer, never retried."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return call()
        except NotRunning:
            raise
        except Exception as error:
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"{what}: still failing after {timeout_s:g} s: {error}"
                ) from error
            time.sleep(0.5)


def _zombie_children(exclude: set[int]) -> list[int]:
    me = str(os.getpid())
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) in exclude:
            continue
        with contextlib.suppress(OSError, IndexError):
            with open(f"/proc/{entry}/stat", "rb") as handle:
                fields = handle.read().rsplit(b")", 1)[1].split()
            if fields[0] == b"Z" and fields[1].decode() == me:
                found.append(int(entry))
    return found


def _tree(roots: list[Path], skip: Callable[[Path], bool]) -> dict[str, tuple[int, int]]:
    """Every file and directory under `roots` (not under a skipped one): path ->
    (size, mtime ns). Links are listed, never followed."""
    found: dict[str, tuple[int, int]] = {}
    for root in roots:
        if not root.exists():
            continue
        for dirpath, dirnames, filenames in os.walk(root):
            here = Path(dirpath)
            dirnames[:] = [d for d in dirnames if not skip(here / d)]
            for name in filenames + dirnames:
                path = here / name
                with contextlib.suppress(OSError):
                    info = path.lstat()
                    found[str(path)] = (info.st_size, info.st_mtime_ns)
    return found


class _Keeper:
    """A thread that lives as long as the campaign and runs what it is handed: a
    process started from it (redis-server, whose death signal follows the thread that
    started it) outlives the short-lived thread that asked."""

    def __init__(self) -> None:
        self._calls: queue.Queue[tuple[Callable[[], object], queue.Queue[BaseException | None]]]
        self._calls = queue.Queue()
        self._thread = threading.Thread(target=self._serve, daemon=True, name="chaos-keeper")
        self._thread.start()

    def _serve(self) -> None:
        while True:
            call, reply = self._calls.get()
            try:
                call()
                reply.put(None)
            except BaseException as error:  # noqa: BLE001 - handed back to the caller
                reply.put(error)

    def run(self, call: Callable[[], object]) -> None:
        """Runs `call` on the keeper's thread and waits; raises what it raised."""
        reply: queue.Queue[BaseException | None] = queue.Queue()
        self._calls.put((call, reply))
        error = reply.get()
        if error is not None:
            raise error


class Campaign:
    """A running campaign: the pipeline, the targets, the monitor of stops, the fault
    injector, and the results."""

    def __init__(
        self,
        pipeline: Pipeline,
        tmp: Path,
        seed: int,
        sshd: SshServer | None,
        runas: RunAsPlace | None = None,
    ) -> None:
        self.pipeline = pipeline
        self.api = pipeline.api
        self.tmp = tmp
        self.rng = random.Random(seed + 1)
        """The fault injector's own draws (the plans are drawn apart, by `draw_plans`)."""
        self.seed = seed
        self.sshd = sshd
        self.targets = {"local": pipeline.workdir}
        self.results: list[Result] = []
        self.faults: list[Fault] = []
        self.deadlines: list[DeadlineEvent] = []
        self.specs: dict[str, LaunchSpec] = {}
        self.harness_errors: list[str] = []
        self._keeper = _Keeper()
        """Faults that could not be injected (the campaign went on without them)."""
        self._lock = threading.Lock()
        self._done = threading.Event()
        self._trainer = tmp / "chaos_trainer.py"
        self._trainer.write_text(
            _TRAINER.format(examples=str(TOY_TRAINER.parent), terms=TERMS_FILE)
        )
        if sshd is not None:
            workdir = sshd.workdir / f"chaos-{seed}"
            workdir.mkdir()
            self.api.add_target(ssh_target(sshd, workdir))
            self.targets["ssh"] = workdir
        self._runas = runas
        if runas is not None:
            # The honest trainer where the jobs' user can run it.
            (runas.base / self._trainer.name).write_text(
                _TRAINER.format(examples=str(runas.base), terms=TERMS_FILE)
            )
            self.api.add_target(runas.target)
            self.targets["runas"] = Path(runas.target.workdir)
        self._threads = [
            threading.Thread(target=self._monitor, daemon=True, name="chaos-monitor"),
            threading.Thread(target=self._reaper, daemon=True, name="chaos-reaper"),
        ]
        for thread in self._threads:
            thread.start()
        self._before = self._watched()
        self._shadow = file_digest(SHADOW)

    # --- the runs ---------------------------------------------------------------------

    def _command(self, plan: Plan) -> str:
        if plan.case is not None:
            trap = f"trap 'echo TERM >> {TERMS_FILE}; exit 143' TERM\n"
            return trap + plan.case.script
        args = HONEST_ACTIONS[plan.action][0]
        words = " ".join(quote(a) for a in args)
        python, trainer = sys.executable, self._trainer
        if plan.target == "runas" and self._runas is not None:
            python, trainer = self._runas.python, self._runas.base / self._trainer.name
        return f"RUNWARDEN_PREEMPT_SIGNALS= exec {quote(python)} -u {quote(str(trainer))} {words}"

    def _spec(self, plan: Plan) -> LaunchSpec:
        limits = RunLimits(disk=False)
        if plan.case is not None and plan.action == "deadline":
            limits = RunLimits(max_hours=DEADLINE_AFTER_S / 3600, disk=False)
        return LaunchSpec(
            target=plan.target,
            command=self._command(plan),
            name=plan.name[:30],
            secrets=plan.case.secrets if plan.case else (),
            limits=limits,
            key=f"chaos-{self.seed}-{plan.index}",
        )

    def run(self, plan: Plan) -> Result:
        """Runs `plan` to its end and checks its invariants."""
        result = Result(plan)
        began = time.monotonic()
        spec = self._spec(plan)
        try:
            run = self._launch(spec)
            result.run_id = run.id
            with self._lock:
                self.specs[run.id] = spec
            run = self._wait_started(run.id)
            if run.state is RunState.RUNNING:
                self._act(plan, run)
            ended = self._wait_end(run.id)
            result.state = ended.state
            if ended.job is None and ended.state is RunState.FAILED and _launch_failed(ended):
                # The target was out of reach, or the launch's worker died before the
                # spawn: no job started, and none may be running (checked below).
                result.launch_failed = ended.message or ""
            elif ended.state is RunState.CANCELLED and self._launch_cancelled(run.id):
                # Its launch started the job but could not record it (Redis restarting)
                # and cancelled it, by design; a later delivery followed it to its end.
                result.launch_failed = LAUNCH_CANCELLED
            elif ended.state is not plan.expect:
                result.violations.append(
                    f"ended {ended.state} ({ended.message}), not {plan.expect}"
                )
            self._check_after(result, ended)
        except Exception as error:  # noqa: BLE001 - a run that broke is a violation
            result.violations.append(f"{type(error).__name__}: {error}")
        result.seconds = time.monotonic() - began
        with self._lock:
            self.results.append(result)
        return result

    def _launch(self, spec: LaunchSpec) -> RunRecord:
        """The run of `spec`, launched once for its key. A producer whose wait ran out
        (workers overloaded, or down) sends it again; past 3 min, the run its key
        started is looked up in the store and taken as it stands."""
        try:
            return _retry(lambda: self.api.launch(spec, wait_s=30), "launch", 180)
        except AssertionError:
            assert spec.key is not None
            run_id = _retry(lambda: self.api.store.launches.launch(spec.key or ""), "key")
            if run_id is None:
                raise
            return _retry(lambda: self.api.get_run(run_id), "get run")

    def _launch_cancelled(self, run_id: str) -> bool:
        """Whether a launch of `run_id` cancelled the job it could not record."""
        line = f"run {run_id}: cannot record its job; cancelling it"
        return any(line in self.pipeline.worker_log(n) for n in ("w1", "w2"))

    def _wait_started(self, run_id: str) -> RunRecord:
        """The run once it is no longer `preparing` (a launch answered while its first
        delivery was still at work, or left for `reconcile` to settle)."""
        deadline = time.monotonic() + RUN_TIMEOUT_S
        while True:
            run = _retry(lambda: self.api.get_run(run_id), "get run")
            if run.state is not RunState.PREPARING or time.monotonic() > deadline:
                return run
            time.sleep(0.2)

    def _act(self, plan: Plan, run: RunRecord) -> None:
        if plan.action in ("finish", "deadline"):
            return
        # Past its start: an honest job has logged a step or two.
        pause = random.Random(self.seed * 100_003 + plan.index).uniform(1.0, 2.0)
        time.sleep(pause)
        # NotRunning: it ended first (an answer lost to a fault and the call sent
        # again after it worked; a hostile job's own request came first). A call whose
        # answers all timed out (AssertionError from `_retry`) may still be carried
        # out. Either way its final state tells: a stop never carried out leaves it
        # running (`_wait_end`).
        with contextlib.suppress(NotRunning, AssertionError):
            if plan.action == "cancel":
                _retry(lambda: self.api.cancel(run.id, wait_s=60), "cancel", 240)
            else:
                _retry(lambda: self.api.stop(run.id, asked_by="chaos", wait_s=20), "stop", 240)

    def _stops_of(self, run_id: str) -> list[Any]:
        return _retry(lambda: self.api.store.stops.history(run_id), "stop history")

    def _wait_end(self, run_id: str) -> RunRecord:
        deadline = time.monotonic() + RUN_TIMEOUT_S
        while time.monotonic() < deadline:
            with contextlib.suppress(Exception):
                run = self.api.get_run(run_id)
                if run.state.is_terminal:
                    return run
            time.sleep(0.2)
        why = "the store cannot be read"
        with contextlib.suppress(Exception):
            run = self.api.get_run(run_id)
            why = f"{run.state}, job {run.job}, stop {self.api.get_stop(run_id)}"
        raise AssertionError(f"did not end within {RUN_TIMEOUT_S:g} s: {why}")

    def _check_after(self, result: Result, run: RunRecord) -> None:
        run_dir = Path(run.remote_dir)
        # Looked at within 0.2 s of the end being recorded: a cancel records it after
        # its sweep, any other end after ending what is left (`workers.finish`).
        alive = job_processes(run.id)
        if alive:
            result.violations.append(f"processes alive after its end: {alive}")
        with contextlib.suppress(OSError, ValueError):
            result.terms = len(read_small(run_dir / TERMS_FILE, 4096).splitlines())
        # The stop is archived a moment after the run's end is recorded.
        closed_by = time.monotonic() + 15

        def open_stop() -> Any:  # Redis may be restarting: read again, as everywhere
            return _retry(lambda: self.api.get_stop(run.id), "get stop")

        while open_stop() is not None and time.monotonic() < closed_by:
            time.sleep(0.2)
        stops = [*self._stops_of(run.id), *filter(None, [open_stop()])]
        result.cancels = sum(s.cancels for s in stops) + (result.plan.action == "cancel")
        result.cancels += result.launch_failed == LAUNCH_CANCELLED
        if result.terms > result.cancels:
            result.violations.append(f"{result.terms} SIGTERMs for {result.cancels} cancel(s)")

    # --- faults -----------------------------------------------------------------------

    def inject(self, kind: str) -> Fault:
        """Injects one fault of `kind` and waits until the component is back."""
        began = time.time()
        detail = ""
        pipeline = self.pipeline
        if kind == "kill-worker":
            name = self.rng.choice(sorted(pipeline.workers))
            pipeline.kill_worker(name)
            time.sleep(self.rng.uniform(0.2, 3.0))
            pipeline.start_worker(name, 3)
            self._wait_worker(name)
            detail = name
        elif kind == "kill-beat":
            assert pipeline.beat is not None
            os.killpg(pipeline.beat.pid, signal.SIGKILL)
            pipeline.beat.wait()
            time.sleep(self.rng.uniform(0.2, 3.0))
            pipeline.start_beat()
        elif kind == "restart-redis":
            # Restarted from the thread that started it: the server dies with the
            # thread that started it (bench/harness/redis_server.py), and a fault thread ends.
            self._keeper.run(pipeline.redis.restart)
        elif kind == "kill-sshd":
            assert self.sshd is not None
            self.sshd.kill()
            time.sleep(self.rng.uniform(0.2, 2.0))
            self.sshd.start()
        else:
            detail = self._messages()
        fault = Fault(kind, began, time.time(), detail)
        with self._lock:
            self.faults.append(fault)
        return fault

    def _wait_worker(self, name: str) -> None:
        """Waits until worker `name` answers (a client of a restarted Redis may fail a
        ping or two first)."""
        deadline = time.monotonic() + 90
        while True:
            try:
                self.pipeline.wait_worker(name, timeout_s=10)
                return
            except Exception:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)

    def _messages(self) -> str:
        """Sends again, at random, task bodies the service already got, each a new
        message signed as its first sender signed it (a producer that publishes again,
        a redelivery under a new id): a launch (same key), a snapshot request of a run
        with a stop, a cancel of a run being cancelled, the deadline countdowns of a
        stop open or closed (the workers' own)."""
        with self._lock:
            specs = list(self.specs.items())
        if not specs:
            return "none"
        sent = []
        send = self.pipeline.send
        for _ in range(self.rng.randint(1, 4)):
            run_id, spec = self.rng.choice(specs)
            with contextlib.suppress(Exception):
                kind = self.rng.choice(["launch", "request", "cancel", "deadline"])
                if kind == "launch":
                    send(TASK_LAUNCH, spec.model_dump(mode="json"))
                    sent.append("launch")
                    continue
                stop = self.api.get_stop(run_id)
                history = self.api.store.stops.history(run_id)
                if kind == "request" and stop is not None:
                    body = {"run_id": run_id, "reason": str(stop.reason), "asked_by": "chaos"}
                    send(TASK_SNAPSHOT_REQUEST, body)
                    sent.append("request")
                elif kind == "cancel" and stop is not None and stop.phase is StopPhase.CANCELLING:
                    send(TASK_CANCEL, {"run_id": run_id})
                    sent.append("cancel")
                elif kind == "deadline" and (stop is not None or history):
                    some = stop if stop is not None else history[0]
                    body = {"run_id": run_id, "stop_id": some.stop_id}
                    for task in (TASK_PROOF_TIMEOUT, TASK_END_TIMEOUT):
                        send(task, body, WORKER, countdown=self.rng.uniform(0, 3))
                    sent.append("deadline" if stop is not None else "late-deadline")
        return ",".join(sent) or "none"

    # --- the monitor, the reaper, the watched tree ---------------------------------------

    def _monitor(self) -> None:
        """Every 50 ms: the open stops; a stop leaving `waiting_proof` or `waiting_end`
        at or after its deadline is a deadline that fired."""
        seen: dict[str, Any] = {}
        while not self._done.wait(0.05):
            try:
                stops = {s.stop_id: s for s in self.api.store.stops.in_progress()}
            except Exception:  # noqa: BLE001, S112 - Redis restarting: next turn
                continue
            now = time.time()
            for stop_id, old in list(seen.items()):
                new = stops.get(stop_id)
                if new is not None and new.phase is old.phase:
                    continue
                due_at = (
                    old.proof_deadline if old.phase is StopPhase.WAITING_PROOF else old.end_deadline
                )
                if old.phase in (StopPhase.WAITING_PROOF, StopPhase.WAITING_END) and due_at:
                    due = due_at.timestamp()
                    to = "closed" if new is None else str(new.phase)
                    # Only a deadline moves a stop on before `closed`; a stop closed
                    # before its deadline ended with its job: no deadline fired.
                    if now >= due - 0.6:
                        kind = "proof" if old.phase is StopPhase.WAITING_PROOF else "end"
                        self.deadlines.append(DeadlineEvent(old.run_id, kind, due, now, to))
                del seen[stop_id]
            seen.update(stops)

    def _reaper(self) -> None:
        """Reaps this process's zombie children that are not the service's own: after
        a worker is killed, its jobs' processes come here (tests/conftest.py), and a
        zombie counts as a live member of a job's group."""
        while not self._done.wait(0.1):
            owned = {p.pid for p in [*self.pipeline.workers.values()]}
            if self.pipeline.beat is not None:
                owned.add(self.pipeline.beat.pid)
            if self.pipeline.redis.pid is not None:
                owned.add(self.pipeline.redis.pid)
            if self.sshd is not None and self.sshd.process is not None:
                owned.add(self.sshd.process.pid)
            for pid in _zombie_children(owned):
                with contextlib.suppress(ChildProcessError):
                    os.waitpid(pid, os.WNOHANG)

    def _watched(self) -> dict[str, tuple[int, int]]:
        allowed = {
            *(str(p) for p in self.targets.values()),
            str(self.pipeline.api.settings.artifacts_root),
            str(self.pipeline.api.settings.state_dir),
            str(self.pipeline.redis.data_dir),
        }

        def skip(path: Path) -> bool:
            return str(path) in allowed

        root = ROOT
        files = _tree([self.tmp, root / "examples", root / "workers" / "jobside"], skip)
        for name, _ in list(files.items()):
            if name.endswith((".log", ".pyc")) or "beat-schedule" in name or "__pycache__" in name:
                del files[name]
        for target, workdir in self.targets.items():
            for entry in os.listdir(workdir):
                files[f"{target}:{entry}"] = (0, 0)
        for entry in os.listdir("/tmp"):
            if entry.startswith("rw-pwned"):
                files[f"/tmp/{entry}"] = (0, 0)
        return files

    def finish(self) -> list[str]:
        """Stops the monitor; returns the campaign-wide violations: files written
        outside a run or artifact directory, /etc/shadow changed, a job launched twice
        for one run."""
        self._done.set()
        for thread in self._threads:
            thread.join(5)
        after = self._watched()
        runs = {r.run_id for r in self.results if r.run_id}
        known = runs | {r.id for r in _retry(self.api.list_runs, "list runs")}
        found = []
        for name in sorted(set(after) - set(self._before)):
            target, _, entry = name.partition(":")
            if target in self.targets and entry in known:
                continue  # a run directory of the campaign
            found.append(f"written outside a run or artifact directory: {name}")
        for name in sorted(set(self._before) & set(after)):
            if self._before[name] != after[name] and ":" not in name:
                found.append(f"changed outside a run or artifact directory: {name}")
        if file_digest(SHADOW) != self._shadow:
            found.append("/etc/shadow changed")
        logs = "".join(self.pipeline.worker_log(n) for n in ("w1", "w2"))
        for run_id in runs:
            launched = len(re.findall(rf"run {re.escape(run_id)}: launched on", logs))
            if launched > 1:
                found.append(f"run {run_id}: launched {launched} times")
        return found


@contextmanager
def running_campaign(
    tmp: Path, seed: int, ssh: bool = False, run_as: bool = False
) -> Iterator[Campaign]:
    """A campaign's service (2 workers of 3 processes, beat, Redis; an sshd with
    `ssh`; with `run_as`, a local target `runas` whose jobs run as a user of their own),
    with the hostile cases' secrets on the workers."""
    secrets = sorted({name for case in CASES for name in case.secrets})
    env = dict(CLOCKS)
    with contextlib.ExitStack() as stack:
        sshd = stack.enter_context(running_sshd(tmp / "sshd")) if ssh else None
        pipeline = stack.enter_context(
            running_pipeline(tmp / "service", workers=2, extra_env=env, concurrency=3)
        )
        runas = runas_target(stack.enter_context(shared_dir("rw-chaos-"))) if run_as else None
        campaign = Campaign(pipeline, tmp / "service", seed, sshd, runas)
        try:
            provide_secrets(pipeline.api, secrets, campaign.targets)
            yield campaign
        finally:
            campaign._done.set()
            pipeline.kill_jobs()


def drive(
    campaign: Campaign,
    plans: list[Plan],
    *,
    in_flight: int,
    fault_every_s: float,
    faults: tuple[str, ...],
    stop_at: float | None = None,
    progress: Callable[[int], None] | None = None,
) -> None:
    """Runs `plans`, `in_flight` at once, injecting a fault of `faults` every
    `fault_every_s` on average (exponential gaps) until they are done. Past `stop_at`
    (`time.monotonic()`), no new run starts; those in flight finish."""
    done = threading.Event()

    def inject() -> None:
        while not done.wait(campaign.rng.expovariate(1 / fault_every_s)):
            kind = campaign.rng.choice(faults)
            try:
                campaign.inject(kind)
            except Exception as error:  # noqa: BLE001 - noted; the campaign goes on
                campaign.harness_errors.append(f"{kind}: {type(error).__name__}: {error}")

    injector = threading.Thread(target=inject, daemon=True, name="chaos-faults")
    injector.start()
    slots = threading.Semaphore(in_flight)
    finished = [0]

    def one(plan: Plan) -> None:
        try:
            campaign.run(plan)
        finally:
            slots.release()
            with campaign._lock:
                finished[0] += 1
                count = finished[0]
            if progress is not None:
                progress(count)

    with ThreadPoolExecutor(in_flight) as pool:
        for plan in plans:
            slots.acquire()
            if stop_at is not None and time.monotonic() > stop_at:
                slots.release()
                break
            pool.submit(one, plan)
    done.set()
    injector.join(120)


def summary(values: list[float]) -> str:
    """`median / p99 / max` of `values`, in seconds."""
    if not values:
        return "-"
    return (
        f"median {statistics.median(values):.2f} s, p99 {percentile(values, 0.99):.2f} s, "
        f"max {max(values):.2f} s (n={len(values)})"
    )
