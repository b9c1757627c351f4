"""What every command shares: the Typer apps, the consoles, the error handling (one
line on stderr and an exit code, never a traceback for a user error), the client, and
the formatting of runs, stops and artifacts for a terminal.

Every command imports what it uses in its body, and this module imports only typer,
rich and what costs nothing: `runwarden --help` builds the command tree without
loading the models, Celery, the store or the web stack (tests/integration/
producers/test_cli_imports.py checks which modules it loads)."""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Annotated, Any, NoReturn, TypeVar

import typer
from rich.console import Console
from rich.markup import escape
from rich.measure import Measurement
from rich.segment import Segments
from rich.table import Table

from schemas.text import clean_text, format_bytes

from .helpfmt import PlainTyper

if TYPE_CHECKING:
    from schemas import Progress as RunProgress
    from schemas import RunRecord, StopState
    from schemas.chain import Continuation

    from ..api import Runwarden

__all__ = [
    "RunIdArgument",
    "app",
    "artifacts_line",
    "chain_line",
    "checked_run_id",
    "client",
    "continuation_line",
    "err",
    "fail",
    "json_option",
    "one_line",
    "out",
    "phase_line",
    "print_json",
    "print_outcome",
    "print_run",
    "print_table",
    "progress_bar",
    "run_op",
    "say",
    "targets_app",
]

