"""`runwarden_lightning`'s callback in a real Lightning fit (examples/lightning_loop.py:
one process, and DDP with gloo on two under torchrun): a request stops every rank at
the same step, the checkpoint is complete and loadable before the proof names it, a
SIGTERM to one rank only stops them all at one step, a request at the last step
changes nothing, and a resumed run's losses are the uninterrupted run's, step for
step, mid-epoch. The runs are shared by the tests (module fixtures): seven fits in
all."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from bench.harness.paths import JOBSIDE, ROOT
from bench.harness.ports import free_port

pytestmark = pytest.mark.slow

EXAMPLE = ROOT / "examples" / "lightning_loop.py"
STEPS = 40
"""The last step: past the first epoch on both sizes (32 batches an epoch on one rank,
16 on two), so the resumed runs cross an epoch end too."""
TOLERANCE = 1e-6
"""Largest difference allowed between a resumed run's loss and the uninterrupted
run's at the same step (the same batches, weights and RNG states on the CPU: equal
in practice; the measured difference is 0)."""
DEADLINE_S = 120
_LINE = re.compile(r"rank (\d+) step (\d+) loss ([0-9.e+-]+)")


@dataclass
class Ran:
    code: int
    out: str
    seconds: float = 0.0
    losses: dict[int, dict[int, float]] = field(default_factory=dict)
    """By rank, then by step."""
    pids: dict[int, int] = field(default_factory=dict)
    signalled: list[int] = field(default_factory=list)
    """The steps at which a signal was sent to a rank."""

    def stopped_at(self) -> dict[int, int]:
        found = re.findall(r"rank (\d+) stopped at step (\d+)", self.out)
        return {int(rank): int(step) for rank, step in found}


def run_fit(
    run_dir: Path,
    ranks: int,
    *,
    resume: Path | None = None,
    on_step: Callable[[Ran, int, int], None] | None = None,
) -> Ran:
    """Runs the example in `run_dir` on `ranks` processes to its end (killed after
    DEADLINE_S), calling `on_step(ran, rank, step)` for each step line as it comes."""
    run_dir.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("RUNWARDEN_")}
    env |= {
        "PYTHONPATH": str(JOBSIDE),
        "RUNWARDEN_SNAPSHOT_REQUEST": str(run_dir / "snapshot.request"),
        "RUNWARDEN_METRICS": str(run_dir / "metrics.jsonl"),
        "OMP_NUM_THREADS": "1",
    }
    if resume is not None:
        env["RUNWARDEN_RESUME_FROM"] = str(resume)
    argv = [sys.executable, str(EXAMPLE), "--steps", str(STEPS)]
    if ranks > 1:
        argv[1:1] = ["-m", "torch.distributed.run", f"--nproc-per-node={ranks}",
                     f"--master-port={free_port()}"]  # fmt: skip
    ran = Ran(code=-1, out="")
    began = time.monotonic()
    proc = subprocess.Popen(
        argv, cwd=run_dir, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    killer = threading.Timer(DEADLINE_S, proc.kill)
    killer.start()
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            ran.out += line
            for pid in re.finditer(r"rank (\d+) pid (\d+)", line):
                ran.pids[int(pid.group(1))] = int(pid.group(2))
            for step in _LINE.finditer(line):
                rank, number = int(step.group(1)), int(step.group(2))
                ran.losses.setdefault(rank, {})[number] = float(step.group(3))
                if on_step is not None:
                    on_step(ran, rank, number)
        ran.code = proc.wait()
    finally:
        killer.cancel()
    ran.seconds = time.monotonic() - began
    return ran


def request_at(step: int, run_dir: Path) -> Callable[[Ran, int, int], None]:
    """Writes a request when rank 0 prints `step`'s loss (in its training step, before
    the callback looks at that step's end)."""

    def on_step(_: Ran, rank: int, number: int) -> None:
        if rank == 0 and number == step:
            (run_dir / "snapshot.request").write_text("requested")

    return on_step


