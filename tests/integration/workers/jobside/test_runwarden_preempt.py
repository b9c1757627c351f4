"""Preemption signals on the job side: `workers/jobside/runwarden_preempt.py` and what
`runwarden_job` does with a pending notice (`snapshot_requested`, `request_snapshot`).

Real signals go to real subprocesses running a tiny loop (`LOOP`) that calls
`snapshot_requested()` at every step, as a training loop would; the in-process tests
use SIGUSR1/SIGUSR2 on this process, with every disposition put back afterwards.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from schemas import protocol
from schemas.snapshot import ProofSaved, SnapshotReason, parse_proof
from workers import jobside
from workers.jobside import runwarden_job as job
from workers.jobside import runwarden_preempt as preempt

from ....conftest import JOBSIDE, process_alive, wait_for

STEP_S = 0.02

# A training loop in miniature. argv: `--wait-go` (look for requests only once the
# file `go` exists), `--ignore-term` (SIGTERM ignored before the install),
# `--restore` (restore the handlers right after installing them), `--fork` (fork a
# child that sleeps forever, as a DataLoader worker; its pid goes to `child.pid`).
# It prints `ready` once installed, then `stop <step> <reason> <notice signal or ->`
# and exits 0.
LOOP = f"""\
import os, signal, sys, time
import runwarden_job, runwarden_preempt
if "--ignore-term" in sys.argv:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
installed = runwarden_job.install_preemption_signals()
if "--restore" in sys.argv:
    runwarden_job.restore_preemption_signals()
if "--fork" in sys.argv:
    child = os.fork()
    if child == 0:
        null = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(null, fd)
        while True:
            time.sleep(3600)
    with open("child.pid", "w") as file:
        file.write(str(child))
print("ready", ",".join(s.name for s in installed) or "-", flush=True)
step = 0
while True:
    time.sleep({STEP_S!r})
    if "--wait-go" in sys.argv and not os.path.exists("go"):
        continue
    step += 1
    reason = runwarden_job.snapshot_requested()
    if reason is not None:
        notice = runwarden_preempt.preemption_notice()
        print("stop", step, reason, notice.signal if notice else "-", flush=True)
        sys.exit(0)
"""


# --- fixtures and helpers -------------------------------------------------------------


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in (job.REQUEST_ENV, job.METRICS_ENV, job.RESUME_ENV, preempt.PREEMPT_SIGNALS_ENV):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def dispositions() -> Iterator[None]:
    """Puts back every catchable disposition this test may change, and forgets any
    notice, whatever the test did."""
    numbers = [getattr(signal, f"SIG{name}") for name in preempt.ALLOWED_SIGNALS]
    numbers.append(signal.SIGINT)
    saved = {number: signal.getsignal(number) for number in numbers}
    yield
    preempt.restore_preemption_signals()
    preempt.clear_preemption()
    for number, handler in saved.items():
        signal.signal(number, handler if handler is not None else signal.SIG_DFL)


@pytest.fixture
def run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A run directory named by the environment, as launch would."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    monkeypatch.setenv(job.REQUEST_ENV, str(run_dir / job.SNAPSHOT_REQUEST))
    return run_dir


def deliver(signum: int) -> None:
    """Sends `signum` to this process and lets its Python handler run."""
    os.kill(os.getpid(), signum)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        time.sleep(0.001)  # the handler runs between bytecodes of the main thread
        if preempt.preemption_notice() is not None:
            return


def start_loop(run_dir: Path, *args: str, **env: str) -> subprocess.Popen[str]:
    """The loop in `run_dir`, its environment as launch builds it, plus `env`."""
    environment = {k: v for k, v in os.environ.items() if not k.startswith("RUNWARDEN_")}
    environment.update(
        {"PYTHONPATH": str(JOBSIDE), job.REQUEST_ENV: str(run_dir / job.SNAPSHOT_REQUEST)}
    )
    environment.update(env)
    return subprocess.Popen(
        [sys.executable, "-c", LOOP, *args],
        cwd=run_dir,
        env=environment,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


@pytest.fixture
def loops() -> Iterator[list[subprocess.Popen[str]]]:
    """Loops started by a test, killed at its end."""
    started: list[subprocess.Popen[str]] = []
    yield started
    for process in started:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
        process.communicate(timeout=10)


def ready(process: subprocess.Popen[str]) -> str:
    """Waits for the loop's `ready` line; returns the signals it installed."""
    assert process.stdout is not None
    line = process.stdout.readline()
    if not line.startswith("ready "):
        _, err = process.communicate(timeout=10)
        raise AssertionError(f"no ready line: {line!r}\n{err}")
    return line.split()[1]


