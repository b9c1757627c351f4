"""The `runwarden` command line end to end against one real redis-server, Celery worker
and beat (bench/harness/pipeline.py, shortened clocks) shared by the module; `serve` and
`demo` run the embedded default in their own state directories. Most commands run in
this process through typer's test runner (`run_cli`); the entry point itself
(`python -m producers.cli`) as a subprocess for the launch of the module's run, a
`stop --wait`, `logs -f`, `serve` and `demo`.

Checked for every command: the exit code (0 success, 1 the operation failed, 2 bad
usage or input), the output, the JSON shapes of `schemas`, one `error: ...` line on
stderr for an error, and never a traceback.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from types import FrameType

import pytest
import typer.main
from rich.console import Console
from typer.testing import CliRunner

from bench.harness.pipeline import CLOCKS, Pipeline, running_pipeline, signed
from bench.harness.processes import kill_job_groups, kill_processes_in
from bench.harness.users import as_the_worker_args
from producers import cli
from producers.cli import common as cli_common
from schemas import (
    Artifacts,
    RunRecord,
    RunState,
    Settings,
    SshOptions,
    StopState,
    TargetConfig,
    UnknownTarget,
    validate_run_id,
)
from schemas.auth import new_task_id
from schemas.events import TASK_FOLLOW
from workers.cgroups import CGROUP_PARENT, hierarchy

from ...conftest import JOBSIDE, ROOT, TOY_TRAINER, wait_for

pytestmark = pytest.mark.slow

AS_THE_WORKER = as_the_worker_args()
"""`targets add`'s options for a local target whose jobs run as this process's user."""

TOY = [sys.executable, "-u", str(TOY_TRAINER), "--steps", "100000", "--step-time", "0.05"]
"""The toy trainer as launch's command words (after `--`): runs for hours unless
stopped."""
UNKNOWN_RUN = "20990101-000000-nobody"
"""A valid run id that no run has."""
NARROW = {"COLUMNS": "80"}
"""rich's width when stdout is not a terminal (a pipe, a file) and COLUMNS is unset.
Every command runs with COLUMNS=200 (a wide terminal: tables and paths stay on one
line) unless a test passes this."""
STOP_FIELDS = set(StopState.model_fields)
"""`stops --json` carries the whole record, as `/api/stops` does."""


# --- running the CLI ----------------------------------------------------------------


def _base_env(env: dict[str, str]) -> dict[str, str]:
    """`env` without what would change rich's output (a terminal size, forced colours)."""
    drop = {"COLUMNS", "LINES", "FORCE_COLOR", "TTY_COMPATIBLE", "TTY_INTERACTIVE"}
    return {k: v for k, v in env.items() if k not in drop}


OWN_PROCESS = frozenset({"serve", "demo"})
"""Commands always run as a process of their own: they start services and child
processes and install signal handlers, which a test process must not get."""


def run_cli(
    env: dict[str, str],
    *args: str,
    timeout: float = 120.0,
    extra: dict[str, str] | None = None,
    own_process: bool = False,
) -> subprocess.CompletedProcess[str]:
    """Runs `runwarden ARGS` with the environment `env` (COLUMNS=200, then `extra` on
    top), an empty stdin and the repository as working directory; returns its exit
    code, stdout and stderr. Fails the test when its output holds a traceback, when
    it raised an unexpected exception (its traceback shown), whatever the exit code,
    and when it has not ended within `timeout` seconds.

    In this process by default (typer's test runner: no interpreter start-up and
    imports, about 1 s of CPU a call), which gives what a subprocess would (the
    exit code, the two streams apart, no terminal). With `own_process`, and for the
    commands of `OWN_PROCESS`, a real `python -m producers.cli` subprocess: the entry
    point itself, real pipes, signals."""
    full_env = {**_base_env(env), "COLUMNS": "200", **(extra or {})}
    if own_process or (args and args[0] in OWN_PROCESS):
        result = subprocess.run(
            [sys.executable, "-m", "producers.cli", *args],
            env=full_env,
            cwd=ROOT,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
    else:
        result = _in_process(full_env, list(args), timeout)
    assert "Traceback" not in result.stdout + result.stderr, show(result)
    return result


class _Hung(BaseException):
    """Raised in the main thread when a command run in this process outlives its
    timeout. Not an `Exception`: no `except Exception` of the CLI or of a library
    (redis, Celery) turns it into an ordinary error line and exit code."""


@contextlib.contextmanager
def _alarm(seconds: float) -> Iterator[None]:
    """Raises `_Hung` in the main thread after `seconds` (outside the main thread:
    nothing, pytest-timeout still guards the test). pytest-timeout's own SIGALRM
    timer is kept: when its deadline comes first its handler runs, and it is armed
    again afterwards with the time it had left."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    started = time.monotonic()
    outer = signal.getsignal(signal.SIGALRM)
    outer_left, outer_interval = signal.getitimer(signal.ITIMER_REAL)
    outer_first = 0 < outer_left < seconds
    fired = []

    def on_alarm(signum: int, frame: FrameType | None) -> None:
        fired.append(signum)
        if outer_first and callable(outer):
            outer(signum, frame)  # pytest-timeout's: fails the test
        raise _Hung

    signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, outer_left if outer_first else seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, outer if outer is not None else signal.SIG_DFL)
        if outer_left > 0 and not fired:
            left = outer_left - (time.monotonic() - started)
            signal.setitimer(signal.ITIMER_REAL, max(left, 0.001), outer_interval)


@contextlib.contextmanager
def _environment(env: dict[str, str]) -> Iterator[None]:
    """`os.environ` is exactly `env` inside, as a subprocess's would be."""
    saved = dict(os.environ)
    os.environ.clear()
    os.environ.update(env)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


_RUNWARDEN = typer.main.get_command(cli.app)
"""The command `runwarden` runs: `producers.cli.main` calls `app()`, which builds it."""


def _fresh_consoles() -> None:
    """Builds the CLI's two consoles again, as `producers/cli/common.py` does at import
    in a new process: rich reads the environment (COLUMNS, FORCE_COLOR, TTY_*) and
    whether stdout is a terminal once, in `Console()`; the stream itself (`file=None`)
    is looked up at each print, so they write to the runner's streams."""
    for console in (cli_common.out, cli_common.err):
        Console.__init__(console, stderr=console.stderr)


def _in_process(
    env: dict[str, str], args: list[str], timeout: float
) -> subprocess.CompletedProcess[str]:
    """`runwarden ARGS` run by typer's test runner in this process: see `run_cli`. Help
    pages come out 80 columns wide (the runner's width for them), not the terminal's."""
    code, failure = 0, ""
    with (
        _environment(env),
        contextlib.chdir(ROOT),
        CliRunner().isolation() as (stdout, stderr, _),
    ):
        _fresh_consoles()
        try:
            with _alarm(timeout):
                _RUNWARDEN.main(args=args, prog_name="runwarden")
        except SystemExit as exit_:
            code = exit_.code if isinstance(exit_.code, int) else int(exit_.code is not None)
        except _Hung:
            code, failure = 1, f"has not ended within {timeout:g} s:\n{traceback.format_exc()}"
        except Exception:  # noqa: BLE001 - a subprocess would print its traceback
            code, failure = 1, f"raised:\n{traceback.format_exc()}"
        sys.stdout.flush()
        sys.stderr.flush()
        # Read here: the runner's streams are closed once its wrappers are collected.
        result = subprocess.CompletedProcess(
            [sys.executable, "-m", "producers.cli", *args],
            code,
            stdout.getvalue().decode(),
            stderr.getvalue().decode(),
        )
    if failure:
        pytest.fail(f"{show(result)}--- {failure}", pytrace=False)
    return result


def show(result: subprocess.CompletedProcess[str]) -> str:
    """The result, for a failure message."""
    return (
        f"$ runwarden {shlex.join(result.args[3:])}\nexit {result.returncode}\n"
        f"--- stdout\n{result.stdout}--- stderr\n{result.stderr}"
    )


def ok(result: subprocess.CompletedProcess[str]) -> str:
    """Asserts exit 0 and nothing on stderr; returns stdout."""
    assert result.returncode == 0, show(result)
    assert result.stderr == "", show(result)
    return result.stdout


def refused(result: subprocess.CompletedProcess[str], code: int, *needles: str) -> str:
    """Asserts exit `code`, nothing on stdout and exactly one `error: ...` line on
    stderr holding every one of `needles`; returns that line."""
    assert result.returncode == code, show(result)
    assert result.stdout == "", show(result)
    lines = result.stderr.splitlines()
    assert len(lines) == 1, show(result)
    assert lines[0].startswith("error: "), show(result)
    for needle in needles:
        assert needle in lines[0], show(result)
    return lines[0]


def as_json(result: subprocess.CompletedProcess[str]) -> object:
    return json.loads(ok(result))


def flat(text: str) -> str:
    """`text` without any whitespace: what a wrapped line still holds."""
    return "".join(text.split())


# --- fixtures -----------------------------------------------------------------------


def _kill_jobs(pipeline: Pipeline) -> None:
    """SIGKILLs the group of every job of a run not recorded as ended (best effort,
    for a test that failed half-way)."""
    with contextlib.suppress(Exception):
        kill_job_groups(run for run in pipeline.api.list_runs() if not run.state.is_terminal)


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pipeline]:
    with running_pipeline(tmp_path_factory.mktemp("cli")) as started:
        try:
            yield started
        finally:
            _kill_jobs(started)


