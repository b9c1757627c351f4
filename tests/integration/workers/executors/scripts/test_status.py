"""`workers.executors.scripts.status`: the status and cancel scripts under dash (`sh`)
and `busybox sh` with real detached processes (the `sh` fixture), and the parsers of
their answers, on examples and as properties."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from schemas import JobId, JobStatus
from schemas.protocol import CANCEL_FILE, CANCELLING_FILE, EXIT_FILE, JOB_LOG, PID_FILE
from workers.executors import (
    InvalidArgument,
    LocalExecutor,
    LocalTransport,
    ProtocolError,
    ScriptExecutor,
    parse_status,
)
from workers.executors.scripts import parse_statuses
from workers.executors.scripts import status as status_scripts

from .....conftest import wait_for
from .....shells import DEAD_PID, HOSTILE_DIR, HOSTILE_NAMES, Shell, crafted, group_alive, no_pwned

# --- status -----------------------------------------------------------------------


def test_running_then_exited(sh: Shell) -> None:
    job = sh.spawn("sleep 0.4; exit 3")
    assert sh.executor.status(job) == JobStatus.RUNNING
    assert wait_for(lambda: sh.finished(job)) == JobStatus.exited(3)
    assert (Path(job.dir) / PID_FILE).read_text() == f"{job.pid}\n"
    assert (Path(job.dir) / EXIT_FILE).read_text() == "3\n"


def test_exited_zero_and_negative_codes(sh: Shell) -> None:
    job = sh.spawn("echo hello")
    assert wait_for(lambda: sh.finished(job)) == JobStatus.exited(0)
    assert (Path(job.dir) / JOB_LOG).read_text() == "hello\n"
    # The wrapper writes the code; a code another tool wrote still reads.
    other = crafted(sh, "other", {EXIT_FILE: "-15\n"})
    assert sh.executor.status(other) == JobStatus.exited(-15)


def test_lost_when_killed_without_an_exit_code(sh: Shell) -> None:
    job = sh.spawn("sleep 60")
    os.killpg(job.pid, signal.SIGKILL)
    assert wait_for(lambda: sh.finished(job)) == JobStatus.LOST
    assert not (Path(job.dir) / EXIT_FILE).exists()


def test_lost_without_a_directory_or_a_group(sh: Shell) -> None:
    missing = JobId(dir=sh.run_dir("never-there"), pid=DEAD_PID)
    empty = crafted(sh, "empty")
    assert sh.executor.statuses([missing, empty]) == [JobStatus.LOST, JobStatus.LOST]


def test_the_markers_decide_in_overbrainers_order(sh: Shell) -> None:
    jobs = [
        crafted(sh, "a", {CANCEL_FILE: "", EXIT_FILE: "0\n", CANCELLING_FILE: ""}),
        crafted(sh, "b", {CANCELLING_FILE: "", EXIT_FILE: "4\n"}),
        crafted(sh, "c", {CANCELLING_FILE: ""}),
        crafted(sh, "d", {EXIT_FILE: "7\n"}),
        crafted(sh, "e", {PID_FILE: f"{DEAD_PID}\n"}),
        JobId(dir=sh.run_dir("f"), pid=DEAD_PID),
    ]
    assert sh.executor.statuses(jobs) == [
        JobStatus.CANCELLED,
        JobStatus.exited(4),
        JobStatus.CANCELLED,
        JobStatus.exited(7),
        JobStatus.LOST,
        JobStatus.LOST,
    ]


def test_cancelling_with_a_live_group_is_running(sh: Shell) -> None:
    job = sh.spawn("sleep 60")
    (Path(job.dir) / CANCELLING_FILE).touch()
    (Path(job.dir) / EXIT_FILE).write_text("0\n")  # a recycled pid's old exit code
    assert sh.executor.status(job) == JobStatus.RUNNING
    (Path(job.dir) / EXIT_FILE).unlink()
    os.killpg(job.pid, signal.SIGKILL)
    assert wait_for(lambda: sh.finished(job)) == JobStatus.CANCELLED


def test_a_garbled_exit_code_is_no_exit_code(sh: Shell) -> None:
    # The job can write its run directory: garbage there ends the run as lost, for
    # that run alone, rather than failing every status of it for ever.
    for i, content in enumerate(["abc\n", "", "1 2\n", "99999999999999\n", "1-2\n", "-\n"]):
        job = crafted(sh, f"g{i}", {EXIT_FILE: content})
        assert sh.executor.status(job) == JobStatus.LOST, content
    job = crafted(sh, "gdir", {})
    (Path(job.dir) / EXIT_FILE).mkdir()
    assert sh.executor.status(job) == JobStatus.LOST


# Regression (found by the chaos campaign, bench/chaos.py, failed before its fix): a job
# that put garbage in `exit_code` (a 100 MiB file) and was then cancelled read as lost
# (so its run ended failed) between the kill and the `cancelled` marker, and for ever
# when its cancel died there.
def test_a_garbled_exit_code_of_a_cancelled_job_is_cancelled(sh: Shell) -> None:
    for i, content in enumerate(["\0" * 64, "abc\n", "", "99999999999999\n"]):
        job = crafted(sh, f"c{i}", {EXIT_FILE: content, CANCELLING_FILE: ""})
        assert sh.executor.status(job) == JobStatus.CANCELLED, content
        known = job.model_copy(update={"start": 12345})
        assert sh.executor.status(known) == JobStatus.CANCELLED, content
    job = crafted(sh, "cdir", {CANCELLING_FILE: ""})
    (Path(job.dir) / EXIT_FILE).mkdir()
    assert sh.executor.status(job) == JobStatus.CANCELLED


def test_status_of_dirs_with_shell_metacharacters(sh: Shell) -> None:
    names = [HOSTILE_DIR, *HOSTILE_NAMES, "-n", "*", "--", "-e"]
    jobs = [crafted(sh, name, {EXIT_FILE: f"{i}\n"}) for i, name in enumerate(names)]
    assert sh.executor.statuses(jobs) == [JobStatus.exited(i) for i in range(len(names))]
    assert no_pwned(sh.workdir)


def test_a_job_in_a_hostile_directory(sh: Shell) -> None:
    job = sh.spawn("echo ok; sleep 60", HOSTILE_DIR)
    assert Path(job.dir).name == HOSTILE_DIR
    assert sh.executor.status(job) == JobStatus.RUNNING
    log = Path(job.dir) / JOB_LOG
    # Started is not yet run: on a loaded machine the cancel could come before the echo.
    wait_for(lambda: log.read_text().startswith("ok\n"))
    sh.executor.cancel(job)
    assert sh.executor.status(job) == JobStatus.CANCELLED
    assert not group_alive(job.pid)
    # The job's shell outlives the SIGTERM to wait for `sleep`, and reports its end
    # ("Terminated") before the cancel's marker makes it end too.
    assert log.read_text().startswith("ok\n")
    assert no_pwned(sh.workdir)


def test_statuses_of_real_jobs_in_order(sh: Shell) -> None:
    running = sh.spawn("sleep 60", "a")
    exited = sh.spawn("exit 9", "b")
    cancelled = sh.spawn("sleep 60", "c")
    sh.executor.cancel(cancelled)
    wait_for(lambda: sh.finished(exited))
    gone = JobId(dir=sh.run_dir("gone"), pid=DEAD_PID)
    assert sh.fresh().statuses([running, exited, cancelled, gone]) == [
        JobStatus.RUNNING,
        JobStatus.exited(9),
        JobStatus.CANCELLED,
        JobStatus.LOST,
    ]


# Regression (found by review, failed before its fix): one garbage exit code in a batch hides
# neither the other runs' statuses from `parse_statuses` nor from an executor's `statuses`.
def test_one_garbage_exit_code_does_not_hide_the_other_statuses(tmp_path: Path) -> None:
    assert parse_statuses(b"running\nexited zz\nlost\n", 3)[0] == JobStatus.RUNNING
    results = parse_statuses(b"running\nexited zz\nlost\n", 3)
    assert isinstance(results[1], ProtocolError)
    assert results[2] == JobStatus.LOST

    executor = LocalExecutor(tmp_path)
    good, bad = tmp_path / "good", tmp_path / "bad"
    for run, code in ((good, "3\n"), (bad, "not a number\n")):
        run.mkdir()
        (run / "exit_code").write_text(code)
    jobs = [JobId(dir=str(good), pid=999_999), JobId(dir=str(bad), pid=999_998)]
    statuses = executor.statuses(jobs)
    assert statuses[0] == JobStatus.exited(3)
    assert statuses[1] == JobStatus.LOST  # garbage is no exit code, for that run alone


# --- cancel -----------------------------------------------------------------------


def test_cancel_a_running_job(sh: Shell) -> None:
    job = sh.spawn("sleep 60 & sleep 60; wait")
    started = time.monotonic()
    sh.executor.cancel(job)
    assert time.monotonic() - started < 5
    assert sh.executor.status(job) == JobStatus.CANCELLED
    assert (Path(job.dir) / CANCELLING_FILE).exists()
    assert (Path(job.dir) / CANCEL_FILE).exists()
    assert not (Path(job.dir) / EXIT_FILE).exists()
    assert not group_alive(job.pid)


def test_a_job_handling_sigterm_is_cancelled_quickly(sh: Shell) -> None:
    job = sh.spawn("trap 'echo handled; exit 0' TERM; echo ready; while :; do sleep 0.05; done")
    log = Path(job.dir) / JOB_LOG
    wait_for(lambda: log.exists() and "ready" in log.read_text())
    started = time.monotonic()
    sh.executor.cancel(job)
    assert time.monotonic() - started < 3  # well before the 10 s SIGKILL escalation
    assert sh.executor.status(job) == JobStatus.CANCELLED
    assert "handled" in log.read_text()
    assert not group_alive(job.pid)


def test_the_waits_of_a_cancel_go_by_the_clock_not_the_naps(
    sh: Shell, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A loaded machine makes each 0.1 s nap of the cancel script take far longer (here
    every `sleep` takes 0.5 s): the wait after SIGTERM still ends by the clock (1 s
    here, 10 s in service), so a deaf job gets its SIGKILL in time and the cancel ends
    within its deadline."""
    bin_dir = tmp_path / "slow-bin"
    bin_dir.mkdir()
    (bin_dir / "sleep").write_text("#!/bin/sh\nexec /bin/sleep 0.5\n")
    (bin_dir / "sleep").chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    loaded = ScriptExecutor(LocalTransport(env=env, shell=sh.shell), str(sh.workdir))
    monkeypatch.setattr(status_scripts, "CANCEL_TERM_WAIT_S", 1)
    job = sh.spawn("trap '' TERM; echo ready; while :; do sleep 0.05; done")
    log = Path(job.dir) / JOB_LOG
    wait_for(lambda: log.exists() and "ready" in log.read_text())
    started = time.monotonic()
    loaded.cancel(job)
    assert time.monotonic() - started < 4.0  # by the naps alone: 10 x 0.5 s, then more
    assert sh.executor.status(job) == JobStatus.CANCELLED
    assert not group_alive(job.pid)


