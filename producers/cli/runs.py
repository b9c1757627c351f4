"""The commands that act on recorded runs: `retrieve`, `follow`, `stop`, `cancel`."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Annotated

import typer

from .common import (
    app,
    artifacts_line,
    checked_run_id,
    client,
    fail,
    json_option,
    out,
    phase_line,
    print_json,
    print_outcome,
    print_run,
    run_op,
    say,
)

if TYPE_CHECKING:
    from schemas import SnapshotReason

__all__ = ["cancel", "follow", "retrieve", "stop"]

LISTED = 20
"""Run ids a bulk stop's summary lists per line at most (all of them with --json)."""


@app.command()
def retrieve(
    run_id: Annotated[str, typer.Argument(metavar="RUN_ID", help="An ended run.")],
    wait: Annotated[
        bool,
        typer.Option(
            "--wait/--no-wait",
            help="Wait for the retrieval to end (at most "
            "RUNWARDEN_RETRIEVE_MAX_RUNTIME_S + 60 s) and say where the artifacts "
            "are; --no-wait only asks for it (default: wait).",
            show_default=False,
        ),
    ] = True,
    as_json: Annotated[
        bool, json_option("the artifacts' record (with --no-wait: the task's id)")
    ] = False,
) -> None:
    """Retrieve an ended run's artifacts now (again after a failure), verified
    against the target's manifest; exit 1 unless they are done.

    \b
    Examples:
      runwarden retrieve 20260601-020000-kqzmx-gpt
      runwarden retrieve 20260601-020000-kqzmx-gpt --no-wait
    """
    api = client()
    checked = checked_run_id(run_id)
    wait_s = api.settings.retrieve_max_runtime_s + 60 if wait else None
    answer = run_op(lambda: api.retrieve(checked, wait_s=wait_s))
    if not wait:
        if as_json:
            print_json({"run_id": checked, **answer})
        else:
            say(f"retrieval of {checked} asked")
        return
    if as_json:
        print_json(answer.model_dump(mode="json"))
    else:
        say(artifacts_line(answer))
    if answer.phase != "done":
        raise typer.Exit(1)


@app.command()
def follow(
    run_id: Annotated[
        str | None,
        typer.Argument(
            metavar="RUN_ID",
            help="A run to follow again (or --target and --dir).",
            show_default=False,
        ),
    ] = None,
    target: Annotated[
        str | None,
        typer.Option(metavar="NAME", help="With --dir: the target the run directory is on."),
    ] = None,
    dir: Annotated[
        str | None,
        typer.Option(
            "--dir",
            metavar="DIR",
            help="A run directory started elsewhere (by "
            "hand, by overbrainer) to adopt: its absolute path on the target, "
            "holding job.pid.",
        ),
    ] = None,
    as_json: Annotated[bool, json_option("the run's record")] = False,
) -> None:
    """Follow a run again, or adopt a run directory started elsewhere.

    \b
    Examples:
      runwarden follow 20260601-020000-kqzmx-gpt
      runwarden follow --target here --dir /data/runs/started-by-hand
    """
    if (run_id is None) == (dir is None):
        fail("follow takes a run id, or --target and --dir", 2)
    if dir is not None and target is None:
        fail("--dir needs --target", 2)
    api = client()
    run = run_op(lambda: api.follow(run_id and checked_run_id(run_id), target=target, dir=dir))
    print_run(run, as_json, f"following {run.id} ({run.state})")