def sigterm_at(step: int, rank: int) -> Callable[[Ran, int, int], None]:
    def on_step(ran: Ran, at: int, number: int) -> None:
        if at == rank and number == step and not ran.signalled:
            os.kill(ran.pids[rank], signal.SIGTERM)
            ran.signalled.append(number)

    return on_step


@dataclass
class Runs:
    run_dirs: dict[str, Path]
    ran: dict[str, Ran]


@pytest.fixture(scope="module")
def one(tmp_path_factory: pytest.TempPathFactory) -> Runs:
    """One process: the whole fit (a request at its last step), one stopped by a
    request, and its resume."""
    root = tmp_path_factory.mktemp("lightning-1")
    runs = Runs({name: root / name for name in ("whole", "stopped", "resumed")}, {})
    dirs = runs.run_dirs
    runs.ran["whole"] = run_fit(dirs["whole"], 1, on_step=request_at(STEPS, dirs["whole"]))
    runs.ran["stopped"] = run_fit(dirs["stopped"], 1, on_step=request_at(10, dirs["stopped"]))
    step = runs.ran["stopped"].stopped_at().get(0)
    if step is not None:
        checkpoint = dirs["stopped"] / f"output/checkpoint-{step}"
        runs.ran["resumed"] = run_fit(dirs["resumed"], 1, resume=checkpoint)
    return runs


@pytest.fixture(scope="module")
def two(tmp_path_factory: pytest.TempPathFactory) -> Runs:
    """Two ranks: the whole fit (a request at its last step), one stopped by a
    request, one stopped by a SIGTERM to rank 1 only, and the resume of that one."""
    root = tmp_path_factory.mktemp("lightning-2")
    names = ("whole", "stopped", "preempted", "resumed")
    runs = Runs({name: root / name for name in names}, {})
    dirs = runs.run_dirs
    runs.ran["whole"] = run_fit(dirs["whole"], 2, on_step=request_at(STEPS, dirs["whole"]))
    runs.ran["stopped"] = run_fit(dirs["stopped"], 2, on_step=request_at(10, dirs["stopped"]))
    runs.ran["preempted"] = run_fit(dirs["preempted"], 2, on_step=sigterm_at(8, 1))
    step = runs.ran["preempted"].stopped_at().get(0)
    if step is not None:
        checkpoint = dirs["preempted"] / f"output/checkpoint-{step}"
        runs.ran["resumed"] = run_fit(dirs["resumed"], 2, resume=checkpoint)
    return runs


def check_stopped(ran: Ran, run_dir: Path, ranks: int, reason: str) -> int:
    """The step every rank stopped at, after checking the proof and the checkpoint."""
    assert ran.code == 0, ran.out[-3000:]
    stopped = ran.stopped_at()
    assert sorted(stopped) == list(range(ranks)), ran.out[-3000:]
    (step,) = set(stopped.values())
    proof = json.loads((run_dir / "snapshot.json").read_text())
    assert proof["checkpoint"] == f"output/checkpoint-{step}"
    assert (proof["step"], proof["reason"]) == (step, reason)
    checkpoint = run_dir / proof["checkpoint"]
    # Complete before its proof: every file older than it.
    saved = list(checkpoint.rglob("*"))
    assert saved
    for path in saved:
        assert path.stat().st_mtime <= proof["time"], path
    # Loadable, and Lightning's own: the step, the loops' state, every rank's RNG.
    import torch  # here: every test process collects this module, few run it

    state = torch.load(checkpoint / "lightning.ckpt", weights_only=False)
    assert state["global_step"] == step
    for part in ("state_dict", "optimizer_states", "lr_schedulers", "loops"):
        assert state[part], part
    assert len(state["rng_states"]) == ranks
    # Every rank stopped right after that step: none ran another.
    for rank in range(ranks):
        assert max(ran.losses[rank]) == step, ran.out[-2000:]
    # Rank 0's metrics: one line a step, the save, the end with its reason.
    lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert lines[0] == {**lines[0], "event": "begin", "max_steps": STEPS, "first_step": 1}
    assert [ln["step"] for ln in lines if ln["event"] == "log"] == list(range(1, step + 1))
    (save,) = [ln for ln in lines if ln["event"] == "save"]
    assert save["step"] == step
    assert save["seconds"] >= 0
    assert lines[-1] == {**lines[-1], "event": "end", "step": step, "reason": reason}
    return int(step)


