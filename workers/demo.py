"""The demo of the executor layer, on this machine, with no service to set up:
launch the toy trainer in a temporary workdir, follow its metrics, ask it for a
snapshot, and record how the run ended, as the pipeline will.

`python -m workers.demo` (or `runwarden demo`). Exit 0 when the run ended stopped
with a valid checkpoint, 1 otherwise.
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from schemas import (
    JobCommand,
    JobId,
    JobStatus,
    RunState,
    SnapshotReason,
    decide_outcome,
    new_run_id,
    parse_proof,
)
from schemas.protocol import JOBSIDE_DIR, METRICS_FILE, PROOF_LIMIT, SNAPSHOT_FILE, SNAPSHOT_REQUEST
from workers.executors import ExecError, LocalExecutor, quote
from workers.jobside import jobside_files
from workers.reaper import become_subreaper

__all__ = ["main", "run_demo"]

TOY_TRAINER = Path(__file__).resolve().parent.parent / "examples" / "toy_trainer.py"


def _launch(executor: LocalExecutor, run_dir: str) -> JobId:
    ship = Path(run_dir) / JOBSIDE_DIR
    ship.mkdir()
    for path in jobside_files():
        shutil.copy2(path, ship / path.name)
    script = (
        f"exec {quote(sys.executable)} -u {quote(str(TOY_TRAINER))} "
        "--steps 1000 --step-time 0.1"
    )
    env = {
        "PYTHONPATH": str(ship),
        "RUNWARDEN_SNAPSHOT_REQUEST": f"{run_dir}/{SNAPSHOT_REQUEST}",
        "RUNWARDEN_METRICS": f"{run_dir}/{METRICS_FILE}",
    }
    return executor.spawn(JobCommand(dir=run_dir, script=script, env=env))


def _follow(
    console: Console, executor: LocalExecutor, job: JobId, stop_at: int, timeout_s: float
) -> JobStatus:
    """Shows the job's progress from its metrics, asks for a snapshot once it reached
    step `stop_at`, and returns its status once it ended (cancelling it after
    `timeout_s` seconds, as a stop's timeouts would)."""
    metrics = executor.tail(f"{job.dir}/{METRICS_FILE}")
    step, max_steps, loss = 0, 1, float("nan")
    deadline = time.monotonic() + timeout_s
    columns = (
        TextColumn("[bold]training[/]"),
        BarColumn(),
        TextColumn("step {task.completed:.0f}/{task.total:.0f}  loss {task.fields[loss]:.4f}"),
        TimeElapsedColumn(),
    )
    requested = False
    with Progress(*columns, console=console) as progress:
        task = progress.add_task("train", total=max_steps, loss=loss)
        while True:
            for line in metrics.poll():
                record = json.loads(line)
                if record.get("event") == "begin":
                    max_steps = int(record.get("max_steps", max_steps))
                elif record.get("event") == "log":
                    step = int(record["step"])
                    loss = float(record.get("loss") or loss)
                progress.update(task, completed=step, total=max_steps, loss=loss)
            if not requested and step >= stop_at:
                executor.put_file(f"{job.dir}/{SNAPSHOT_REQUEST}", SnapshotReason.REQUESTED)
                progress.console.print(f"snapshot asked for at step {step}")
                requested = True
            status = executor.status(job)
            if status.is_finished:
                return status
            if time.monotonic() > deadline:
                progress.console.print("[red]no snapshot in time: cancelling the job[/]")
                executor.cancel(job)
            time.sleep(0.1)


def run_demo(console: Console, stop_at: int = 15, timeout_s: float = 120.0) -> bool:
    """Runs the demo; returns whether the run ended stopped with its snapshot. The
    temporary workdir is left in place for a look, and named.

    Raises:
        ExecError: when the local target cannot be used.
    """
    become_subreaper()
    if not TOY_TRAINER.is_file():
        console.print(f"[red]the toy trainer is missing: {TOY_TRAINER}[/]")
        return False
    executor = LocalExecutor(Path(tempfile.mkdtemp(prefix="runwarden-demo-")))
    run_id = new_run_id("demo")
    run_dir = f"{executor.workdir}/{run_id}"
    console.print(f"run [bold]{run_id}[/] on the local target, in {run_dir}")
    if not executor.claim(run_dir, run_id):
        console.print("[red]the run directory is taken[/]")
        return False
    job = _launch(executor, run_dir)
    console.print(f"job started: pid {job.pid}")
    status = _follow(console, executor, job, stop_at, timeout_s)
    proof = parse_proof(executor.read_from(f"{run_dir}/{SNAPSHOT_FILE}", 0, PROOF_LIMIT))
    outcome = decide_outcome(status, proof)
    console.print(f"job ended: {status}")
    console.print(f"state:      [bold]{outcome.state}[/]")
    if outcome.snapshot is not None:
        checkpoint = Path(run_dir) / outcome.snapshot.checkpoint
        console.print(f"step:       {outcome.snapshot.step}")
        console.print(f"checkpoint: {checkpoint} ({len(list(checkpoint.iterdir()))} files)")
        console.print(f"reason:     {outcome.snapshot.reason}")
    elif outcome.message:
        console.print(f"message:    {outcome.message}")
    return outcome.state is RunState.STOPPED


def main() -> int:
    """Runs the demo; the process exit code."""
    console = Console()
    try:
        return 0 if run_demo(console) else 1
    except ExecError as error:
        console.print(f"[red]error: {error}[/]")
        return 1


if __name__ == "__main__":
    sys.exit(main())