def rw(pipeline: Pipeline, *args: str, **kwargs: object) -> subprocess.CompletedProcess[str]:
    """`runwarden ARGS` against the module's pipeline."""
    return run_cli(pipeline.env, *args, **kwargs)  # type: ignore[arg-type]


def launch(pipeline: Pipeline, *args: str) -> str:
    """`runwarden launch ARGS` (exit 0 asserted); returns the run id it printed."""
    return ok(rw(pipeline, "launch", *args)).strip()


@dataclass
class Launched:
    run_id: str
    result: subprocess.CompletedProcess[str]


@pytest.fixture(scope="module")
def running(pipeline: Pipeline) -> Iterator[Launched]:
    """One toy trainer launched through the CLI, left running for the module's read-only
    tests (runs, show, logs, follow...), past step 12 (a `step 10/...` line is out)."""
    # The entry point as a person runs it: a process of its own, its output through pipes.
    result = rw(pipeline, "launch", "--target", "local", "--", *TOY, own_process=True)
    run_id = ok(result).strip()
    pipeline.wait_step(run_id, 12)
    yield Launched(run_id, result)
    with contextlib.suppress(Exception):
        pipeline.api.cancel(run_id)


# --- targets ------------------------------------------------------------------------


def test_targets_add_ls_rm(pipeline: Pipeline, tmp_path: Path) -> None:
    scratch = tmp_path / "scratch"
    out = ok(rw(pipeline, "targets", "add", "scratch", "--workdir", str(scratch)))
    assert out.strip() == f"target scratch: local, {scratch}"
    # Adding an SSH target needs no reachable server; relative key paths become absolute.
    out = ok(
        rw(
            pipeline, "targets", "add", "gpu", "--workdir", "/srv/runs",
            "--ssh", "user@host:2222", "--identity", "keys/id_ed25519",
            "--known-hosts", "keys/known_hosts",
        )
    )  # fmt: skip
    assert out.strip() == "target gpu: ssh, /srv/runs"
    out = ok(rw(pipeline, "targets", "add", "mine", "--workdir", "/srv/mine", "--run-as", "nobody"))
    assert out.strip() == "target mine: local, /srv/mine, jobs run as nobody"
    out = ok(rw(pipeline, "targets", "add", "spot", "--workdir", "/srv/s", "--preemption", "aws"))
    assert out.strip() == "target spot: local, /srv/s, aws preemption notices watched"

    table = ok(rw(pipeline, "targets", "ls"))
    rows = {line.split()[1]: line for line in table.splitlines() if line.startswith("│")}
    assert set(rows) >= {"local", "scratch", "gpu"}, table
    assert "user@host:2222" in rows["gpu"]
    assert "/srv/runs" in rows["gpu"]
    assert str(scratch) in rows["scratch"]
    assert " local " in rows["scratch"]
    assert " nobody " in rows["mine"]
    assert rows["spot"].split("│")[-3].strip() == "aws"
    assert {row.split("│")[-2].strip() for row in rows.values()} == {"yes"}
    # A record written into Redis by anyone but the operator: shown, marked, refused.
    forged = {**pipeline.api.store.targets.get("scratch"), "name": "forged"}
    pipeline.api.store.targets.put("forged", forged, "0" * 64)
    rows = {line.split()[1]: line for line in ok(rw(pipeline, "targets", "ls")).splitlines()
            if line.startswith("│")}  # fmt: skip
    assert "NO: refused by the workers" in rows["forged"]

    listed = as_json(rw(pipeline, "targets", "ls", "--json"))
    assert isinstance(listed, list)
    for item in listed:
        assert set(item) == {*TargetConfig.model_fields, "verified"}, item
        TargetConfig.model_validate({k: v for k, v in item.items() if k != "verified"})
    by_name = {item["name"]: item for item in listed}
    assert by_name["scratch"] == {
        "name": "scratch", "kind": "local", "workdir": str(scratch), "ssh": None,
        "allow_secrets": [], "upload_roots": [], "run_as": None, "preemption": "off", "slurm": None,
        "producers": None, "verified": True,
    }  # fmt: skip
    assert by_name["forged"]["verified"] is False
    assert by_name["mine"]["run_as"] == "nobody"
    assert by_name["spot"]["preemption"] == "aws"
    gpu = by_name["gpu"]
    assert (gpu["kind"], gpu["workdir"]) == ("ssh", "/srv/runs")
    assert set(gpu["ssh"]) == set(SshOptions.model_fields)
    assert gpu["ssh"]["destination"] == "user@host:2222"
    assert gpu["ssh"]["identity"] == str(ROOT / "keys" / "id_ed25519")
    assert gpu["ssh"]["known_hosts"] == str(ROOT / "keys" / "known_hosts")
    assert gpu["ssh"]["ssh_config"] is None

    # An explicit port is kept apart from the destination.
    ok(rw(pipeline, "targets", "add", "gpu2", "--workdir", "/srv", "--ssh", "u@h", "--port", "22"))
    ssh2 = pipeline.api.store.targets.get("gpu2")["ssh"]
    assert (ssh2["destination"], ssh2["port"]) == ("u@h", 22)

    for name in ("gpu", "gpu2", "scratch", "mine", "spot", "forged"):
        assert ok(rw(pipeline, "targets", "rm", name)).strip() == f"removed target {name}"
    refused(rw(pipeline, "targets", "rm", "gpu"), 2, "no target 'gpu'")
    names = {t["name"] for t in as_json(rw(pipeline, "targets", "ls", "--json"))}  # type: ignore[attr-defined]
    assert "local" in names
    assert not names & {"gpu", "gpu2", "scratch", "mine", "spot"}


