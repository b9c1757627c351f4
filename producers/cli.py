"""The `runwarden` command line (typer + rich).

Exit codes: 0 success, 1 the operation failed, 2 bad usage or bad input. Errors are
one line on stderr, never a traceback for a user error.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any, NoReturn, TypeVar

import typer
from pydantic import ValidationError
from rich.console import Console
from rich.markup import escape
from rich.table import Column, Table

from schemas import (
    Conflict,
    InvalidPath,
    InvalidRunId,
    NoSnapshots,
    NotFound,
    NotRunning,
    NotStarted,
    RunError,
    RunLimits,
    RunRecord,
    Settings,
    SnapshotReason,
    SshOptions,
    StopState,
    StoreError,
    TargetConfig,
    UnknownTarget,
    validate_run_id,
)
from schemas import (
    Progress as RunProgress,
)
from schemas.events import LaunchSpec

from .api import OperationFailed, Runwarden
from .demo import run_demo
from .embedded import EmbeddedRedis, NotServing

__all__ = ["app", "main"]

app = typer.Typer(
    name="runwarden",
    help="Run long training jobs on local or SSH targets and stop them gracefully.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
targets_app = typer.Typer(help="Targets: this machine or SSH destinations.", no_args_is_help=True)
app.add_typer(targets_app, name="targets")

out = Console()
err = Console(stderr=True)

_T = TypeVar("_T")
# Refusals of the request itself (bad input): exit 2. Everything else that fails: 1.
_BAD_INPUT = (InvalidRunId, InvalidPath, UnknownTarget, NotFound, ValidationError, ValueError)


def fail(message: str, code: int = 1) -> NoReturn:
    err.print(f"[red]error:[/] {escape(message)}", highlight=False, soft_wrap=True)
    raise typer.Exit(code)


def _one_line(error: BaseException) -> str:
    if isinstance(error, ValidationError):
        return "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or 'input'}: {e['msg']}"
            for e in error.errors(include_input=False)
        )
    return " ".join(str(error).split()) or type(error).__name__


def run_op(call: Callable[[], _T]) -> _T:
    """Runs `call`, turning our errors into one line on stderr and an exit code."""
    try:
        return call()
    except NotServing as error:
        fail(f"{error} (start it with `runwarden serve`)")
    except (NotStarted, NotRunning, NoSnapshots, Conflict) as error:
        fail(_one_line(error), 1)
    except _BAD_INPUT as error:
        fail(_one_line(error), 2)
    except (StoreError, OperationFailed, RunError) as error:
        fail(_one_line(error), 1)


def client() -> Runwarden:
    """The API client; with the embedded default, checks that `serve` is running."""
    settings = Settings()
    if settings.redis_url is None and not EmbeddedRedis(settings).ping():
        fail(
            f"nothing is serving on {settings.embedded_socket}: start `runwarden serve` "
            "(or set RUNWARDEN_REDIS_URL)",
            1,
        )
    return Runwarden(settings)


def _json(data: Any) -> None:
    out.print_json(json.dumps(data, default=str), highlight=False)


def _checked_run_id(run_id: str) -> str:
    try:
        return validate_run_id(run_id)
    except InvalidRunId as error:
        fail(_one_line(error), 2)


# --- serve --------------------------------------------------------------------------


@app.command()
def serve(
    concurrency: Annotated[int, typer.Option(min=1, max=64, help="Worker processes.")] = 2,
    flower: Annotated[bool, typer.Option(help="Also run Flower.")] = False,
    flower_port: Annotated[int, typer.Option(min=1, max=65535)] = 5555,
) -> None:
    """Run the service in the foreground: Redis (embedded default), worker and beat."""
    settings = Settings()
    settings.state_dir.mkdir(parents=True, exist_ok=True)
    embedded = EmbeddedRedis(settings) if settings.redis_url is None else None
    if embedded is not None:
        try:
            embedded.start()
        except NotServing as error:
            fail(str(error), 1)
        out.print(f"redis: embedded, {settings.embedded_socket}")
    env = dict(os.environ)
    procs: list[subprocess.Popen[bytes]] = []
    python = sys.executable
    commands = [
        [python, "-m", "workers.reaper", "--restart", "--",
         python, "-m", "celery", "-A", "workers.app", "worker", "-Q", "runwarden",
         "-c", str(concurrency), "-E", "-n", "runwarden@%h", "--loglevel", "INFO"],
        # Retrievals download for as long as they take, on a worker of their own.
        [python, "-m", "workers.reaper", "--restart", "--",
         python, "-m", "celery", "-A", "workers.app", "worker", "-Q", "runwarden.retrieve",
         "-c", "1", "-E", "-n", "retrieve@%h", "--loglevel", "INFO"],
        [python, "-m", "celery", "-A", "workers.app", "beat", "--loglevel", "INFO",
         "-s", str(settings.state_dir / "beat-schedule")],
    ]  # fmt: skip
    if flower:
        commands.append(
            [python, "-m", "celery", "-A", "workers.app", "flower",
             f"--port={flower_port}", "--address=127.0.0.1"]
        )  # fmt: skip
    stopping = False

    def on_signal(signum: int, _frame: object) -> None:
        nonlocal stopping
        stopping = True

    previous = signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    try:
        for command in commands:
            procs.append(subprocess.Popen(command, env=env, start_new_session=True))
        out.print(f"serving: worker (concurrency {concurrency}), retrieval worker, beat"
                  + (f", flower on http://127.0.0.1:{flower_port}" if flower else "")
                  + " — Ctrl-C stops everything")  # fmt: skip
        while not stopping and all(p.poll() is None for p in procs):
            time.sleep(0.2)
    finally:
        signal.signal(signal.SIGINT, previous)
        # Soft shutdown: the worker finishes what it runs (a cancel runs to its end).
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        if embedded is not None:
            embedded.stop()
    failed = [p for p in procs if p.returncode not in (0, -signal.SIGTERM, None)]
    raise typer.Exit(1 if failed and not stopping else 0)


# --- targets ------------------------------------------------------------------------


@targets_app.command("add")
def targets_add(
    name: str,
    workdir: Annotated[str, typer.Option(help="Absolute directory of the run directories.")],
    ssh: Annotated[str | None, typer.Option(help="user@host[:port] or ssh config alias")] = None,
    port: Annotated[int | None, typer.Option(min=1, max=65535)] = None,
    identity: Annotated[Path | None, typer.Option()] = None,
    known_hosts: Annotated[Path | None, typer.Option()] = None,
    ssh_config: Annotated[Path | None, typer.Option()] = None,
) -> None:
    """Add (or replace) a target."""

    def build() -> TargetConfig:
        options = None
        if ssh is not None:
            options = SshOptions(
                destination=ssh, port=port,
                identity=str(identity.expanduser().absolute()) if identity else None,
                known_hosts=str(known_hosts.expanduser().absolute()) if known_hosts else None,
                ssh_config=str(ssh_config.expanduser().absolute()) if ssh_config else None,
            )  # fmt: skip
        elif any(v is not None for v in (port, identity, known_hosts, ssh_config)):
            raise ValueError("--port, --identity, --known-hosts and --ssh-config need --ssh")
        return TargetConfig(
            name=name, kind="ssh" if options else "local", workdir=workdir, ssh=options
        )

    config = run_op(build)
    api = client()
    run_op(lambda: api.add_target(config))
    out.print(f"target {name}: {config.kind}, {config.workdir}", markup=False, soft_wrap=True)


@targets_app.command("ls")
def targets_ls(as_json: Annotated[bool, typer.Option("--json")] = False) -> None:
    """List targets."""
    api = client()
    targets = run_op(api.list_targets)
    if as_json:
        _json([t.model_dump(mode="json") for t in targets])
        return
    table = Table("name", "kind", "workdir", "ssh")
    for t in targets:
        table.add_row(t.name, t.kind, escape(t.workdir), escape(t.ssh.destination) if t.ssh else "")
    out.print(table)


@targets_app.command("rm")
def targets_rm(name: str) -> None:
    """Remove a target."""
    api = client()
    if not run_op(lambda: api.remove_target(name)):
        fail(f"no target {name!r}", 2)
    out.print(f"removed target {name}")


# --- runs ---------------------------------------------------------------------------


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
        )  # fmt: skip

    spec = run_op(build)
    api = client()
    # A launch waits for its upload (a resume: a whole checkpoint) to arrive.
    run = run_op(lambda: api.launch(spec, wait_s=api.settings.launch_max_runtime_s + 60))
    out.print(run.id, highlight=False)


@app.command()
def resume(
    run_id: str,
    target: Annotated[str | None, typer.Option(help="Another target to run on.")] = None,
    command: Annotated[
        str | None, typer.Option(help="Another job command (shell); an adopted run needs one.")
    ] = None,
) -> None:
    """Continue a stopped run from its snapshot (as launch --resume-from): the same
    command, upload, secrets and limits; the step count goes on."""
    api = client()
    source = _checked_run_id(run_id)
    spec = run_op(lambda: api.resume_spec(source, target=target, command=command))
    new = run_op(lambda: api.launch(spec, wait_s=api.settings.launch_max_runtime_s + 60))
    out.print(new.id, highlight=False)


@app.command()
def retrieve(
    run_id: str,
    wait: Annotated[bool, typer.Option(help="Wait for the retrieval to end.")] = True,
) -> None:
    """Retrieve a finished run's artifacts now (again after a failure), verified
    against the target's manifest."""
    api = client()
    checked = _checked_run_id(run_id)
    wait_s = api.settings.retrieve_max_runtime_s + 60 if wait else None
    answer = run_op(lambda: api.retrieve(checked, wait_s=wait_s))
    if not wait:
        out.print(f"retrieval of {checked} asked", highlight=False)
        return
    out.print(_artifacts_line(answer), highlight=False)
    if answer.phase != "done":
        raise typer.Exit(1)