def outcome(process: subprocess.Popen[str], timeout_s: float = 10.0) -> tuple[int, str, str]:
    out, err = process.communicate(timeout=timeout_s)
    return process.returncode, out, err


# --- constants and reasons ------------------------------------------------------------


def test_constants_agree() -> None:
    assert job.PREEMPTED == SnapshotReason.PREEMPTED.value == "preempted"
    assert tuple(reason.value for reason in SnapshotReason) == job.REASONS
    assert job.REASONS[-1] == job.PREEMPTED
    assert job.CANCELLING_FILE == preempt._CANCELLING_FILE == protocol.CANCELLING_FILE
    assert preempt._REQUEST_ENV == job.REQUEST_ENV
    assert preempt.PREEMPT_SIGNALS_ENV == "RUNWARDEN_PREEMPT_SIGNALS"
    assert preempt.DEFAULT_PREEMPT_SIGNALS == "TERM,USR1"
    assert "runwarden_preempt.py" in jobside.JOBSIDE_FILES
    assert {"install_preemption_signals", "restore_preemption_signals"} <= set(job.__all__)
    assert {"request_snapshot", "preemption_pending", "PREEMPTED"} <= set(job.__all__)
    assert set(preempt.__all__) <= set(dir(preempt))


def test_an_unknown_reason_is_still_requested(run: Path) -> None:
    assert job.parse_reason("preempted\n") == "preempted"
    assert SnapshotReason.parse(b" preempted") is SnapshotReason.PREEMPTED
    for unknown in ("evicted", "Preempted", "preempted now", "spot-reclaim"):
        assert job.parse_reason(unknown) == "requested"
        assert SnapshotReason.parse(unknown) is SnapshotReason.REQUESTED
        (run / job.SNAPSHOT_REQUEST).write_text(unknown)
        assert job.snapshot_requested() == "requested"
    proof = b'{"checkpoint": "output/checkpoint-3", "step": 3, "reason": "evicted"}'
    parsed = parse_proof(proof)
    assert isinstance(parsed, ProofSaved)
    assert parsed.snapshot.reason is SnapshotReason.REQUESTED


def test_a_preempted_proof_parses(run: Path) -> None:
    (run / job.OUTPUT_DIR / "checkpoint-7").mkdir(parents=True)
    path = job.write_proof(7, job.PREEMPTED)
    parsed = parse_proof(Path(path).read_bytes())
    assert isinstance(parsed, ProofSaved)
    assert (parsed.snapshot.step, parsed.snapshot.reason) == (7, SnapshotReason.PREEMPTED)


# --- parsing the signals --------------------------------------------------------------


def test_parse_signals() -> None:
    assert preempt.parse_signals("TERM,USR1") == (signal.SIGTERM, signal.SIGUSR1)
    assert preempt.parse_signals(" sigusr2 , Term ,HUP,xcpu") == (
        signal.SIGUSR2,
        signal.SIGTERM,
        signal.SIGHUP,
        signal.SIGXCPU,
    )
    assert preempt.parse_signals("TERM,SIGTERM,term") == (signal.SIGTERM,)
    assert preempt.parse_signals("") == ()
    assert preempt.parse_signals(" \t") == ()