def test_targets_add_a_slurm_cluster(pipeline: Pipeline) -> None:
    out = ok(
        rw(
            pipeline, "targets", "add", "hpc", "--slurm", "--workdir", "/shared/runs",
            "--ssh", "me@login1", "--partition", "gpu", "--account", "ml",
            "--sbatch-arg=--time=12:00:00", "--sbatch-arg=--gres=gpu:4", "--signal-lead", "600",
        )
    )  # fmt: skip
    assert out.strip() == "target hpc: Slurm through ssh login, /shared/runs"
    slurm = pipeline.api.store.targets.get("hpc")["slurm"]
    assert slurm == {
        "partition": "gpu", "account": "ml", "signal_lead_s": 600,
        "sbatch_args": ["--time=12:00:00", "--gres=gpu:4"],
    }  # fmt: skip
    table = ok(rw(pipeline, "targets", "ls"))
    assert "slurm (ssh login)" in table
    # What runwarden sets itself, an option not in the long form, Slurm options without
    # --slurm, a cloud's notices on Slurm: each refused with its reason, nothing written.
    add = ("targets", "add", "bad", "--workdir", "/w")
    refused(rw(pipeline, *add, "--slurm", "--sbatch-arg=--export=NONE"), 2, "set by runwarden")
    refused(rw(pipeline, *add, "--slurm", "--sbatch-arg=-t 5"), 2, "--name or --name=value")
    refused(rw(pipeline, *add, "--partition", "gpu"), 2, "need --slurm")
    refused(rw(pipeline, *add, "--slurm", "--preemption", "aws"), 2, "preemption must be off")
    refused(rw(pipeline, *add, "--slurm", "--run-as", "nobody"), 2, "run_as is not supported")
    with pytest.raises(UnknownTarget):
        pipeline.api.store.targets.get("bad")
    assert ok(rw(pipeline, "targets", "rm", "hpc")).strip() == "removed target hpc"


def test_targets_add_refuses_an_upload_root_holding_or_inside_the_state(
    pipeline: Pipeline,
) -> None:
    """An upload root that holds the state or secrets directory (`--upload-root ~` with
    the default state directory), or is inside one, is refused when the target is
    added, saying why: every launch from it would be refused, and an upload of it
    would copy every producer's key into a run directory."""
    settings = pipeline.api.settings
    state = settings.state_dir
    add = ("targets", "add", "t", "--workdir", "/srv", "--upload-root")
    for root in (state.parent, state, settings.secrets.path / "sub"):
        refused(rw(pipeline, *add, str(root)), 2, "which is never uploaded")
        with pytest.raises(UnknownTarget):
            pipeline.api.store.targets.get("t")
    ok(rw(pipeline, *add, str(pipeline.tmp)))
    assert ok(rw(pipeline, "targets", "rm", "t")).strip() == "removed target t"


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--workdir", "/srv", "--port", "2222"], "need --ssh"),
        (["--workdir", "/srv", "--identity", "id"], "need --ssh"),
        (["--workdir", "relative/dir"], "not an absolute path"),
        (["--workdir", "/srv", "--ssh", "u@h", "--port", "0"], ""),  # typer's range check
        (["--workdir", "/srv", "--ssh", "u@h", "--run-as", "root"], "run_as root is for local"),
        (["--workdir", "/srv", "--run-as", "$(touch PWNED)"], "is not a user name"),
        (["--workdir", "/srv", "--allow-secret", "IFS"], "the shells that start the job set"),
        (["--workdir", "/srv", "--allow-secret", "RUNWARDEN_MARK"], "the service's own"),
        (["--workdir", "/srv", "--preemption", "oracle"], "preemption"),
        (["--workdir", "/srv", "--preemption", "$(touch PWNED)"], "preemption"),
    ],
    ids=[
        "port-without-ssh",
        "identity-without-ssh",
        "relative-workdir",
        "port-0",
        "run-as-root-with-ssh",
        "run-as-hostile",
        "allow-secret-ifs",
        "allow-secret-service-own",
        "preemption-unknown",
        "preemption-hostile",
    ],
)
def test_targets_add_refuses_bad_input(pipeline: Pipeline, args: list[str], needle: str) -> None:
    result = rw(pipeline, "targets", "add", "bad", *args)
    if needle:
        refused(result, 2, needle)
    else:
        assert result.returncode == 2, show(result)
    assert "bad" not in {t.name for t in pipeline.api.list_targets()}


def test_targets_add_refuses_a_bad_name(pipeline: Pipeline) -> None:
    refused(rw(pipeline, "targets", "add", "no/slash", "--workdir", "/srv"), 2, "name")


# --- launch -------------------------------------------------------------------------


def test_launch_prints_the_run_id(pipeline: Pipeline, running: Launched) -> None:
    assert running.result.stdout == f"{running.run_id}\n"
    assert running.result.stderr == ""
    validate_run_id(running.run_id)
    run = pipeline.api.get_run(running.run_id)
    assert run.state is RunState.RUNNING
    assert run.target == "local"
    assert run.command == shlex.join(TOY)


def test_launch_with_a_name_puts_its_slug_in_the_run_id(pipeline: Pipeline) -> None:
    run_id = launch(pipeline, "--target", "local", "--name", "My Exp #1", "--", "true")
    assert run_id.endswith("-my-exp-1"), run_id
    pipeline.wait_state(run_id)


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--target", "local"], "needs a command"),
        (["--target", "local", "--"], "needs a command"),
        (["--", "true"], "needs --target"),
        (["--target", "nope", "--", "true"], "no target 'nope'"),
        (["--target", "local", "--max-cost-usd", "5", "--", "true"], "--usd-per-hour"),
        (["--target", "local", "--max-hours", "0", "--", "true"], "max_hours"),
        (["--target", "local", "--max-hours", "-1", "--", "true"], "max_hours"),
        (["--target", "local", "--secret", "BAD-NAME", "--", "true"], "BAD-NAME"),
        (["--target", "local", "--resume-from", "../x", "--", "true"], "invalid run id"),
        (["--target", "bad name", "--", "true"], "target"),
        (["--target", "local", "--proof-timeout", "0", "--", "true"], "proof_timeout_s"),
        (["--target", "local", "--end-timeout", "-5", "--", "true"], "end_timeout_s"),
        (["--target", "local", "--proof-timeout", "inf", "--", "true"], "proof_timeout_s"),
        (["--target", "local", "--preemption", "AWS", "--", "true"], "preemption"),
        (["--target", "local", "--preemption", "'; x", "--", "true"], "preemption"),
    ],
    ids=[
        "no-command", "empty-command", "no-target", "unknown-target", "cost-without-rate",
        "max-hours-0", "max-hours-negative", "bad-secret-name", "bad-resume-id", "bad-target-name",
        "proof-timeout-0", "end-timeout-negative", "proof-timeout-inf",
        "preemption-unknown", "preemption-hostile",
    ],
)  # fmt: skip
def test_launch_refuses_bad_input(pipeline: Pipeline, args: list[str], needle: str) -> None:
    before = len(pipeline.api.list_runs())
    refused(rw(pipeline, "launch", *args), 2, needle)
    assert len(pipeline.api.list_runs()) == before  # nothing was launched