def test_cancel_is_idempotent_and_spares_ended_jobs(sh: Shell) -> None:
    job = sh.spawn("sleep 60")
    sh.executor.cancel(job)
    marker = Path(job.dir) / CANCEL_FILE
    before = marker.stat().st_mtime_ns
    sh.fresh().cancel(job)
    assert marker.stat().st_mtime_ns == before
    exited = sh.spawn("exit 0", "exited")
    wait_for(lambda: sh.finished(exited))
    sh.executor.cancel(exited)
    assert sh.executor.status(exited) == JobStatus.exited(0)
    assert not (Path(exited.dir) / CANCELLING_FILE).exists()
    assert not (Path(exited.dir) / CANCEL_FILE).exists()


def test_cancel_errors(sh: Shell) -> None:
    # A run directory that is gone, with no live group, leaves nothing to cancel.
    sh.executor.cancel(JobId(dir=sh.run_dir("gone"), pid=DEAD_PID))
    assert not Path(sh.run_dir("gone")).exists()
    run = sh.workdir / "run"
    run.mkdir()
    for pid in (0, 1):
        job = JobId.model_construct(dir=str(run), pid=pid, container=None)
        with pytest.raises(InvalidArgument):
            sh.executor.cancel(job)
    assert not (run / CANCELLING_FILE).exists()