def _size(count: int) -> str:
    value = float(count)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} TiB"


def _artifacts_line(artifacts: Any) -> str:
    if artifacts.phase == "done":
        size = _size(artifacts.bytes)
        return f"done: {artifacts.files} files, {size}, verified, in {artifacts.path}"
    text = f"{artifacts.phase}"
    if artifacts.attempts:
        text += f" after {artifacts.attempts} attempt(s)"
    if artifacts.error:
        text += f"; last error: {artifacts.error}"
    if artifacts.phase == "pending" and artifacts.next_attempt is not None:
        left = (artifacts.next_attempt - datetime.now(UTC)).total_seconds()
        text += f"; next attempt in {max(0.0, left):.0f} s"
    return text


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
    run = run_op(lambda: api.follow(run_id and _checked_run_id(run_id), target=target, dir=dir))
    out.print(f"following {run.id} ({run.state})", highlight=False)


def _phase_line(stop: StopState, now: datetime) -> str:
    left = (stop.proof_deadline - now).total_seconds()
    text = f"{stop.phase}, reason {stop.reason}; proof deadline in {max(0, left):.0f} s"
    if stop.end_deadline is not None:
        end_left = (stop.end_deadline - now).total_seconds()
        text += f", end deadline in {max(0, end_left):.0f} s"
    return text


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
    run_id = _checked_run_id(run_id)
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
                status.update(_phase_line(current, datetime.now(UTC)))
            if deadline is not None and time.monotonic() > deadline:
                fail(f"{run_id} has not ended after {timeout:g} s (still {run.state})", 1)
            time.sleep(0.5)
    _print_outcome(run)
    raise typer.Exit(0 if run.state.value in ("stopped", "succeeded") else 1)