@pytest.mark.parametrize(
    ("text", "quoted"),
    [
        ("KILL", "SIGKILL cannot"),
        ("INT", "SIGINT cannot"),
        ("STOP", "SIGSTOP cannot"),
        ("SEGV", "SIGSEGV cannot"),
        ("TERM,BOGUS", "'BOGUS'"),
        ("15", "'15'"),
        ("TERM,,USR1", "an empty signal name"),
        ("TERM,", "an empty signal name"),
        ("$(touch x)", "'$(touch x)'"),
        ("TERM\nUSR1", "'TERM\\nUSR1'"),
    ],
)
def test_bad_signal_names_are_refused(text: str, quoted: str) -> None:
    with pytest.raises(ValueError, match="RUNWARDEN_PREEMPT_SIGNALS") as raised:
        preempt.parse_signals(text)
    assert quoted in str(raised.value)
    assert "HUP, TERM, USR1, USR2, XCPU" in str(raised.value) or "empty" in quoted


@pytest.mark.usefixtures("dispositions")
def test_install_reads_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    assert job.install_preemption_signals() == (signal.SIGTERM, signal.SIGUSR1)
    monkeypatch.setenv(preempt.PREEMPT_SIGNALS_ENV, "USR2")
    assert job.install_preemption_signals() == (signal.SIGUSR2,)
    # Reinstalling restored the earlier ones first.
    assert preempt.installed_signals() == (signal.SIGUSR2,)
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
    monkeypatch.setenv(preempt.PREEMPT_SIGNALS_ENV, "")
    assert job.install_preemption_signals() == ()
    assert preempt.installed_signals() == ()
    assert signal.getsignal(signal.SIGUSR2) is signal.SIG_DFL


@pytest.mark.usefixtures("dispositions")
def test_a_bad_environment_changes_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    job.install_preemption_signals("USR2")
    handler = signal.getsignal(signal.SIGUSR2)
    monkeypatch.setenv(preempt.PREEMPT_SIGNALS_ENV, "TERM,QUIT")
    with pytest.raises(ValueError, match=r"RUNWARDEN_PREEMPT_SIGNALS: SIGQUIT cannot"):
        job.install_preemption_signals()
    assert preempt.installed_signals() == (signal.SIGUSR2,)
    assert signal.getsignal(signal.SIGUSR2) is handler
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
    for bad in (["TERM", 9], [True], ["TERM", None]):
        with pytest.raises(ValueError, match="signals"):
            job.install_preemption_signals(bad)  # type: ignore[arg-type]
    assert job.install_preemption_signals([int(signal.SIGUSR1), "usr2"]) == (
        signal.SIGUSR1,
        signal.SIGUSR2,
    )


@pytest.mark.usefixtures("dispositions")
def test_restore_gives_back_the_earlier_dispositions() -> None:
    def earlier(signum: int, frame: object) -> None:
        pass

    signal.signal(signal.SIGUSR1, earlier)
    signal.signal(signal.SIGUSR2, signal.SIG_IGN)
    int_handler = signal.getsignal(signal.SIGINT)
    job.install_preemption_signals("USR1,USR2,TERM")
    job.install_preemption_signals("USR1,USR2,TERM")  # idempotent: keeps the first "earlier"
    # SIGINT is never touched.
    assert signal.getsignal(signal.SIGINT) is int_handler
    for number in (signal.SIGUSR1, signal.SIGUSR2, signal.SIGTERM):
        assert signal.getsignal(number) is preempt._handle
    # Someone else replaces the SIGTERM handler: restore leaves theirs alone.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    assert job.restore_preemption_signals() == (signal.SIGUSR1, signal.SIGUSR2)
    assert signal.getsignal(signal.SIGUSR1) is earlier
    assert signal.getsignal(signal.SIGUSR2) is signal.SIG_IGN
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_IGN
    assert job.restore_preemption_signals() == ()