# --- status lines, as properties --------------------------------------------------


statuses = st.one_of(
    st.sampled_from([JobStatus.RUNNING, JobStatus.CANCELLED, JobStatus.LOST]),
    st.integers(-(2**31), 2**31 - 1).map(JobStatus.exited),
)


def status_line(status: JobStatus) -> str:
    """The line `status_script` prints for `status`."""
    return f"exited {status.code}" if status.kind == "exited" else status.kind


@given(st.text(max_size=40))
def test_parse_status_returns_a_status_or_a_protocol_error(text: str) -> None:
    try:
        got = parse_status(text)
    except ProtocolError:
        return
    assert isinstance(got, JobStatus)
    assert status_line(got) == text.strip() or text.strip().startswith("exited ")


@given(st.text(alphabet="exitd runglcaso-0123456789\n\t", max_size=24))
def test_parse_status_on_status_looking_text(text: str) -> None:
    try:
        got = parse_status(text)
    except ProtocolError:
        return
    assert got.kind == "exited" or status_line(got) == text.strip()
    if got.kind == "exited":
        assert text.strip().startswith("exited ")
        assert got.code == int(text.strip()[7:])


@given(statuses, st.sampled_from(["", "\n", " ", "\r\n"]))
def test_status_lines_round_trip(status: JobStatus, end: str) -> None:
    assert parse_status(status_line(status) + end) == status


@given(st.integers(2**31, 10**11 - 1) | st.integers(-(10**11) + 1, -(2**31) - 1))
def test_exit_codes_out_of_i32_are_no_exit_code(code: int) -> None:
    assert parse_status(f"exited {code}") == JobStatus.LOST


@given(st.lists(statuses, max_size=6), st.integers(0, 8))
def test_parse_statuses_counts_lines(expected: list[JobStatus], count: int) -> None:
    output = "".join(status_line(s) + "\n" for s in expected).encode()
    if count == len(expected):
        assert parse_statuses(output, count) == expected
    else:
        with pytest.raises(ProtocolError):
            parse_statuses(output, count)
