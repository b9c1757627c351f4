"""`runwarden check-trainer`: a training command's conformance to the stop protocol."""

from __future__ import annotations

import os
import shutil
from typing import Annotated, Any

import typer
from rich.table import Table

from .common import app, err, fail, json_option, print_json, print_table, run_op

__all__ = ["check_trainer"]


def _absolute(words: list[str]) -> tuple[list[str], list[str]]:
    """The command with its interpreter found on PATH and every word naming an
    existing file or directory of the current directory made absolute (the job runs
    in its run directory); and a note for each word changed."""
    changed: list[str] = []
    result = list(words)
    if os.sep not in result[0]:
        found = shutil.which(result[0])
        if found is None:
            fail(f"{result[0]}: not found on PATH", 2)
        result[0] = found
    for index, word in enumerate(result):
        if word.startswith("-") or os.path.isabs(word) or not os.path.exists(word):
            continue
        # abspath, not resolve: a venv's python is a link that must stay the venv's.
        result[index] = os.path.abspath(word)
        changed.append(f"{word} -> {result[index]}")
    return result, changed


@app.command(
    "check-trainer",
    context_settings={"allow_interspersed_args": False},
    options_metavar="[OPTIONS] --",
)
def check_trainer(
    command: Annotated[
        list[str] | None,
        typer.Argument(
            metavar="CMD",
            help="The training command and its arguments, after `--`. It runs in a run "
            "directory: words naming files of the current directory are made absolute.",
            show_default=False,
        ),
    ] = None,
    ranks: Annotated[
        int,
        typer.Option(
            metavar="N",
            min=1,
            max=64,
            help="Ranks (1-64). Above 1, a command starting with `python` runs under "
            "`python -m torch.distributed.run --standalone --nproc-per-node=N`; one that "
            "starts its ranks itself (torchrun, accelerate launch) runs as given.",
        ),
    ] = 1,
    warmup_steps: Annotated[
        int, typer.Option(metavar="N", min=1, help="Steps logged before the snapshot is asked.")
    ] = 3,
    proof_timeout: Annotated[
        float,
        typer.Option(metavar="S", min=1, max=86400, help="Seconds from the request to the proof."),
    ] = 120.0,
    end_timeout: Annotated[
        float,
        typer.Option(metavar="S", min=1, max=86400, help="Seconds from the proof to the exit."),
    ] = 60.0,
    max_lag: Annotated[
        int,
        typer.Option(
            metavar="N",
            min=0,
            help="Steps the proof's step may be past the last step logged before the "
            "request: 1 for the step in progress, 1 more where a step is logged after "
            "the request was looked for (the Hugging Face Trainer).",
        ),
    ] = 2,
    start_timeout: Annotated[
        float,
        typer.Option(
            metavar="S",
            min=1,
            max=86400,
            help="Seconds the warm-up (and the resumed run's first step) may take.",
        ),
    ] = 300.0,
    as_json: Annotated[bool, json_option("the report")] = False,
) -> None:
    """Check that a training command honours runwarden's stops: run it under a private
    service on this machine (its own Redis, worker and beat, in a new temporary state
    directory), ask a snapshot after a warm-up, and report the time to the proof, the
    steps run after the request, whether the checkpoint was complete (and loads)
    before the proof, whether every rank stopped at the same step, whether the job
    exited on its own in time, and whether a resume continues the step count. Exit 0
    only when every check passes (1: a check failed; 2: bad usage).

    \b
    Examples:
      runwarden check-trainer -- python train.py --config small.yaml
      runwarden check-trainer --ranks 2 --json -- python train.py
    """
    from ..conformance import TrainerCheck, run_check
    from ..private_service import LOCAL_TARGET, add_local_target, private_service

    if not command:
        fail("give the training command after `--`", 2)
    words, notes = _absolute(command)
    options: dict[str, Any] = {
        "ranks": ranks, "warmup_steps": warmup_steps, "proof_timeout_s": proof_timeout,
        "end_timeout_s": end_timeout, "max_lag": max_lag, "start_timeout_s": start_timeout,
    }  # fmt: skip
    check = run_op(lambda: TrainerCheck(tuple(words), **options))

    def checked() -> int:
        with private_service("runwarden-check-") as (api, state_dir):
            err.print(f"service in {state_dir}", markup=False, highlight=False, soft_wrap=True)
            add_local_target(api, state_dir / "work")
            say = (lambda _: None) if as_json else _progress
            report = run_check(api, LOCAL_TARGET, check, state_dir / "check", say)
        report.notes[:0] = notes
        if as_json:
            print_json(report.to_json())
        else:
            _print_report(report)
        return 0 if report.passed else 1

    raise typer.Exit(run_op(checked))


def _progress(text: str) -> None:
    err.print(f"check-trainer: {text}", markup=False, highlight=False, soft_wrap=True)


def _print_report(report: object) -> None:
    from ..conformance import Report

    assert isinstance(report, Report)
    ranks = "1 rank" if report.ranks == 1 else f"{report.ranks} ranks"
    table = Table(title=f"check-trainer: {report.command} ({ranks})")
    for column in ("check", "result", "measured", "detail"):
        table.add_column(column)
    for check in report.checks:
        result = "[green]pass[/]" if check.passed else "[red]FAIL[/]"
        table.add_row(check.name, result, check.value, check.detail)
    print_table(table)
    for note in report.notes:
        err.print(f"note: {note}", markup=False, highlight=False, soft_wrap=True)
    verdict = "every check passed" if report.passed else "some checks failed"
    err.print(verdict, markup=False, highlight=False)