@pytest.mark.usefixtures("dispositions")
def test_only_the_main_thread_may_install() -> None:
    errors: list[BaseException] = []

    def other() -> None:
        try:
            job.install_preemption_signals("USR1")
        except BaseException as error:  # noqa: BLE001 - kept for the assertion
            errors.append(error)

    thread = threading.Thread(target=other)
    thread.start()
    thread.join()
    assert len(errors) == 1
    assert isinstance(errors[0], RuntimeError)
    assert "main thread" in str(errors[0])
    assert preempt.installed_signals() == ()
    # Restoring with nothing installed is fine from any thread.
    restored: list[object] = []
    thread = threading.Thread(target=lambda: restored.append(job.restore_preemption_signals()))
    thread.start()
    thread.join()
    assert restored == [()]


# --- a signal in this process ---------------------------------------------------------


@pytest.mark.usefixtures("dispositions")
def test_a_signal_becomes_a_preempted_request(run: Path) -> None:
    request = run / job.SNAPSHOT_REQUEST
    job.install_preemption_signals("USR1,USR2")
    assert job.snapshot_requested() is None
    assert not job.preemption_pending()
    before_wall, before = time.time(), time.monotonic()
    deliver(signal.SIGUSR1)
    notice = preempt.preemption_notice()
    assert notice is not None
    assert (notice.signal, notice.number) == ("SIGUSR1", signal.SIGUSR1)
    assert before <= notice.monotonic <= time.monotonic()
    assert before_wall - 1 <= notice.time <= time.time() + 1
    assert job.preemption_pending()
    assert not request.exists()  # the handler wrote nothing
    assert job.snapshot_requested() == "preempted"
    assert request.read_text() == "preempted"
    assert job.snapshot_requested() == "preempted"
    # A second signal, of another kind, keeps the first notice.
    os.kill(os.getpid(), signal.SIGUSR2)
    time.sleep(0.05)
    assert preempt.preemption_notice() is notice
    assert [p.name for p in run.iterdir()] == [job.SNAPSHOT_REQUEST]  # no temp file left
    preempt.clear_preemption()
    assert not job.preemption_pending()


@pytest.mark.usefixtures("dispositions")
def test_a_file_request_wins_over_a_signal(run: Path) -> None:
    request = run / job.SNAPSHOT_REQUEST
    request.write_text("cost")
    job.install_preemption_signals("USR1")
    deliver(signal.SIGUSR1)
    assert job.snapshot_requested() == "cost"
    assert request.read_text() == "cost"


def test_request_snapshot(run: Path) -> None:
    request = run / job.SNAPSHOT_REQUEST
    assert job.request_snapshot("disk") == "disk"
    assert request.read_text() == "disk"
    # An existing request is never replaced.
    assert job.request_snapshot("preempted") == "disk"
    assert request.read_text() == "disk"
    # An empty file is no request, and is not replaced either.
    request.write_bytes(b"")
    assert job.request_snapshot("preempted") is None
    assert request.read_bytes() == b""
    with pytest.raises(ValueError, match="reason must be one of"):
        job.request_snapshot("evicted")
    assert sorted(p.name for p in run.iterdir()) == [job.SNAPSHOT_REQUEST]


def test_request_snapshot_with_an_odd_path(tmp_path: Path) -> None:
    folder = tmp_path / "a 'b' $(touch pwned)\nc"
    folder.mkdir()
    request = folder / job.SNAPSHOT_REQUEST
    assert job.request_snapshot("cost", path=str(request)) == "cost"
    assert request.read_text() == "cost"
    assert sorted(p.name for p in folder.iterdir()) == [job.SNAPSHOT_REQUEST]
    assert not (tmp_path / "pwned").exists()


