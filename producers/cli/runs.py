"""The commands that act on runs: `launch`, `resume`, `retrieve`, `follow`, `stop`,
`cancel`."""

from __future__ import annotations

import shlex
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated

import typer

from producers.api import OperationFailed, Runwarden
from schemas import RunLimits, RunRecord, SnapshotReason
from schemas.events import LaunchSpec
from schemas.idempotency import new_launch_key

from .common import (
    app,
    artifacts_line,
    checked_run_id,
    client,
    fail,
    out,
    phase_line,
    print_outcome,
    run_op,
)

__all__ = ["cancel", "follow", "launch", "resume", "retrieve", "stop"]


@app.command(context_settings={"allow_interspersed_args": False})
def launch(
    command: Annotated[list[str] | None, typer.Argument(help="The job command, after --.")] = None,
    target: Annotated[str, typer.Option(help="Target to run on.")] = "",
    name: Annotated[str, typer.Option(help="A name; its slug goes into the run id.")] = "",
    upload: Annotated[Path | None, typer.Option(help="Directory copied into the run.")] = None,
    skip: Annotated[list[str] | None, typer.Option(help="Top-level entry not uploaded.")] = None,
    secret: Annotated[list[str] | None, typer.Option(help="Secret variable name.")] = None,
    max_hours: Annotated[float | None, typer.Option()] = None,
    max_cost_usd: Annotated[float | None, typer.Option()] = None,
    usd_per_hour: Annotated[float | None, typer.Option()] = None,
    no_disk_policy: Annotated[
        bool, typer.Option(help="Do not ask a snapshot when the disk fills up.")
    ] = False,
    resume_from: Annotated[str | None, typer.Option(help="A stopped run to continue.")] = None,
    no_snapshots: Annotated[bool, typer.Option(help="The job cannot save snapshots.")] = False,
    key: Annotated[
        str | None,
        typer.Option(help="Idempotency key: a launch with a used key returns that run."),
    ] = None,
    preemption: Annotated[
        str | None,
        typer.Option(
            help="Watch the cloud's preemption notices: aws, gcp, azure, auto or off "
            "(default: the target's)."
        ),
    ] = None,
) -> None:
    """Launch a job: runwarden launch --target T [options] -- CMD ARGS..."""
    if not command:
        fail("launch needs a command after --", 2)
    if not target:
        fail("launch needs --target", 2)
    if max_cost_usd is not None and usd_per_hour is None:
        fail("--max-cost-usd needs --usd-per-hour", 2)

    def build() -> LaunchSpec:
        return LaunchSpec(
            target=target, command=shlex.join(command), name=name,
            upload=upload.expanduser().absolute() if upload else None,
            skip=tuple(skip or ()), secrets=tuple(secret or ()),
            limits=RunLimits(max_hours=max_hours, max_cost_usd=max_cost_usd,
                             usd_per_hour=usd_per_hour, disk=not no_disk_policy),
            resume_from=resume_from, snapshots=not no_snapshots,
            key=key or new_launch_key(), preemption=preemption,
        )  # fmt: skip

    spec = run_op(build)
    api = client()
    run = run_op(lambda: _launch_once(api, spec))
    out.print(run.id, highlight=False)


def _launch_once(api: Runwarden, spec: LaunchSpec) -> RunRecord:
    """`api.launch(spec)`, waiting for the upload (a resume: a whole checkpoint) to
    arrive; a launch that fails or is not answered in time names its key, so that the
    same launch given again (`--key`) finds its run instead of starting another job."""
    try:
        return api.launch(spec, wait_s=api.settings.launch_max_runtime_s + 60)
    except OperationFailed as error:
        hint = f"launch key {spec.key}: launched again with --key {spec.key}, no second job"
        raise OperationFailed(f"{error} ({hint})") from error