app = PlainTyper(
    name="runwarden",
    help="Run long training jobs on local or SSH targets and stop them gracefully.",
    epilog="Run `runwarden COMMAND --help` for a command's options and examples.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
targets_app = PlainTyper(
    help="Targets: this machine or SSH destinations, where runs go.",
    epilog="Example: runwarden targets add here --workdir /data/runs",
    no_args_is_help=True,
)
app.add_typer(targets_app, name="targets")

out = Console()
err = Console(stderr=True)

RunIdArgument = Annotated[
    str, typer.Argument(metavar="RUN_ID", help="The run's id, as `runwarden runs` lists it.")
]
"""The RUN_ID argument of a command acting on one run."""

_T = TypeVar("_T")


def fail(message: str, code: int = 1) -> NoReturn:
    """Prints `message` as one error line on stderr and exits with `code`."""
    err.print(f"[red]error:[/] {escape(message)}", highlight=False, soft_wrap=True)
    raise typer.Exit(code)


def one_line(error: BaseException) -> str:
    """`error` as one line for a person (a `ValidationError` without its input)."""
    from pydantic import ValidationError

    from schemas import validation_message
    from schemas.text import error_line

    if isinstance(error, ValidationError):
        return validation_message(error)
    return error_line(error)


def run_op(call: Callable[[], _T]) -> _T:
    """Runs `call`, turning our errors into one line on stderr and an exit code."""
    from pydantic import ValidationError

    from schemas import (
        Conflict,
        InvalidPath,
        InvalidRunId,
        NoSnapshots,
        NotFound,
        NotRunning,
        NotStarted,
        RunError,
        StoreError,
        UnknownTarget,
    )
    from schemas.secrets import SecretsError

    from ..api import OperationFailed
    from ..embedded import NotServing

    # Refusals of the request itself (bad input): exit 2. Everything else that fails: 1.
    bad_input = (InvalidRunId, InvalidPath, UnknownTarget, NotFound, ValidationError, ValueError)
    try:
        return call()
    except NotServing as error:
        fail(f"{error} (start it with `runwarden serve`)")
    except (NotStarted, NotRunning, NoSnapshots, Conflict, SecretsError) as error:
        fail(one_line(error), 1)
    except bad_input as error:
        fail(one_line(error), 2)
    except (StoreError, OperationFailed, RunError) as error:
        fail(one_line(error), 1)


def client() -> Runwarden:
    """The API client; with the embedded default, checks that `serve` is running."""
    from schemas import Settings

    from ..api import Runwarden
    from ..embedded import EmbeddedRedis

    settings = Settings()
    if settings.redis_url is None and not EmbeddedRedis(settings).ping():
        fail(
            f"nothing is serving on {settings.embedded_socket}: start `runwarden serve` "
            "(or set RUNWARDEN_REDIS_URL)",
            1,
        )
    return Runwarden(settings)


def print_json(data: Any) -> None:
    """Prints `data` as JSON (datetimes as strings), one document, never wrapped."""
    out.print_json(json.dumps(data, default=str), highlight=False)


def json_option(what: str) -> Any:
    """The `--json` option of a command that prints `what` (a record, a listing)."""
    return typer.Option("--json", help=f"Print {what} as JSON instead of text.")


def say(text: str) -> None:
    """Prints `text` as it is (no markup, no highlighting) on one line however narrow
    the terminal: a path or an id in it is never cut by a line break (a terminal
    narrower than the line folds it on screen only)."""
    out.print(text, markup=False, highlight=False, soft_wrap=True)


def print_table(table: Table) -> None:
    """Prints `table` no narrower than its widest row needs, so that no cell (a path)
    is wrapped mid-line: past the terminal's width its lines fold on screen only."""
    needed = Measurement.get(out, out.options.update_width(1 << 16), table).maximum
    # Rendered at that width, then printed as it is: `print` would narrow it back.
    lines = out.render(table, out.options.update_width(max(out.width, needed)))
    out.print(Segments(lines), soft_wrap=True, crop=False)


def checked_run_id(run_id: str) -> str:
    """`run_id` when valid, else an error line and exit 2."""
    from schemas import InvalidRunId, validate_run_id

    try:
        return validate_run_id(run_id)
    except InvalidRunId as error:
        fail(one_line(error), 2)


def artifacts_line(artifacts: Any) -> str:
    if artifacts.phase == "done":
        size = format_bytes(artifacts.bytes)
        text = f"done: {artifacts.files} files, {size}, verified, in {artifacts.path}"
        skipped = getattr(artifacts, "skipped_links", 0)
        if skipped:
            # Links whose targets are absolute or outside the run directory: listed
            # in the stored manifest.json, never made in the artifact store.
            text += f"; {skipped} link(s) leading outside the run left out"
        return text
    text = f"{artifacts.phase}"
    if artifacts.attempts:
        text += f" after {artifacts.attempts} attempt(s)"
    if artifacts.error:
        text += f"; last error: {artifacts.error}"
    if artifacts.phase == "pending" and artifacts.next_attempt is not None:
        left = (artifacts.next_attempt - datetime.now(UTC)).total_seconds()
        text += f"; next attempt in {max(0.0, left):.0f} s"
    return text


def phase_line(stop: StopState, now: datetime) -> str:
    left = (stop.proof_deadline - now).total_seconds()
    text = f"{stop.phase}, reason {stop.reason}; proof deadline in {max(0, left):.0f} s"
    if stop.end_deadline is not None:
        end_left = (stop.end_deadline - now).total_seconds()
        text += f", end deadline in {max(0, end_left):.0f} s"
    return text


def print_outcome(run: RunRecord) -> None:
    message = f" — {escape(clean_text(run.message))}" if run.message else ""
    out.print(f"{run.id}: [bold]{run.state}[/]{message}", highlight=False, soft_wrap=True)
    if run.snapshot is not None:
        out.print(
            f"  checkpoint {run.remote_dir}/{run.snapshot.checkpoint} "
            f"(step {run.snapshot.step}, {run.snapshot.reason})",
            highlight=False, markup=False, soft_wrap=True,
        )  # fmt: skip


def progress_bar(progress: RunProgress | None, width: int = 20) -> str:
    if progress is None or not progress.max_steps:
        return ""
    step = progress.step or 0
    filled = int(width * min(1.0, step / progress.max_steps))
    loss = f" loss {progress.loss:.4f}" if progress.loss is not None else ""
    return f"{'█' * filled}{'░' * (width - filled)} {step}/{progress.max_steps}{loss}"


def chain_line(chain: list[RunRecord], current: str) -> str:
    """A chain of runs in one line, oldest first: `id (target, state[, preempted])`
    joined by arrows, the shown run marked with `*`."""
    from schemas.chain import is_preempted

    parts = []
    for run in chain:
        what = [run.target, str(run.state)]
        if is_preempted(run.snapshot):
            what.append("preempted")
        mark = "*" if run.id == current else ""
        parts.append(f"{mark}{run.id} ({', '.join(what)})")
    return " -> ".join(parts)


def continuation_line(continuation: Continuation) -> str:
    """Where a preempted run's continuation stands, for people."""
    text = f"{continuation.phase}, preemption {continuation.preemptions} of its chain"
    if continuation.target is not None:
        text += f", on {continuation.target}"
    if continuation.reason:
        text += f": {clean_text(continuation.reason)}"
    return text


def print_run(run: RunRecord, as_json: bool, text: str) -> None:
    """The run's record as JSON with `as_json`, else `text`."""
    if as_json:
        print_json(run.model_dump(mode="json"))
    else:
        say(text)
