"""`runwarden_loop.StopPoint` in real loops of one's own (examples/ddp_loop.py: plain
PyTorch on one process, DDP with gloo on two under torchrun; examples/accelerate_loop.py:
the same around Accelerate, its save_state and load_state): a request stops every
rank at the same step, the checkpoint is complete and loadable before the proof names
it, a signal to one rank only stops them all at one step, and a resumed run's losses
are the uninterrupted run's, step for step."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from bench.harness.paths import JOBSIDE, ROOT
from bench.harness.ports import free_port

pytestmark = pytest.mark.slow

EXAMPLES = {
    "ddp": ROOT / "examples" / "ddp_loop.py",
    "accelerate": ROOT / "examples" / "accelerate_loop.py",
}
STEPS = 40
TOLERANCE = 1e-6
"""Largest difference allowed between a resumed run's loss and the uninterrupted
run's at the same step (the same batches and RNG states on the CPU: equal in
practice)."""
_LINE = re.compile(r"rank (\d+) step (\d+) loss ([0-9.e+-]+)")


@dataclass
class Ran:
    code: int
    out: str
    losses: dict[int, dict[int, float]] = field(default_factory=dict)
    """By rank, then by step."""
    pids: dict[int, int] = field(default_factory=dict)

    def stopped_at(self) -> dict[int, int]:
        found = re.findall(r"rank (\d+) stopped at step (\d+)", self.out)
        return {int(rank): int(step) for rank, step in found}


def run_loop(
    run_dir: Path,
    ranks: int,
    *,
    example: str = "ddp",
    resume: Path | None = None,
    on_step: Callable[[Ran, int, int], None] | None = None,
) -> Ran:
    """Runs the example in `run_dir` on `ranks` processes to its end (at most 120 s),
    calling `on_step(ran, rank, step)` for each step line as it comes."""
    run_dir.mkdir(parents=True, exist_ok=True)
    env = {
        **os.environ,
        "PYTHONPATH": str(JOBSIDE),
        "RUNWARDEN_SNAPSHOT_REQUEST": str(run_dir / "snapshot.request"),
        "OMP_NUM_THREADS": "1",
    }
    env.pop("RUNWARDEN_RESUME_FROM", None)
    if resume is not None:
        env["RUNWARDEN_RESUME_FROM"] = str(resume)
    argv = [sys.executable, str(EXAMPLES[example]), "--steps", str(STEPS)]
    if ranks > 1:
        argv[1:1] = ["-m", "torch.distributed.run", f"--nproc-per-node={ranks}",
                     f"--master-port={free_port()}"]  # fmt: skip
    ran = Ran(code=-1, out="")
    proc = subprocess.Popen(
        argv, cwd=run_dir, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    killer = threading.Timer(120, proc.kill)
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
    return ran


def request_at(step: int, run_dir: Path) -> Callable[[Ran, int, int], None]:
    def on_step(_: Ran, rank: int, number: int) -> None:
        if rank == 0 and number == step:
            (run_dir / "snapshot.request").write_text("requested")

    return on_step


def check_loadable(checkpoint: Path, example: str, ranks: int, step: int) -> None:
    """The checkpoint of `example` at `step` holds every rank's part, and loads."""
    import torch  # here: every test process collects this module, few run it
    if example == "ddp":
        for rank in range(ranks):
            assert torch.load(checkpoint / f"rank-{rank}.pt", weights_only=False)["step"] == step
        return
    from safetensors.torch import load_file

    assert json.loads((checkpoint / "step.json").read_text()) == {"step": step}
    assert load_file(checkpoint / "model.safetensors")
    for rank in range(ranks):
        assert (checkpoint / f"random_states_{rank}.pkl").is_file()


def check_stopped(ran: Ran, run_dir: Path, ranks: int, reason: str, example: str = "ddp") -> int:
    """The step every rank stopped at, after checking the proof and the checkpoint."""
    assert ran.code == 0, ran.out[-3000:]
    stopped = ran.stopped_at()
    assert sorted(stopped) == list(range(ranks)), ran.out[-3000:]
    (step,) = set(stopped.values())
    proof = json.loads((run_dir / "snapshot.json").read_text())
    assert proof["checkpoint"] == f"output/checkpoint-{step}"
    assert (proof["step"], proof["reason"]) == (step, reason)
    checkpoint = run_dir / proof["checkpoint"]
    # Complete before its proof: every file older than it, every rank's part there.
    for saved in checkpoint.rglob("*"):
        assert saved.stat().st_mtime <= proof["time"], saved
    check_loadable(checkpoint, example, ranks, step)
    # Every rank stopped right after that step: none ran another.
    for rank in range(ranks):
        assert max(ran.losses[rank]) == step
    return int(step)


def check_resumed(uninterrupted: Ran, resumed: Ran, step: int, ranks: int) -> None:
    assert resumed.code == 0, resumed.out[-3000:]
    for rank in range(ranks):
        assert min(resumed.losses[rank]) == step + 1, resumed.out[-2000:]
        assert max(resumed.losses[rank]) == STEPS
        for number, loss in resumed.losses[rank].items():
            assert abs(loss - uninterrupted.losses[rank][number]) <= TOLERANCE, (rank, number)


@pytest.mark.parametrize("example", ["ddp", "accelerate"])
@pytest.mark.parametrize("ranks", [1, 2])
def test_a_stopped_and_resumed_run_matches_the_uninterrupted_one(
    tmp_path: Path, ranks: int, example: str
) -> None:
    whole = run_loop(tmp_path / "whole", ranks, example=example)
    assert whole.code == 0, whole.out[-3000:]
    assert all(max(whole.losses[r]) == STEPS for r in range(ranks))
    assert not (tmp_path / "whole" / "snapshot.json").exists()

    first = tmp_path / "first"
    stopped = run_loop(first, ranks, example=example, on_step=request_at(10, first))
    step = check_stopped(stopped, first, ranks, "requested", example)
    assert 10 <= step < STEPS
    for rank in range(ranks):
        for number, loss in stopped.losses[rank].items():
            assert abs(loss - whole.losses[rank][number]) <= TOLERANCE

    checkpoint = first / f"output/checkpoint-{step}"
    resumed = run_loop(tmp_path / "second", ranks, example=example, resume=checkpoint)
    check_resumed(whole, resumed, step, ranks)


@pytest.mark.parametrize("example", ["ddp", "accelerate"])
def test_a_signal_to_one_rank_stops_every_rank_at_the_same_step(
    tmp_path: Path, example: str
) -> None:
    sent: list[int] = []

    def on_step(ran: Ran, rank: int, number: int) -> None:
        if rank == 1 and number == 8 and not sent:
            os.kill(ran.pids[1], signal.SIGTERM)
            sent.append(number)

    ran = run_loop(tmp_path, 2, example=example, on_step=on_step)
    assert sent
    step = check_stopped(ran, tmp_path, 2, "preempted", example)
    assert step >= 8
    # Rank 0, which got no signal, wrote the request for the run directory.
    assert (tmp_path / "snapshot.request").read_text().strip() == "preempted"


def test_a_request_at_the_last_step_changes_nothing(tmp_path: Path) -> None:
    ran = run_loop(tmp_path, 1, on_step=request_at(STEPS, tmp_path))
    assert ran.code == 0
    assert "rank 0 finished" in ran.out
    assert not (tmp_path / "snapshot.json").exists()