def test_launch_that_fails_on_the_worker_exits_1(pipeline: Pipeline) -> None:
    refused(
        rw(pipeline, "launch", "--target", "local", "--secret", "NOT_SET_ANYWHERE", "--", "true"),
        1,
        "NOT_SET_ANYWHERE",
    )


def test_unknown_command_and_missing_argument_are_usage_errors(pipeline: Pipeline) -> None:
    for args in (["bogus"], ["show"], ["stop"], ["runs", "--bogus"], ["stop", "x", "--timeout"]):
        result = rw(pipeline, *args)
        assert result.returncode == 2, show(result)
        assert result.stdout == "", show(result)


# --- runs, show, logs ---------------------------------------------------------------


def test_runs_table_shows_the_run_and_its_progress(pipeline: Pipeline, running: Launched) -> None:
    table = ok(rw(pipeline, "runs"))
    [row] = [line for line in table.splitlines() if running.run_id in line]
    assert " local " in row, table
    assert " running " in row, table
    assert "█" in row or "░" in row, table  # the bar
    assert "/100000 loss " in row, table


def test_runs_json_lists_run_records(pipeline: Pipeline, running: Launched) -> None:
    listed = as_json(rw(pipeline, "runs", "--json"))
    assert isinstance(listed, list)
    assert listed
    for item in listed:
        assert set(item) == set(RunRecord.model_fields), item
        RunRecord.model_validate(item)
    [item] = [i for i in listed if i["id"] == running.run_id]
    run = pipeline.api.get_run(running.run_id)
    assert item["target"] == "local"
    assert item["state"] == "running"
    assert run.job is not None
    assert run.mark is not None
    assert item["mark"] == run.mark != run.id  # its own token, never its id alone
    assert item["job"] == {
        "dir": run.remote_dir, "pid": run.job.pid, "container": None,
        "start": run.job.start, "mark": run.mark,
        # Root, on this machine's cgroup v2 hierarchy: the run is contained.
        "cgroup": f"{hierarchy()}/{CGROUP_PARENT}/{run.mark}",
    }  # fmt: skip
    assert item["remote_dir"] == str(pipeline.workdir / running.run_id)
    assert item["command"] == shlex.join(TOY)
    assert item["limits"] == {
        "max_hours": None,
        "max_cost_usd": None,
        "usd_per_hour": None,
        "disk": True,
    }
    created = [datetime.fromisoformat(i["created"]) for i in listed]
    assert created == sorted(created, reverse=True)  # newest first


def test_show(pipeline: Pipeline, running: Launched) -> None:
    record = as_json(rw(pipeline, "show", running.run_id, "--json"))
    assert isinstance(record, dict)
    assert set(record) == {*RunRecord.model_fields, "ledger"}
    assert record.pop("ledger") == []  # no stop yet: nothing in its ledger
    assert RunRecord.model_validate(record) == pipeline.api.get_run(running.run_id)

    text = ok(rw(pipeline, "show", running.run_id))
    fields = dict(line.split(None, 1) for line in text.splitlines() if " " in line.strip())
    assert fields["id"] == running.run_id
    assert fields["state"] == "running"
    assert fields["target"] == "local"
    assert "/100000 loss " in fields["progress"]
    assert "stop" not in fields  # none in flight
    assert fields["contained"].startswith("yes: every process of its job is in the cgroup ")
    # The pipeline's local target says its jobs run as root (this test's user).
    assert fields["job-user"] == "root (`--run-as root`): not protected against a hostile job"


@pytest.mark.parametrize("command", ["show", "logs", "stop", "cancel", "follow", "resume"])
def test_an_invalid_run_id_is_bad_input(pipeline: Pipeline, command: str) -> None:
    refused(rw(pipeline, command, "../x"), 2, "invalid run id '../x'")


@pytest.mark.parametrize("command", ["show", "logs", "stop", "cancel", "resume"])
def test_an_unknown_run_is_bad_input(pipeline: Pipeline, command: str) -> None:
    refused(rw(pipeline, command, UNKNOWN_RUN), 2, f"no run '{UNKNOWN_RUN}'")


def test_show_predicts_the_next_stop_by_the_workers_settings(
    pipeline: Pipeline, running: Launched
) -> None:
    """The CLI's own environment says 30 min; the workers (the pipeline's clocks) say
    otherwise, and published it: `show` says theirs, and where it came from."""
    assert pipeline.api.store.budgets.rules(), "no worker published its rule"
    cli_env = {**pipeline.env, "RUNWARDEN_PROOF_TIMEOUT_S": "1800"}
    shown = ok(run_cli(cli_env, "show", running.run_id))
    [line] = [line for line in shown.splitlines() if line.startswith("next stop")]
    workers = float(CLOCKS["RUNWARDEN_PROOF_TIMEOUT_S"])
    assert f"proof timeout {workers:g} s (default): no save seen yet: the configured " in line
    assert "(the workers' settings (w1@" in line, line
    assert "1800" not in line, line


def test_logs_prints_what_the_job_wrote(pipeline: Pipeline, running: Launched) -> None:
    # The run is the module's: by now it may have written more than `logs` prints by
    # default (its newest 1,000 lines), so its first lines are asked for.
    deadline = time.monotonic() + 15
    while True:
        out = ok(rw(pipeline, "logs", running.run_id, "--head", "100"))
        if "step 10/100000 loss " in out or time.monotonic() > deadline:
            break
        time.sleep(0.3)
    lines = out.splitlines()
    assert "step 10/100000 loss 1.3000" in lines, out[-2000:]
    assert len(lines) <= 100
    # tqdm-like `\r` updates come as lines of their own.
    assert any(line.startswith("[....................] 5/100000 loss ") for line in lines)
    newest = ok(rw(pipeline, "logs", running.run_id, "--tail", "3")).splitlines()
    assert len(newest) == 3
    assert all("/100000 loss " in line for line in newest), newest


def test_logs_follow_returns_when_the_run_ends(pipeline: Pipeline) -> None:
    run_id = launch(
        pipeline, "--target", "local", "--",
        sys.executable, "-u", str(TOY_TRAINER), "--steps", "30", "--step-time", "0.05",
    )  # fmt: skip
    started = time.monotonic()
    out = ok(rw(pipeline, "logs", "-f", run_id, timeout=60, own_process=True))
    assert time.monotonic() - started < 30
    assert "training done at step 30" in out.splitlines(), out[-2000:]
    assert "step 30/30 loss 0.6750" in out.splitlines()
    assert pipeline.api.get_run(run_id).state is RunState.SUCCEEDED
    # An ended run: `-f` prints everything and returns at once.
    assert ok(rw(pipeline, "logs", "--follow", run_id)) == out
    # Without -f: the newest lines held (all of them here), --tail/--head to choose.
    lines = out.splitlines()
    assert ok(rw(pipeline, "logs", run_id)) == out
    assert ok(rw(pipeline, "logs", "--tail", "2", run_id)).splitlines() == lines[-2:]
    assert ok(rw(pipeline, "logs", "--head", "3", run_id)).splitlines() == lines[:3]
    refused(rw(pipeline, "logs", "-f", "--head", "3", run_id), 2, "does not go with -f")


