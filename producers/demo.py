"""`runwarden demo`: the whole service on the embedded default, in a temporary state
directory: start it, launch the toy trainer on a local target, follow its progress,
stop it with a snapshot, wait for its checkpoint to come home verified, resume it
from there and stop it again further on, print the outcomes, shut everything down."""

from __future__ import annotations

import shlex
import sys
import time
from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from schemas import RunError, RunRecord, RunState
from schemas.events import LaunchSpec

from .api import Runwarden
from .private_service import LOCAL_TARGET, add_local_target, private_service

__all__ = ["TOY_TRAINER", "run_demo"]

TOY_TRAINER = Path(__file__).resolve().parent.parent / "examples" / "toy_trainer.py"
STOP_AT_STEP = 20


def _follow_and_stop(
    console: Console, api: Runwarden, run: RunRecord, stop_at: int = STOP_AT_STEP
) -> RunRecord:
    """Shows the run's progress, asks for a snapshot at step `stop_at`, and returns
    the run once it ended."""
    columns = (TextColumn("[bold]training[/]"), BarColumn(),
               TextColumn("step {task.completed:.0f}/{task.total:.0f}  {task.description}"),
               TimeElapsedColumn())  # fmt: skip
    asked = False
    with Progress(*columns, console=console) as progress:
        task = progress.add_task("", total=1000)
        while True:
            current = api.store.follow.last_metrics(run.id)
            if current is not None and current.step is not None:
                loss = f"loss {current.loss:.4f}" if current.loss is not None else ""
                progress.update(task, completed=current.step,
                                total=current.max_steps or 1000, description=loss)  # fmt: skip
                if not asked and current.step >= stop_at:
                    api.stop(run.id, asked_by="demo")
                    progress.console.print(f"snapshot asked at step {current.step}")
                    asked = True
            run = api.get_run(run.id)
            if run.state.is_terminal:
                break
            time.sleep(0.2)
    return run


def _say(console: Console, text: str) -> None:
    """Prints `text` as it is, on one line however narrow the terminal: a path in it
    is never cut by a line break."""
    console.print(text, markup=False, highlight=False, soft_wrap=True)


def _outcome(console: Console, run: RunRecord) -> None:
    console.print(f"state:      [bold]{run.state}[/]")
    if run.snapshot is not None:
        _say(console, f"step:       {run.snapshot.step}")
        _say(console, f"checkpoint: {run.remote_dir}/{run.snapshot.checkpoint}")
        _say(console, f"reason:     {run.snapshot.reason}")
    elif run.message:
        _say(console, f"message:    {run.message}")


def _wait_artifacts(console: Console, api: Runwarden, run: RunRecord) -> RunRecord:
    """Waits (at most a minute) for the run's artifacts to come home verified."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        run = api.get_run(run.id)
        if run.artifacts is not None and run.artifacts.phase != "pending":
            break
        time.sleep(0.2)
    artifacts = run.artifacts
    if artifacts is not None and artifacts.phase == "done":
        _say(
            console,
            f"artifacts:  {artifacts.files} files, {artifacts.bytes} bytes, verified, "
            f"in {artifacts.path}",
        )
    else:
        console.print(f"[red]artifacts not retrieved:[/] {escape(str(artifacts))}", soft_wrap=True)
    return run


def run_demo(console: Console) -> int:
    """Runs the demo; returns the exit code (0 when the run ended stopped)."""
    try:
        with private_service("runwarden-demo-") as (api, state_dir):
            _say(console, f"state directory: {state_dir}")
            try:
                return _demo(console, api, state_dir)
            finally:
                console.print("stopping the service")
    except RunError as error:
        console.print(f"[red]error:[/] {escape(str(error))}", soft_wrap=True)
        return 1
    finally:
        console.print("service stopped")


def _demo(console: Console, api: Runwarden, state_dir: Path) -> int:
    add_local_target(api, state_dir / "work")
    command = shlex.join([sys.executable, "-u", str(TOY_TRAINER), "--steps", "1000",
                          "--step-time", "0.1"])  # fmt: skip
    console.print("service up (embedded Redis, worker, beat); launching the toy trainer")
    run = api.launch(LaunchSpec(target=LOCAL_TARGET, command=command, name="demo"), wait_s=120)
    console.print(f"run [bold]{run.id}[/] in {escape(run.remote_dir)}", soft_wrap=True)
    run = _follow_and_stop(console, api, run)
    _outcome(console, run)
    if run.state is not RunState.STOPPED or run.snapshot is None:
        return 1
    step = run.snapshot.step
    run = _wait_artifacts(console, api, run)
    if run.artifacts is None or run.artifacts.phase != "done":
        return 1
    console.print(f"resuming {run.id} from step {step}")
    resumed = api.launch(api.resume_spec(run.id), wait_s=120)
    console.print(f"run [bold]{resumed.id}[/] in {escape(resumed.remote_dir)}", soft_wrap=True)
    resumed = _follow_and_stop(console, api, resumed, step + STOP_AT_STEP)
    _outcome(console, resumed)
    return 0 if resumed.state is RunState.STOPPED else 1