def check_whole(ran: Ran, run_dir: Path, ranks: int) -> None:
    """Ran every step; the request written at the last step changed nothing."""
    assert ran.code == 0, ran.out[-3000:]
    assert (run_dir / "snapshot.request").read_text() == "requested"
    assert not (run_dir / "snapshot.json").exists()
    assert not (run_dir / "output").exists()
    for rank in range(ranks):
        assert sorted(ran.losses[rank]) == list(range(1, STEPS + 1))
        assert f"rank {rank} finished" in ran.out


def check_resumed(whole: Ran, resumed: Ran, step: int, ranks: int) -> float:
    """The resumed run went on from the next step to the last, every loss the
    uninterrupted run's; the largest difference."""
    assert resumed.code == 0, resumed.out[-3000:]
    assert "not resumable" not in resumed.out  # Lightning's warning: the data order kept
    worst = 0.0
    for rank in range(ranks):
        steps = sorted(resumed.losses[rank])
        assert steps == list(range(step + 1, STEPS + 1)), resumed.out[-2000:]
        for number, loss in resumed.losses[rank].items():
            worst = max(worst, abs(loss - whole.losses[rank][number]))
    assert worst <= TOLERANCE
    return worst


@pytest.mark.parametrize("ranks", [1, 2])
def test_a_request_at_the_last_step_changes_nothing(
    ranks: int, request: pytest.FixtureRequest
) -> None:
    runs: Runs = request.getfixturevalue("one" if ranks == 1 else "two")
    check_whole(runs.ran["whole"], runs.run_dirs["whole"], ranks)


@pytest.mark.parametrize("ranks", [1, 2])
def test_a_request_stops_every_rank_at_one_step_with_a_checkpoint_before_its_proof(
    ranks: int, request: pytest.FixtureRequest
) -> None:
    runs: Runs = request.getfixturevalue("one" if ranks == 1 else "two")
    ran = runs.ran["stopped"]
    step = check_stopped(ran, runs.run_dirs["stopped"], ranks, "requested")
    assert 10 <= step < STEPS
    whole = runs.ran["whole"]
    for rank in range(ranks):
        for number, loss in ran.losses[rank].items():
            assert abs(loss - whole.losses[rank][number]) <= TOLERANCE


def test_a_sigterm_to_one_rank_stops_both_at_one_step(two: Runs) -> None:
    run_dir = two.run_dirs["preempted"]
    ran = two.ran["preempted"]
    assert ran.signalled == [8], ran.out[-2000:]
    step = check_stopped(ran, run_dir, 2, "preempted")
    assert 8 <= step < STEPS
    # Rank 0, which got no signal, wrote the request for the run directory.
    assert (run_dir / "snapshot.request").read_text().strip() == "preempted"


@pytest.mark.parametrize("ranks", [1, 2])
def test_a_resumed_run_matches_the_uninterrupted_one_step_for_step(
    ranks: int, request: pytest.FixtureRequest
) -> None:
    runs: Runs = request.getfixturevalue("one" if ranks == 1 else "two")
    before = runs.ran["stopped" if ranks == 1 else "preempted"]
    assert "resumed" in runs.ran, before.out[-2000:]
    (step,) = set(before.stopped_at().values())
    worst = check_resumed(runs.ran["whole"], runs.ran["resumed"], step, ranks)
    print(f"{ranks} rank(s): resumed after step {step}, largest loss difference {worst:g}")