@app.command()
def cancel(run_id: str) -> None:
    """Cancel the run's job now (no snapshot)."""
    api = client()
    run = run_op(lambda: api.cancel(_checked_run_id(run_id)))
    _print_outcome(run)


def _print_outcome(run: RunRecord) -> None:
    message = f" — {escape(run.message)}" if run.message else ""
    out.print(f"{run.id}: [bold]{run.state}[/]{message}", highlight=False, soft_wrap=True)
    if run.snapshot is not None:
        out.print(
            f"  checkpoint {run.remote_dir}/{run.snapshot.checkpoint} "
            f"(step {run.snapshot.step}, {run.snapshot.reason})",
            highlight=False, markup=False, soft_wrap=True,
        )  # fmt: skip


def _bar(progress: RunProgress | None, width: int = 20) -> str:
    if progress is None or not progress.max_steps:
        return ""
    step = progress.step or 0
    filled = int(width * min(1.0, step / progress.max_steps))
    loss = f" loss {progress.loss:.4f}" if progress.loss is not None else ""
    return f"{'█' * filled}{'░' * (width - filled)} {step}/{progress.max_steps}{loss}"


@app.command()
def runs(as_json: Annotated[bool, typer.Option("--json")] = False) -> None:
    """List runs, newest first."""
    api = client()
    records = run_op(api.list_runs)
    if as_json:
        _json([r.model_dump(mode="json") for r in records])
        return
    table = Table(Column("run", no_wrap=True), "target", Column("state", no_wrap=True),
                  "progress", "artifacts", "created")  # fmt: skip
    for r in records:
        progress = run_op(lambda r=r: api.store.last_metrics(r.id))  # type: ignore[misc]
        artifacts = "" if r.artifacts is None else str(r.artifacts.phase)
        if r.artifacts is not None and r.artifacts.phase == "pending" and r.artifacts.error:
            artifacts += f" ({r.artifacts.attempts} failed)"
        table.add_row(r.id, r.target, str(r.state), _bar(progress), artifacts,
                      r.created.strftime("%F %T"))  # fmt: skip
    out.print(table)