@app.command()
def resume(
    run_id: str,
    target: Annotated[str | None, typer.Option(help="Another target to run on.")] = None,
    command: Annotated[
        str | None, typer.Option(help="Another job command (shell); an adopted run needs one.")
    ] = None,
    key: Annotated[
        str | None,
        typer.Option(help="Idempotency key: a launch with a used key returns that run."),
    ] = None,
) -> None:
    """Continue a stopped run from its snapshot (as launch --resume-from): the same
    command, upload, secrets and limits; the step count goes on."""
    api = client()
    source = checked_run_id(run_id)
    spec = run_op(lambda: api.resume_spec(source, target=target, command=command))
    spec = run_op(lambda: LaunchSpec.model_validate({**dict(spec), "key": key or new_launch_key()}))
    new = run_op(lambda: _launch_once(api, spec))
    out.print(new.id, highlight=False)


@app.command()
def retrieve(
    run_id: str,
    wait: Annotated[bool, typer.Option(help="Wait for the retrieval to end.")] = True,
) -> None:
    """Retrieve a finished run's artifacts now (again after a failure), verified
    against the target's manifest."""
    api = client()
    checked = checked_run_id(run_id)
    wait_s = api.settings.retrieve_max_runtime_s + 60 if wait else None
    answer = run_op(lambda: api.retrieve(checked, wait_s=wait_s))
    if not wait:
        out.print(f"retrieval of {checked} asked", highlight=False)
        return
    out.print(artifacts_line(answer), highlight=False)
    if answer.phase != "done":
        raise typer.Exit(1)


@app.command()
def follow(
    run_id: Annotated[str | None, typer.Argument()] = None,
    target: Annotated[str | None, typer.Option()] = None,
    dir: Annotated[str | None, typer.Option("--dir", help="A run directory to adopt.")] = None,
) -> None:
    """Follow a run again, or adopt a run directory started elsewhere (--target, --dir)."""
    if (run_id is None) == (dir is None):
        fail("follow takes a run id, or --target and --dir", 2)
    if dir is not None and target is None:
        fail("--dir needs --target", 2)
    api = client()
    run = run_op(lambda: api.follow(run_id and checked_run_id(run_id), target=target, dir=dir))
    out.print(f"following {run.id} ({run.state})", highlight=False)


@app.command()
def stop(
    run_id: str,
    reason: Annotated[str, typer.Option(help="requested, deadline, cost or disk.")] = "requested",
    wait: Annotated[bool, typer.Option(help="Wait until the run ended.")] = False,
    timeout: Annotated[float | None, typer.Option(help="With --wait: at most, in s.")] = None,
) -> None:
    """Ask the run's job for a snapshot; it saves a checkpoint and stops."""
    try:
        why = SnapshotReason(reason)
    except ValueError:
        fail(f"invalid reason {reason!r}: use requested, deadline, cost or disk", 2)
    api = client()
    run_id = checked_run_id(run_id)
    stop_state = run_op(lambda: api.stop(run_id, why, asked_by="cli"))
    out.print(f"{run_id}: snapshot asked ({stop_state.reason})", highlight=False)
    if not wait:
        return
    deadline = None if timeout is None else time.monotonic() + timeout
    with out.status("waiting") as status:
        while True:
            run = run_op(lambda: api.get_run(run_id))
            if run.state.is_terminal:
                break
            current = run_op(lambda: api.get_stop(run_id))
            if current is not None:
                status.update(phase_line(current, datetime.now(UTC)))
            if deadline is not None and time.monotonic() > deadline:
                fail(f"{run_id} has not ended after {timeout:g} s (still {run.state})", 1)
            time.sleep(0.5)
    print_outcome(run)
    raise typer.Exit(0 if run.state.value in ("stopped", "succeeded") else 1)


@app.command()
def cancel(run_id: str) -> None:
    """Cancel the run's job now (no snapshot)."""
    api = client()
    run = run_op(lambda: api.cancel(checked_run_id(run_id)))
    print_outcome(run)