def test_request_snapshot_never_raises(tmp_path: Path) -> None:
    # A missing directory: nothing written, no error.
    missing = tmp_path / "missing" / job.SNAPSHOT_REQUEST
    assert job.request_snapshot("preempted", path=str(missing)) is None
    assert not missing.parent.exists()
    # A directory in the request's place: no request, no error, nothing left behind.
    (tmp_path / job.SNAPSHOT_REQUEST).mkdir()
    assert job.request_snapshot("preempted", path=str(tmp_path / job.SNAPSHOT_REQUEST)) is None
    assert [p.name for p in tmp_path.iterdir()] == [job.SNAPSHOT_REQUEST]
    assert list((tmp_path / job.SNAPSHOT_REQUEST).iterdir()) == []


@pytest.mark.usefixtures("dispositions")
def test_snapshot_requested_never_raises_with_a_signal_pending(tmp_path: Path) -> None:
    job.install_preemption_signals("USR1")
    deliver(signal.SIGUSR1)
    missing = tmp_path / "missing" / job.SNAPSHOT_REQUEST
    assert job.snapshot_requested(path=str(missing)) == "preempted"
    assert not missing.parent.exists()


# --- real signals to a real loop ------------------------------------------------------


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGUSR1])
def test_a_signal_stops_the_loop_at_its_next_step(
    tmp_path: Path, loops: list[Any], signum: signal.Signals
) -> None:
    process = start_loop(tmp_path)
    loops.append(process)
    assert ready(process) == "SIGTERM,SIGUSR1"
    time.sleep(5 * STEP_S)
    sent = time.monotonic()
    process.send_signal(signum)
    code, out, err = outcome(process)
    elapsed = time.monotonic() - sent
    assert code == 0, err
    words = out.split()
    assert words[0] == "stop"
    assert int(words[1]) >= 1
    assert words[2:] == ["preempted", signum.name]
    assert elapsed < 2.0  # the next step end, not a timeout
    assert (tmp_path / job.SNAPSHOT_REQUEST).read_text() == "preempted"
    assert sorted(p.name for p in tmp_path.iterdir()) == [job.SNAPSHOT_REQUEST]


def test_an_earlier_request_keeps_its_reason(tmp_path: Path, loops: list[Any]) -> None:
    process = start_loop(tmp_path, "--wait-go")
    loops.append(process)
    ready(process)
    process.send_signal(signal.SIGTERM)
    time.sleep(0.2)
    (tmp_path / job.SNAPSHOT_REQUEST).write_text("cost")
    (tmp_path / "go").touch()
    code, out, err = outcome(process)
    assert code == 0, err
    assert out.split()[2:] == ["cost", "SIGTERM"]
    assert (tmp_path / job.SNAPSHOT_REQUEST).read_text() == "cost"


def test_more_signals_while_pending_do_not_end_the_job(tmp_path: Path, loops: list[Any]) -> None:
    process = start_loop(tmp_path, "--wait-go")
    loops.append(process)
    ready(process)
    for signum in (signal.SIGUSR1, signal.SIGTERM, signal.SIGTERM, signal.SIGUSR1):
        process.send_signal(signum)
        time.sleep(0.05)
    time.sleep(0.2)
    assert process.poll() is None
    (tmp_path / "go").touch()
    code, out, err = outcome(process)
    assert code == 0, err
    assert out.split()[2:] == ["preempted", "SIGUSR1"]  # the first notice is kept


def test_runwardens_cancel_still_ends_the_job_at_once(tmp_path: Path, loops: list[Any]) -> None:
    process = start_loop(tmp_path)
    loops.append(process)
    ready(process)
    # What cancel_script does: the marker first, then SIGTERM to the process group.
    (tmp_path / job.CANCELLING_FILE).touch()
    sent = time.monotonic()
    os.killpg(process.pid, signal.SIGTERM)
    code, out, err = outcome(process)
    assert code == -signal.SIGTERM, (out, err)
    assert time.monotonic() - sent < 1.0
    assert "stop" not in out
    assert not (tmp_path / job.SNAPSHOT_REQUEST).exists()