# --- follow -------------------------------------------------------------------------


def test_follow_a_run_again(pipeline: Pipeline, running: Launched) -> None:
    out = ok(rw(pipeline, "follow", running.run_id))
    assert out.strip() == f"following {running.run_id} (running)"


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        ([], "follow takes a run id, or --target and --dir"),
        (["--target", "local"], "follow takes a run id, or --target and --dir"),
        (["--dir", "/tmp/somewhere"], "--dir needs --target"),
        (["somerun", "--target", "local", "--dir", "/tmp/x"], "follow takes a run id"),
        (["--target", "local", "--dir", "relative/dir"], "not an absolute path"),
    ],
    ids=["neither", "target-only", "dir-without-target", "both", "relative-dir"],
)
def test_follow_refuses_bad_usage(pipeline: Pipeline, args: list[str], needle: str) -> None:
    refused(rw(pipeline, "follow", *args), 2, needle)


def test_follow_an_unknown_run_or_target_is_bad_input(pipeline: Pipeline) -> None:
    # These are refused by the worker (the error crosses the result backend).
    refused(rw(pipeline, "follow", UNKNOWN_RUN), 2, UNKNOWN_RUN)
    refused(rw(pipeline, "follow", "--target", "nope", "--dir", "/tmp/x"), 2, "nope")


def test_follow_errors_from_the_worker_read_as_the_same_errors_locally(
    pipeline: Pipeline,
) -> None:
    line = refused(rw(pipeline, "follow", UNKNOWN_RUN), 2)
    assert line == f"error: no run '{UNKNOWN_RUN}'"
    line = refused(rw(pipeline, "follow", "--target", "nope", "--dir", "/tmp/x"), 2)
    assert line == "error: no target 'nope' (see `runwarden targets ls`)"