@app.command()
def stop(
    run_id: Annotated[
        str | None,
        typer.Argument(
            metavar="RUN_ID",
            help="A running run (or a bulk stop: --target with --all, --label or --name-glob).",
            show_default=False,
        ),
    ] = None,
    target: Annotated[
        list[str] | None,
        typer.Option(
            metavar="NAME",
            help="Bulk stop: the target whose runs are selected (repeat for several).",
            show_default=False,
        ),
    ] = None,
    all_runs: Annotated[
        bool,
        typer.Option("--all", help="Bulk stop: every running run of the targets."),
    ] = False,
    label: Annotated[
        list[str] | None,
        typer.Option(
            metavar="KEY=VALUE",
            help="Bulk stop: the runs launched with this label (repeat: all of them).",
            show_default=False,
        ),
    ] = None,
    name_glob: Annotated[
        str | None,
        typer.Option(
            metavar="PATTERN",
            help="Bulk stop: the runs whose name matches PATTERN (fnmatch: * ? [...]).",
            show_default=False,
        ),
    ] = None,
    reason: Annotated[
        str,
        typer.Option(
            metavar="REASON",
            help="Why, recorded in the proof: requested, deadline, cost, disk or preempted.",
        ),
    ] = "requested",
    wait: Annotated[
        bool,
        typer.Option(
            "--wait/--no-wait",
            help="Wait until the run ended and print its "
            "outcome; exit 1 unless it stopped or succeeded (default: no-wait).",
            show_default=False,
        ),
    ] = False,
    timeout: Annotated[
        float | None,
        typer.Option(
            metavar="SECONDS",
            help="With --wait: give up after this many seconds, "
            "exit 1, the stop still in flight (default: wait until the run ended, "
            "at most the proof and end timeouts).",
        ),
    ] = None,
    as_json: Annotated[
        bool, json_option("the stop's record (with --wait: the run's record once it ended)")
    ] = False,
) -> None:
    """Ask the run's job for a snapshot: it saves a checkpoint at the end of its
    step, proves it, and stops; a job that does not is cancelled at the timeouts.
    A bulk stop asks every running run of --target that --all, --label and
    --name-glob select (combined: all of them), one batched write per target, and
    prints what came of each run: asked, already stopping, not running, refused
    (with why); exit 1 when any was refused.

    \b
    Examples:
      runwarden stop 20260601-020000-kqzmx-gpt
      runwarden stop 20260601-020000-kqzmx-gpt --reason cost --wait --timeout 3600
      runwarden stop --target gpu1 --all --reason cost
      runwarden stop --target gpu1 --target gpu2 --label sweep=lr3 --name-glob 'gpt-*'
    """
    from schemas import SnapshotReason

    try:
        why = SnapshotReason(reason)
    except ValueError:
        fail(f"invalid reason {reason!r}: use {', '.join(SnapshotReason)}", 2)
    if run_id is None or target or all_runs or label or name_glob is not None:
        if run_id is not None or wait or timeout is not None:
            fail("a bulk stop takes no run id, --wait or --timeout", 2)
        _stop_many(target or [], all_runs, label or [], name_glob, why, as_json)
        return
    api = client()
    run_id = checked_run_id(run_id)
    stop_state = run_op(lambda: api.stop(run_id, why, asked_by="cli"))
    if as_json and not wait:
        print_json(stop_state.model_dump(mode="json"))
    elif not as_json:
        say(f"{run_id}: snapshot asked ({stop_state.reason})")
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
    if as_json:
        print_json(run.model_dump(mode="json"))
    else:
        print_outcome(run)
    raise typer.Exit(0 if run.state.value in ("stopped", "succeeded") else 1)


def _stop_many(
    targets: list[str],
    all_runs: bool,
    labels: list[str],
    name_glob: str | None,
    reason: SnapshotReason,
    as_json: bool,
) -> None:
    """`stop`'s bulk form: the selection checked here (a clear error, exit 2, before
    anything is published), one `runwarden.stop_many` task, its summary printed."""
    from schemas.events import StopManyBody
    from schemas.labels import parse_labels

    if not targets:
        fail("stop needs a run id, or --target with --all, --label or --name-glob", 2)
    if not all_runs and not labels and name_glob is None:
        fail("a bulk stop selects runs: --all, --label or --name-glob", 2)
    selection = run_op(lambda: parse_labels(labels))
    run_op(
        lambda: StopManyBody(
            targets=tuple(targets), all=all_runs, labels=selection, name_glob=name_glob
        )
    )
    api = client()
    summary = run_op(
        lambda: api.stop_many(
            targets, all=all_runs, labels=selection, name_glob=name_glob, reason=reason,
            asked_by="cli",
        )
    )  # fmt: skip
    if as_json:
        print_json(summary.model_dump(mode="json"))
    else:
        for title, ids in (
            ("asked", summary.asked),
            ("already stopping", summary.already_stopping),
            ("not running", summary.not_running),
        ):
            listed = f" ({', '.join(ids)})" if 0 < len(ids) <= LISTED else ""
            say(f"{title}: {len(ids)}{listed}")
        say(f"refused: {len(summary.refused)}")
        for refusal in summary.refused:
            say(f"  {refusal.run_id}: {refusal.why}")
    if summary.refused:
        raise typer.Exit(1)


@app.command()
def cancel(
    run_id: Annotated[str, typer.Argument(metavar="RUN_ID", help="A running run.")],
    as_json: Annotated[bool, json_option("the run's record")] = False,
) -> None:
    """Cancel the run's job now, without a snapshot: SIGTERM to its process group,
    SIGKILL 10 s later.

    \b
    Example:
      runwarden cancel 20260601-020000-kqzmx-gpt
    """
    api = client()
    run = run_op(lambda: api.cancel(checked_run_id(run_id)))
    if as_json:
        print_json(run.model_dump(mode="json"))
    else:
        print_outcome(run)