def test_cancel_after_a_notice_still_ends_the_job(tmp_path: Path, loops: list[Any]) -> None:
    process = start_loop(tmp_path, "--wait-go")
    loops.append(process)
    ready(process)
    process.send_signal(signal.SIGUSR1)  # pending: the job would save at its next step
    time.sleep(0.1)
    (tmp_path / job.CANCELLING_FILE).touch()
    process.send_signal(signal.SIGTERM)
    code, out, _ = outcome(process)
    assert code == -signal.SIGTERM, out


def test_with_cancelling_an_ignored_signal_stays_ignored(tmp_path: Path, loops: list[Any]) -> None:
    process = start_loop(tmp_path, "--wait-go", "--ignore-term")
    loops.append(process)
    ready(process)
    (tmp_path / job.CANCELLING_FILE).touch()
    process.send_signal(signal.SIGTERM)
    time.sleep(0.3)
    assert process.poll() is None  # as without the handler: cancel's SIGKILL ends it
    process.kill()
    assert outcome(process)[0] == -signal.SIGKILL


@pytest.mark.parametrize(
    ("configured", "installed", "ends_on_term"),
    [("", "-", True), ("USR2", "SIGUSR2", True), ("usr1, term", "SIGUSR1,SIGTERM", False)],
)
def test_the_environment_chooses_the_signals(
    tmp_path: Path, loops: list[Any], configured: str, installed: str, ends_on_term: bool
) -> None:
    process = start_loop(tmp_path, **{preempt.PREEMPT_SIGNALS_ENV: configured})
    loops.append(process)
    assert ready(process) == installed
    process.send_signal(signal.SIGTERM)
    code, out, _ = outcome(process)
    if ends_on_term:
        assert code == -signal.SIGTERM, out
        assert not (tmp_path / job.SNAPSHOT_REQUEST).exists()
    else:
        assert (code, out.split()[2:]) == (0, ["preempted", "SIGTERM"])


def test_a_bad_environment_fails_at_install(tmp_path: Path, loops: list[Any]) -> None:
    process = start_loop(tmp_path, **{preempt.PREEMPT_SIGNALS_ENV: "TERM,BOGUS"})
    loops.append(process)
    code, out, err = outcome(process)
    assert code == 1
    assert "ready" not in out
    assert "ValueError: RUNWARDEN_PREEMPT_SIGNALS: unknown signal 'BOGUS'" in err


def test_restored_handlers_let_the_signal_end_the_job(tmp_path: Path, loops: list[Any]) -> None:
    process = start_loop(tmp_path, "--restore")
    loops.append(process)
    assert ready(process) == "SIGTERM,SIGUSR1"
    process.send_signal(signal.SIGUSR1)
    code, out, _ = outcome(process)
    assert code == -signal.SIGUSR1, out


def test_a_forked_worker_survives_a_group_signal_but_not_a_cancel(
    tmp_path: Path, loops: list[Any]
) -> None:
    process = start_loop(tmp_path, "--fork")
    loops.append(process)
    ready(process)
    child = int((tmp_path / "child.pid").read_text())
    try:
        # A signal to the whole group, as systemd or Slurm send it.
        os.killpg(process.pid, signal.SIGTERM)
        code, out, err = outcome(process)
        assert (code, out.split()[2:]) == (0, ["preempted", "SIGTERM"]), err
        time.sleep(0.2)
        assert process_alive(child)  # not killed mid-batch: its parent shuts it down
        (tmp_path / job.CANCELLING_FILE).touch()
        os.kill(child, signal.SIGTERM)
        wait_for(lambda: not process_alive(child))
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(child, signal.SIGKILL)
    # Re-parented to this process (a subreaper, tests/conftest.py): reap it.
    _, status = os.waitpid(child, 0)
    assert os.WIFSIGNALED(status)
    assert os.WTERMSIG(status) == signal.SIGTERM