def test_an_adoption_delivered_again_follows_the_run_it_made(pipeline: Pipeline) -> None:
    """The same `runwarden.follow` of a directory delivered twice (a redelivery keeps
    its task id): one run, not two following the same job."""
    run_dir = pipeline.workdir / "adopted-twice"
    run_dir.mkdir()
    job = subprocess.Popen(
        ["sh", "-c", "echo $$ > job.pid; exec sleep 600"], cwd=run_dir,
        stdin=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    threading.Thread(target=job.wait, daemon=True).start()
    try:
        pid = run_dir / "job.pid"
        wait_for(lambda: pid.exists() and pid.read_text().strip() == str(job.pid))
        body = {"target": "local", "dir": str(run_dir)}
        task_id = new_task_id()
        kwargs = signed(pipeline.api.settings, TASK_FOLLOW, body, task_id=task_id)
        answers = []
        for _ in range(2):
            sent = pipeline.api.app.send_task(TASK_FOLLOW, kwargs=kwargs, task_id=task_id)
            answers.append(sent.get(timeout=30))
            sent.forget()  # the next get waits for the next delivery's own answer
        assert answers[0] == answers[1] == {"run_id": "adopted-twice", "state": "running"}
        runs = [r.id for r in pipeline.api.list_runs() if r.remote_dir == str(run_dir)]
        assert runs == ["adopted-twice"]
        pipeline.api.cancel("adopted-twice")
    finally:
        # By its directory: reaped by then, its pid may be another test's.
        kill_processes_in(run_dir)


def test_follow_adopts_a_run_directory_started_by_hand(pipeline: Pipeline) -> None:
    run_dir = pipeline.workdir / "adopted-by-hand"
    run_dir.mkdir()
    env = {
        **_base_env(pipeline.env),
        "PYTHONPATH": str(JOBSIDE),
        "RUNWARDEN_SNAPSHOT_REQUEST": str(run_dir / "snapshot.request"),
        "RUNWARDEN_METRICS": str(run_dir / "metrics.jsonl"),
    }
    # What a person (or overbrainer) would run: its own session (setsid), its pid in
    # job.pid, its output in job.log, its exit code in exit_code.
    script = 'echo $$ > job.pid; "$@" > job.log 2>&1; echo $? > exit_code'
    job = subprocess.Popen(
        ["sh", "-c", script, "sh", *TOY],
        cwd=run_dir,
        env=env,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
    )
    # Reaped as soon as it ends: a zombie would still count as a live process.
    threading.Thread(target=job.wait, daemon=True).start()
    try:
        deadline = time.monotonic() + 10
        while not (run_dir / "metrics.jsonl").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert (run_dir / "job.pid").read_text().strip() == str(job.pid)

        out = ok(rw(pipeline, "follow", "--target", "local", "--dir", str(run_dir)))
        assert out.strip() == "following adopted-by-hand (running)"
        [item] = [
            r
            for r in as_json(rw(pipeline, "runs", "--json"))  # type: ignore[attr-defined]
            if r["id"] == "adopted-by-hand"
        ]
        assert item["state"] == "running"
        assert item["target"] == "local"
        assert item["remote_dir"] == str(run_dir)
        assert item["job"] == {"dir": str(run_dir), "pid": job.pid, "container": None}
        assert item["command"] == "(adopted)"

        # Followed like any run: its progress and log lines, and a graceful stop.
        pipeline.wait_step("adopted-by-hand", 3)
        out = ok(rw(pipeline, "stop", "adopted-by-hand", "--wait", "--timeout", "60"))
        assert "adopted-by-hand: stopped" in out, out
        run = pipeline.api.get_run("adopted-by-hand")
        assert run.state is RunState.STOPPED, run
        assert run.snapshot is not None
        assert (run_dir / run.snapshot.checkpoint).is_dir()
        assert job.wait(timeout=10) == 0
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
            job.wait()


def test_follow_a_directory_without_job_pid_fails(pipeline: Pipeline, tmp_path: Path) -> None:
    refused(rw(pipeline, "follow", "--target", "local", "--dir", str(tmp_path)), 1, "job.pid")


# --- stop, stops, cancel ------------------------------------------------------------


@dataclass
class StoppedRun:
    run_id: str
    result: subprocess.CompletedProcess[str]


@pytest.fixture(scope="module")
def stopped(pipeline: Pipeline, tmp_path_factory: pytest.TempPathFactory) -> StoppedRun:
    """A toy trainer on a target with a long workdir, stopped with `stop --wait` (its
    output as through a pipe: 80 columns)."""
    workdir = tmp_path_factory.mktemp("deep") / ("a-rather-long-directory-name-" * 2)
    ok(rw(pipeline, "targets", "add", "deep", "--workdir", str(workdir), *AS_THE_WORKER))
    workdir.mkdir()
    run_id = launch(pipeline, "--target", "deep", "--", *TOY)
    pipeline.wait_step(run_id, 3)
    return StoppedRun(
        run_id,
        rw(pipeline, "stop", run_id, "--wait", "--timeout", "60", extra=NARROW, own_process=True),
    )


def test_stop_wait_ends_with_a_checkpoint(pipeline: Pipeline, stopped: StoppedRun) -> None:
    out = ok(stopped.result)
    run = pipeline.api.get_run(stopped.run_id)
    assert run.state is RunState.STOPPED, run
    assert run.snapshot is not None
    checkpoint = f"{run.remote_dir}/{run.snapshot.checkpoint}"
    assert Path(checkpoint).is_dir()
    lines = out.splitlines()
    assert lines[0] == f"{stopped.run_id}: snapshot asked (requested)"
    assert lines[1].startswith(f"{stopped.run_id}: stopped"), out
    assert f"checkpoint{checkpoint}(step{run.snapshot.step},requested)" in flat(out), out


def test_stop_wait_prints_the_checkpoint_path_on_one_line(
    pipeline: Pipeline, stopped: StoppedRun
) -> None:
    run = pipeline.api.get_run(stopped.run_id)
    assert run.snapshot is not None
    checkpoint = f"{run.remote_dir}/{run.snapshot.checkpoint}"
    assert f"  checkpoint {checkpoint} (step " in stopped.result.stdout, show(stopped.result)


def test_stop_or_cancel_an_ended_run_fails(pipeline: Pipeline, stopped: StoppedRun) -> None:
    run_id = stopped.run_id
    refused(rw(pipeline, "stop", run_id), 1, f"run '{run_id}' is not running (it is stopped)")
    refused(rw(pipeline, "cancel", run_id), 1, "is not running (it is stopped)")
    # The record shows the snapshot.
    record = as_json(rw(pipeline, "show", run_id, "--json"))
    assert record["state"] == "stopped"  # type: ignore[index]
    assert set(record["snapshot"]) >= {"checkpoint", "step", "reason"}  # type: ignore[index]


def test_stop_refuses_a_bad_reason(pipeline: Pipeline, running: Launched) -> None:
    refused(rw(pipeline, "stop", running.run_id, "--reason", "bogus"), 2, "invalid reason 'bogus'")
    assert pipeline.api.get_stop(running.run_id) is None


def test_stop_a_job_without_snapshots_fails(pipeline: Pipeline) -> None:
    run_id = launch(pipeline, "--target", "local", "--no-snapshots", "--", "sleep", "600")
    refused(rw(pipeline, "stop", run_id), 1, "cannot save a snapshot")
    assert "cancelled" in ok(rw(pipeline, "cancel", run_id))


def test_stops_in_flight(pipeline: Pipeline) -> None:
    # Its own proof timeout, far longer than the pipeline's: the checks of the stop in
    # flight below run several commands, and none of them may race the cancel.
    run_id = launch(
        pipeline, "--target", "local", "--proof-timeout", "30", "--", *TOY, "--ignore-requests"
    )
    pipeline.wait_step(run_id, 2)
    shown = ok(rw(pipeline, "show", run_id))
    assert "next stop    proof timeout 30 s (explicit): the run's own, 30 s" in shown, shown
    assert ok(rw(pipeline, "stop", run_id, "--reason", "cost")) == (
        f"{run_id}: snapshot asked (cost)\n"
    )
    current = as_json(rw(pipeline, "stops", "--json"))
    assert isinstance(current, list)
    [item] = [s for s in current if s["run_id"] == run_id]
    assert set(item) == STOP_FIELDS, item
    assert (item["phase"], item["reason"], item["end_deadline"]) == ("waiting_proof", "cost", None)
    asked = datetime.fromisoformat(item["asked_at"])
    proof = datetime.fromisoformat(item["proof_deadline"])
    assert proof - asked == timedelta(seconds=30)
    assert float(CLOCKS["RUNWARDEN_PROOF_TIMEOUT_S"]) < 30
    assert item["budget"] == {
        "proof_timeout_s": 30.0,
        "end_timeout_s": float(CLOCKS["RUNWARDEN_END_TIMEOUT_S"]),
        "source": "explicit",
        "why": "the run's own, 30 s (--proof-timeout)",
    }
    assert (item["asked_by"], item["cancels"], item["closed_at"]) == ("operator/cli", 0, None)
    assert item["stop_id"], item
    stop = pipeline.api.get_stop(run_id)
    assert stop is not None
    assert stop.model_dump(mode="json") == item

    table = ok(rw(pipeline, "stops"))
    [row] = [line for line in table.splitlines() if run_id in line]
    for word in ("waiting_proof", "cost", "cli", "proof deadline in", "30 s explicit"):
        assert word in row, table
    shown = ok(rw(pipeline, "show", run_id))
    assert "waiting_proof, reason cost; proof deadline in " in shown, shown
    assert "timeout      proof timeout 30 s (explicit)" in shown, shown
    assert "next stop" not in shown, shown

    # --wait gives up at its timeout: the stop is still in flight.
    result = rw(pipeline, "stop", run_id, "--reason", "cost", "--wait", "--timeout", "0.5")
    assert result.returncode == 1, show(result)
    assert result.stdout == f"{run_id}: snapshot asked (cost)\n", show(result)
    assert result.stderr.splitlines() == [
        f"error: {run_id} has not ended after 0.5 s (still running)"
    ]
    # The job never proves: cancelled at the proof timeout, and --wait says so (exit 1).
    result = rw(pipeline, "stop", run_id, "--reason", "cost", "--wait", "--timeout", "60")
    assert result.returncode == 1, show(result)
    assert f"{run_id}: cancelled" in result.stdout, show(result)
    assert pipeline.api.get_run(run_id).state is RunState.CANCELLED
    assert run_id not in {s["run_id"] for s in as_json(rw(pipeline, "stops", "--json"))}  # type: ignore[attr-defined]


def test_cancel(pipeline: Pipeline) -> None:
    run_id = launch(pipeline, "--target", "local", "--", *TOY)
    out = ok(rw(pipeline, "cancel", run_id))
    assert out.splitlines()[0].startswith(f"{run_id}: cancelled"), out
    assert pipeline.api.get_run(run_id).state is RunState.CANCELLED
    refused(rw(pipeline, "cancel", run_id), 1, f"run '{run_id}' is not running (it is cancelled)")
    refused(rw(pipeline, "stop", run_id), 1, "is not running (it is cancelled)")


def _retrieved(pipeline: Pipeline, run_id: str) -> RunRecord:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        run = pipeline.api.get_run(run_id)
        if run.artifacts is not None and run.artifacts.phase == "done":
            return run
        time.sleep(0.2)
    raise AssertionError(f"not retrieved: {pipeline.api.get_run(run_id)}")


def test_artifacts_show_retrieve_and_resume(pipeline: Pipeline, stopped: StoppedRun) -> None:
    run = _retrieved(pipeline, stopped.run_id)
    assert run.artifacts is not None
    shown = ok(rw(pipeline, "show", run.id))
    assert f"artifacts    done: {run.artifacts.files} files" in shown, shown
    assert "verified" in shown
    table = ok(rw(pipeline, "runs"))
    assert any(run.id in line and "done" in line for line in table.splitlines()), table
    again = ok(rw(pipeline, "retrieve", run.id))  # a person's retry: verified again
    assert again.startswith(f"done: {run.artifacts.files} files"), again
    new = ok(rw(pipeline, "resume", run.id)).strip()
    validate_run_id(new)
    resumed = pipeline.api.get_run(new)
    assert resumed.resumed_from == run.id
    assert resumed.target == "deep"
    assert run.snapshot is not None
    pipeline.wait_step(new, run.snapshot.step + 2)
    with contextlib.suppress(Exception):
        pipeline.api.cancel(new)
    # A run that is not stopped cannot be resumed; nor an adopted one without a command.
    refused(rw(pipeline, "resume", new), 1, f"run '{new}' cannot be resumed", "not stopped")
    refused(rw(pipeline, "retrieve", UNKNOWN_RUN), 2, f"no run '{UNKNOWN_RUN}'")


# --- --json on every command that prints a record; paths whole at 80 columns ---------


def whole_on_a_line(text: str, needle: str) -> str:
    """The first line of `text` holding `needle` whole: fails when a line break cut it."""
    lines = [line for line in text.splitlines() if needle in line]
    assert lines, f"{needle!r} is not whole on any line of:\n{text}"
    return lines[0]


def test_paths_are_printed_whole_at_80_columns(pipeline: Pipeline, stopped: StoppedRun) -> None:
    run = _retrieved(pipeline, stopped.run_id)
    assert run.artifacts is not None
    assert run.artifacts.path is not None
    assert len(run.remote_dir) > 80, run.remote_dir  # longer than the terminal is wide
    shown_ = ok(rw(pipeline, "show", run.id, extra=NARROW))
    assert whole_on_a_line(shown_, run.remote_dir).startswith("remote_dir "), shown_
    assert whole_on_a_line(shown_, run.artifacts.path).startswith("artifacts "), shown_
    record = ok(rw(pipeline, "show", run.id, "--json", extra=NARROW))
    whole_on_a_line(record, f'"remote_dir": "{run.remote_dir}"')
    again = ok(rw(pipeline, "retrieve", run.id, extra=NARROW))
    assert whole_on_a_line(again, f"in {run.artifacts.path}").startswith("done: "), again
    table = ok(rw(pipeline, "targets", "ls", extra=NARROW))
    workdir = pipeline.api.store.targets.get("deep")["workdir"]
    assert len(workdir) > 40, workdir
    assert " deep " in whole_on_a_line(table, workdir), table


def test_retrieve_json(pipeline: Pipeline, stopped: StoppedRun) -> None:
    run = _retrieved(pipeline, stopped.run_id)
    answer = as_json(rw(pipeline, "retrieve", run.id, "--json"))
    assert Artifacts.model_validate(answer).phase == "done", answer
    assert answer["path"] == run.artifacts.path  # type: ignore[index, union-attr]
    asked = as_json(rw(pipeline, "retrieve", run.id, "--no-wait", "--json"))
    assert set(asked) == {"run_id", "task_id"}, asked  # type: ignore[arg-type]
    assert asked["run_id"] == run.id  # type: ignore[index]


def test_launch_follow_and_stop_wait_with_json(pipeline: Pipeline) -> None:
    out = ok(rw(pipeline, "launch", "--target", "deep", "--json", "--", *TOY, extra=NARROW))
    launched = RunRecord.model_validate_json(out)
    assert (launched.state, launched.target) == (RunState.RUNNING, "deep")
    whole_on_a_line(out, f'"remote_dir": "{launched.remote_dir}"')
    followed = RunRecord.model_validate(as_json(rw(pipeline, "follow", launched.id, "--json")))
    assert (followed.id, followed.state) == (launched.id, RunState.RUNNING)
    pipeline.wait_step(launched.id, 3)
    # --wait --json: one JSON document, the run's record once it ended (no other line).
    result = rw(pipeline, "stop", launched.id, "--wait", "--timeout", "60", "--json")
    ended = RunRecord.model_validate_json(ok(result))
    assert ended.id == launched.id
    assert ended.state is RunState.STOPPED, ended
    assert ended.snapshot is not None


def test_stop_and_cancel_with_json(pipeline: Pipeline) -> None:
    stopping = launch(pipeline, "--target", "local", "--", *TOY)
    cancelling = launch(pipeline, "--target", "local", "--", *TOY)
    pipeline.wait_step(stopping, 2)
    answer = as_json(rw(pipeline, "stop", stopping, "--reason", "cost", "--json"))
    stop = StopState.model_validate(answer)
    assert (stop.run_id, stop.reason, stop.asked_by) == (stopping, "cost", "operator/cli"), stop
    cancelled = RunRecord.model_validate(as_json(rw(pipeline, "cancel", cancelling, "--json")))
    assert (cancelled.id, cancelled.state) == (cancelling, RunState.CANCELLED)
    assert pipeline.api.get_run(cancelling).state is RunState.CANCELLED
    assert pipeline.wait_state(stopping).state is RunState.STOPPED


def test_targets_add_json(pipeline: Pipeline) -> None:
    try:
        added = as_json(rw(pipeline, "targets", "add", "jsonic", "--workdir", "/srv/j/", "--json"))
        assert TargetConfig.model_validate(added) == TargetConfig(
            name="jsonic", kind="local", workdir="/srv/j"
        )
        assert pipeline.api.store.targets.get("jsonic")["workdir"] == "/srv/j"
    finally:
        pipeline.api.remove_target("jsonic")


def test_producers_add_ls_rm(tmp_path: Path) -> None:
    env = _embedded_env(tmp_path / ("a-rather-long-state-directory-name-" * 2))
    secrets = Path(env["RUNWARDEN_STATE_DIR"]) / "secrets"
    key = secrets / "producer.billing.key"
    out = ok(run_cli(env, "producers", "add", "billing", extra=NARROW)).splitlines()
    assert out[0] == f"created {key}"  # whole on its line, however long
    assert len(out[0]) > 80
    # Nothing serves here: the key works without a Redis user of its own.
    assert out[1] == "no Redis user made yet (nothing is serving: `runwarden serve` makes it)"
    assert (secrets / "redis-password.producer-billing").stat().st_mode & 0o777 == 0o600
    assert key.stat().st_mode & 0o777 == 0o600
    made = key.read_text()
    assert as_json(run_cli(env, "producers", "add", "billing", "--json")) == {
        "name": "billing", "key_file": str(key), "created": False, "redis_user": None,
    }  # fmt: skip
    assert key.read_text() == made  # an existing key is kept
    assert ok(run_cli(env, "producers", "ls")) == "billing\n"
    assert as_json(run_cli(env, "producers", "ls", "--json")) == ["billing"]
    refused(run_cli(env, "producers", "add", "Bad Name"), 2, "invalid producer name")
    refused(run_cli(env, "producers", "rm", "operator"), 2, "cannot be removed")
    assert ok(run_cli(env, "producers", "rm", "billing")) == "removed producer billing\n"
    assert not (secrets / "redis-password.producer-billing").exists()
    assert not key.exists()
    refused(run_cli(env, "producers", "rm", "billing"), 2, "no producer 'billing'")
    assert as_json(run_cli(env, "producers", "ls", "--json")) == []


# --- rich markup in user input ------------------------------------------------------


@pytest.mark.parametrize(
    "case", ["targets-rm", "show-bad-id", "targets-add", "targets-ls", "show-command"]
)
def test_text_with_brackets_is_printed_as_is(pipeline: Pipeline, case: str) -> None:
    if case == "targets-rm":
        refused(rw(pipeline, "targets", "rm", "[bold]x"), 2, "'[bold]x'")
        refused(rw(pipeline, "targets", "rm", "[/]"), 2, "'[/]'")
    elif case == "show-bad-id":
        refused(rw(pipeline, "show", "[/]"), 2, "'[/]'")
    elif case == "targets-add":
        try:
            result = rw(pipeline, "targets", "add", "brackets", "--workdir", "/tmp/a[/]b")
            assert ok(result).strip() == "target brackets: local, /tmp/a[/]b"
        finally:
            pipeline.api.remove_target("brackets")
    elif case == "targets-ls":
        pipeline.api.add_target(TargetConfig(name="brackets2", kind="local", workdir="/a[/]b"))
        try:
            assert "/a[/]b" in ok(rw(pipeline, "targets", "ls"))
        finally:
            pipeline.api.remove_target("brackets2")
    else:
        run_id = launch(pipeline, "--target", "local", "--", "echo", "[/]", "[bold]x")
        pipeline.wait_state(run_id)
        assert "echo '[/]' '[bold]x'" in ok(rw(pipeline, "show", run_id))


# --- tables at the default width ----------------------------------------------------


def test_runs_table_keeps_whole_run_ids_at_80_columns(pipeline: Pipeline) -> None:
    run_id = launch(pipeline, "--target", "local", "--name", "a-fairly-long-name", "--", "true")
    pipeline.wait_state(run_id)
    assert run_id in ok(rw(pipeline, "runs", extra=NARROW))


# --- the embedded default: nothing serving, serve, demo -----------------------------


def _embedded_env(state_dir: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RUNWARDEN_")}
    env.update(CLOCKS, RUNWARDEN_STATE_DIR=str(state_dir), PYTHONPATH=str(ROOT))
    return env


def test_nothing_serving(tmp_path: Path) -> None:
    env = _embedded_env(tmp_path / "state")
    (tmp_path / "state").mkdir()
    for args in (["runs"], ["targets", "ls"], ["stops", "--json"], ["show", UNKNOWN_RUN]):
        line = refused(run_cli(env, *args), 1, "nothing is serving", "`runwarden serve`")
        assert str(tmp_path / "state" / "redis.sock") in line


def test_serve_runs_the_service_and_stops_on_ctrl_c(tmp_path: Path) -> None:
    state = tmp_path / "state"
    env = _embedded_env(state)
    env["RUNWARDEN_REDIS_MAXMEMORY"] = "96mb"
    log = (tmp_path / "serve.log").open("wb")
    with socket.socket() as probe:  # a free port for the metrics endpoint
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    serve = subprocess.Popen(
        [sys.executable, "-m", "producers.cli", "serve", "--concurrency", "1",
         "--metrics-port", str(port)],
        cwd=ROOT, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
        start_new_session=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while run_cli(env, "runs", "--json").returncode != 0:
            assert serve.poll() is None, (tmp_path / "serve.log").read_text()
            assert time.monotonic() < deadline, (tmp_path / "serve.log").read_text()
            time.sleep(0.2)
        assert as_json(run_cli(env, "runs", "--json")) == []
        # Its Redis is bounded: the settings' maxmemory, no eviction.
        assert _config(state, "maxmemory") == str(96 * 1024**2)
        assert _config(state, "maxmemory-policy") == "noeviction"
        # A second serve on the same state directory is refused.
        refused(run_cli(env, "serve"), 1, "already runs")

        # The worker and beat serve: a run from launch to its end, its log followed.
        workdir = tmp_path / "work"
        ok(run_cli(env, "targets", "add", "here", "--workdir", str(workdir), *AS_THE_WORKER))
        run_id = ok(
            run_cli(
                env, "launch", "--target", "here", "--",
                sys.executable, "-u", str(TOY_TRAINER), "--steps", "10", "--step-time", "0.02",
            )
        ).strip()  # fmt: skip
        out = ok(run_cli(env, "logs", "-f", run_id, timeout=60, own_process=True))
        assert "training done at step 10" in out.splitlines(), out
        assert as_json(run_cli(env, "show", run_id, "--json"))["state"] == "succeeded"  # type: ignore[index]
        # serve --metrics-port: the store's numbers on loopback, behind the credentials.
        url = f"http://127.0.0.1:{port}/metrics"
        with pytest.raises(urllib.error.HTTPError) as unauthorized:
            urllib.request.urlopen(url, timeout=10)
        assert unauthorized.value.code == 401
        held = (state / "secrets" / "flower-basic-auth").read_text().strip()
        auth = {"Authorization": "Basic " + base64.b64encode(held.encode()).decode()}
        request = urllib.request.Request(url, headers=auth)
        with urllib.request.urlopen(request, timeout=10) as answer:  # noqa: S310 - our loopback
            metrics = answer.read().decode()
        assert 'runwarden_runs{state="succeeded"} 1.0' in metrics, metrics
    finally:
        serve.send_signal(signal.SIGINT)  # Ctrl-C
        try:
            code = serve.wait(timeout=90)
        except subprocess.TimeoutExpired:
            os.killpg(serve.pid, signal.SIGKILL)
            serve.wait()
            raise
        log.close()
    text = (tmp_path / "serve.log").read_text(errors="replace")
    assert code == 0, text
    assert "Traceback" not in text
    # Everything stopped with it: its Redis too.
    refused(run_cli(env, "runs"), 1, "nothing is serving")


def test_demo(tmp_path: Path) -> None:
    env = _embedded_env(tmp_path / "unused")
    env["TMPDIR"] = str(tmp_path)  # the demo's own state directory goes here
    out = ok(run_cli(env, "demo", timeout=180, extra=NARROW))
    fields = {}
    for line in out.splitlines():
        key, _, value = line.partition(":")
        fields[key.strip()] = value.strip()
    assert fields["state"] == "stopped", out
    assert fields["reason"] == "requested", out
    step = int(fields["step"])
    assert "service stopped" in out
    [state_dir] = tmp_path.glob("runwarden-demo-*")
    # Printed whole on its line at 80 columns, however long.
    checkpoint = fields["checkpoint"]
    assert len(f"checkpoint: {checkpoint}") > 80, checkpoint
    assert checkpoint.startswith(f"{state_dir}/work/"), out
    assert checkpoint.endswith(f"/output/checkpoint-{step}"), out
    assert Path(checkpoint).is_dir(), out
    assert fields["state directory"] == str(state_dir), out
    assert not (state_dir / "redis.sock").exists() or not _answers(state_dir / "redis.sock")


def _config(state_dir: Path, name: str) -> str:
    """`CONFIG GET name` of the embedded Redis of `state_dir`, with its password."""
    import redis

    url = Settings(state_dir=state_dir, redis_url=None).store_url()
    client = redis.Redis.from_url(url, socket_timeout=5, decode_responses=True)
    try:
        return str(client.config_get(name)[name])
    finally:
        client.close()


def _answers(socket_path: Path) -> bool:
    import redis

    client = redis.Redis(unix_socket_path=str(socket_path), socket_timeout=1)
    try:
        return bool(client.ping())
    except redis.RedisError:
        return False
    finally:
        client.close()