@app.command()
def show(run_id: str, as_json: Annotated[bool, typer.Option("--json")] = False) -> None:
    """Show one run."""
    api = client()
    run = run_op(lambda: api.get_run(_checked_run_id(run_id)))
    if as_json:
        _json(run.model_dump(mode="json"))
        return
    for key, value in run.model_dump(mode="json").items():
        if key == "artifacts":
            continue
        out.print(f"[bold]{key:12}[/] {escape(str(value))}", highlight=False, soft_wrap=True)
    if run.artifacts is not None:
        line = _artifacts_line(run.artifacts)
        out.print(f"[bold]{'artifacts':12}[/] {escape(line)}", highlight=False, soft_wrap=True)
    progress = run_op(lambda: api.store.last_metrics(run.id))
    if progress is not None:
        out.print(f"[bold]{'progress':12}[/] {_bar(progress)}")
    current = run_op(lambda: api.get_stop(run.id))
    if current is not None:
        out.print(f"[bold]{'stop':12}[/] {_phase_line(current, datetime.now(UTC))}")


@app.command()
def logs(
    run_id: str,
    follow_: Annotated[bool, typer.Option("-f", "--follow", help="Keep following.")] = False,
) -> None:
    """Print the run's log lines (as followed by the workers)."""
    api = client()
    run_id = _checked_run_id(run_id)
    run_op(lambda: api.get_run(run_id))
    after = "0-0"
    while True:
        entries = run_op(
            lambda after=after: api.store.read_log(run_id, after_id=after, count=1000)  # type: ignore[misc]
        )
        for entry in entries:
            out.print(entry.line, highlight=False, markup=False, soft_wrap=True)
            after = entry.id
        if not follow_:
            return
        if not entries:
            if run_op(lambda: api.get_run(run_id)).state.is_terminal:
                return
            time.sleep(0.5)


@app.command()
def stops(as_json: Annotated[bool, typer.Option("--json")] = False) -> None:
    """List the stops in flight: phase, reason, deadlines, time left."""
    api = client()
    current = run_op(api.list_stops)
    fields = ("run_id", "phase", "reason", "asked_at", "proof_deadline", "end_deadline")
    if as_json:
        _json([{f: s.model_dump(mode="json")[f] for f in fields} for s in current])
        return
    now = datetime.now(UTC)
    table = Table(Column("run", no_wrap=True), "phase", "reason", "asked by", "asked at",
                  "time left")  # fmt: skip
    for s in current:
        table.add_row(s.run_id, str(s.phase), str(s.reason), escape(s.asked_by),
                      s.asked_at.strftime("%T"), _phase_line(s, now).split("; ", 1)[1])  # fmt: skip
    out.print(table)


@app.command()
def demo() -> None:
    """Start the service (embedded), launch the toy trainer, stop it with a snapshot."""
    raise typer.Exit(run_demo(out))


def main() -> None:
    """Console-script entry point."""
    try:
        app()
    except KeyboardInterrupt:
        err.print("interrupted")
        sys.exit(130)


if __name__ == "__main__":
    main()
