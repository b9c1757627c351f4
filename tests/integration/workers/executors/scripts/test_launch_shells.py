"""`workers.executors.scripts.launch`: the on-target watchdog's script (`watchdog_script`)
run directly under both shells a target may have, dash (`sh`) and `busybox sh`,
beside a real process group standing for the job; also with busybox's own `date` and
`sleep` (no `%N`: whole seconds), and with a `date` that fails (the watchdog counts
its sleeps). And the launcher, which starts the watchdog only when asked, and gives
the job, under dash and under busybox alone, its variables and secrets and the notice
watcher its own arguments only."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from schemas.protocol import (
    CANCEL_FILE,
    CANCELLING_FILE,
    END_FILE,
    EXIT_FILE,
    JOB_LOG,
    NOTICE_FILE,
    NOTICE_PID_FILE,
    NOTICE_STATE_FILE,
    PID_FILE,
    SNAPSHOT_FILE,
    SNAPSHOT_REQUEST,
)
from workers.executors import InvalidArgument
from workers.executors.scripts import (
    WATCHDOG_PID_FILE,
    Script,
    launcher_script,
    watchdog_script,
)
from workers.executors.scripts.launch import single_command

from .....conftest import wait_for

POLL_S = 0.2
HOSTILE_DIR = "r $(touch PWNED) 'q' \"d\" `touch PWNED` ;&|<>*?\n\tend"
SHELLS = {
    "dash": (("sh",), None),
    "busybox": (("busybox", "sh"), None),
    "busybox-applets": (("busybox", "sh"), "applets"),
    "no-clock": (("sh",), "broken-date"),
}


class Watchdog:
    """A run directory with a stand-in job (a `sleep` in a group of its own), and a
    watchdog run on it by one shell."""

    def __init__(
        self, shell: tuple[str, ...], kind: str | None, path: str | None, root: Path
    ) -> None:
        self.shell = shell
        self.kind = kind
        self.env = dict(os.environ)
        if path is not None:
            self.env["PATH"] = f"{path}:{self.env['PATH']}"
        self.dir = root / HOSTILE_DIR
        self.dir.mkdir(parents=True)
        self.job = subprocess.Popen(["sleep", "120"], start_new_session=True)
        (self.dir / PID_FILE).write_text(f"{self.job.pid}\n")
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, after_s: float, poll_s: float = POLL_S) -> subprocess.Popen[bytes]:
        dog = watchdog_script(str(self.dir), after_s, poll_s)
        self.proc = subprocess.Popen(
            [*self.shell, "-c", dog.text, "rw-watchdog", *dog.args],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
            env=self.env,
        )
        return self.proc

    @property
    def request(self) -> Path:
        return self.dir / SNAPSHOT_REQUEST

    def end_job(self) -> None:
        self.job.kill()
        self.job.wait()

    def cleanup(self) -> None:
        self.end_job()
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
        if self.proc is not None:
            self.proc.communicate()


@pytest.fixture(params=list(SHELLS))
def dog(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Watchdog]:
    shell, kind = SHELLS[request.param]
    path = None
    if kind is not None:
        bin_dir = tmp_path / "bin"
        bin_dir.mkdir()
        if kind == "applets":
            for name in ("date", "sleep"):
                (bin_dir / name).symlink_to(subprocess.check_output(
                    ["sh", "-c", "command -v busybox"], text=True).strip())  # fmt: skip
        else:
            (bin_dir / "date").write_text("#!/bin/sh\nexit 1\n")
            (bin_dir / "date").chmod(0o755)
        path = str(bin_dir)
    watchdog = Watchdog(shell, kind, path, tmp_path / "work")
    yield watchdog
    watchdog.cleanup()
    assert not list(tmp_path.rglob("PWNED"))


def test_the_clock_is_the_one_asked_for(dog: Watchdog) -> None:
    out = (
        subprocess.run(
            [*dog.shell, "-c", "date +%s%N"], capture_output=True, env=dog.env, check=False
        )
        .stdout.decode()
        .strip()
    )
    if dog.kind == "applets":
        assert out.endswith("%N")  # no nanoseconds: the whole-seconds path
    elif dog.kind == "broken-date":
        assert out == ""
    else:
        assert out.isdigit()


def test_it_fires_then_waits_for_the_job(dog: Watchdog) -> None:
    started = time.monotonic()
    proc = dog.start(after_s=1.0)
    wait_for(dog.request.exists, timeout_s=10, interval_s=0.02)
    took = time.monotonic() - started
    # A ms clock fires at 1 s; whole seconds (busybox date) within a second of it.
    assert 0 < took < 5, took
    assert dog.request.read_text() == "deadline"
    pid_file = dog.dir / WATCHDOG_PID_FILE
    assert pid_file.read_text() == f"{proc.pid}\n"
    time.sleep(3 * POLL_S)
    assert proc.poll() is None  # it waits for the job's end
    (dog.dir / EXIT_FILE).write_text("0\n")  # forged by the job: its group still lives
    time.sleep(3 * POLL_S)
    assert proc.poll() is None
    dog.end_job()
    proc.wait(timeout=POLL_S + 1)
    assert proc.returncode == 0
    assert sorted(os.listdir(dog.dir)) == [".runwarden", EXIT_FILE, PID_FILE, SNAPSHOT_REQUEST]


def test_a_sub_second_fire_time(dog: Watchdog) -> None:
    started = time.monotonic()
    dog.start(after_s=0.3, poll_s=0.05)
    wait_for(dog.request.exists, timeout_s=10, interval_s=0.01)
    assert time.monotonic() - started < 2.0
    assert dog.request.read_text() == "deadline"


@pytest.mark.parametrize("reason", ["cost", "", "requested\n"])
def test_a_request_already_there_is_never_replaced(dog: Watchdog, reason: str) -> None:
    dog.request.write_text(reason)
    proc = dog.start(after_s=0.1)
    time.sleep(1.5)
    assert proc.poll() is None
    assert dog.request.read_text() == reason
    dog.end_job()
    proc.wait(timeout=POLL_S + 1)
    assert not [name for name in os.listdir(dog.dir) if "tmp" in name]


@pytest.mark.parametrize("marker", [EXIT_FILE, CANCEL_FILE])
def test_a_forged_end_does_not_stop_it(dog: Watchdog, marker: str) -> None:
    # The job can write every file of its run directory: only its group's end counts.
    proc = dog.start(after_s=1.0)
    (dog.dir / marker).write_text("0\n")
    wait_for(dog.request.exists, timeout_s=10, interval_s=0.02)
    assert dog.request.read_text() == "deadline"
    assert proc.poll() is None
    dog.end_job()
    proc.wait(timeout=POLL_S + 1)
    assert proc.returncode == 0


@pytest.mark.parametrize("marker", ["group", "directory"])
def test_it_exits_with_the_job_and_writes_nothing(dog: Watchdog, marker: str) -> None:
    proc = dog.start(after_s=1.5)
    time.sleep(0.3)
    assert proc.poll() is None
    ended = time.monotonic()
    if marker == "group":
        dog.end_job()
    elif marker == "directory":
        shutil.rmtree(dog.dir)
    else:
        (dog.dir / marker).write_text("")
    proc.wait(timeout=POLL_S + 1)
    assert time.monotonic() - ended < POLL_S + 1
    assert proc.returncode == 0
    time.sleep(1.5)
    assert not dog.request.exists()


@pytest.mark.parametrize("content", [None, "", "0\n", "1\n", "abc\n", "-5\n", "99999999999\n"])
def test_a_bad_job_pid_ends_it_at_once(dog: Watchdog, content: str | None) -> None:
    if content is None:
        (dog.dir / PID_FILE).unlink()
    else:
        (dog.dir / PID_FILE).write_text(content)
    proc = dog.start(after_s=0.01)
    proc.wait(timeout=5)
    assert proc.returncode == 3
    assert not dog.request.exists()
    assert not (dog.dir / WATCHDOG_PID_FILE).exists()


@pytest.mark.parametrize(
    ("after_s", "poll_s"),
    [(0, 1), (-1, 1), (float("nan"), 1), (float("inf"), 1), (1e10, 1), (1, 0), (1, -1),
     (1, float("inf"))],
)  # fmt: skip
def test_bad_times_are_refused(after_s: float, poll_s: float) -> None:
    with pytest.raises(InvalidArgument):
        watchdog_script("/w/r", after_s, poll_s)
    with pytest.raises(InvalidArgument):
        launcher_script("/w/r", "true", {}, [], (after_s, poll_s))


def test_times_are_rounded_to_milliseconds() -> None:
    assert watchdog_script("/w/r", 0.0001, 0.0001).args[1:3] == ("1", "10")
    assert watchdog_script("/w/r", 54_000.0, 5.0).args[1:3] == ("54000000", "5000")


def test_the_launcher_starts_a_watchdog_only_when_asked() -> None:
    plain = launcher_script("/w/r", "true", {}, ["TOKEN"])
    with_dog = launcher_script("/w/r", "true", {}, ["TOKEN"], (10.0, 1.0))
    assert plain.text == with_dog.text
    dog_text = watchdog_script("/w/r", 10.0, 1.0).text
    assert dog_text not in plain.args
    assert dog_text in with_dog.args
    # Secrets are read in the subshell that starts the job, never in the launcher's
    # own name space: they never reach the watchdog, started after it.
    subshell_end = plain.text.index(") || exit 4")
    assert plain.text.index('IFS= read -r "$1"') < subshell_end
    assert plain.text.index("rw_companion rw-watchdog") > subshell_end
    assert "TOKEN" in plain.args


def test_the_launcher_starts_a_notice_watcher_only_when_asked() -> None:
    watcher = Script("rw_mode=$2  # the notice watcher", ("/w/r", "gcp"))
    plain = launcher_script("/w/r", "true", {}, ["TOKEN"], (10.0, 1.0))
    assert watcher.text not in plain.args
    script = launcher_script("/w/r", "true", {}, ["TOKEN"], notice_watcher=watcher)
    # Its section: its text and arguments, after the watchdog's (empty here).
    at = script.args.index(watcher.text)
    assert script.args[at - 2 : at + 4] == ("", "--", watcher.text, "/w/r", "gcp", "--")
    # Its own session, after the subshell that reads the secrets: it never has them.
    text = script.text
    assert text.index(") || exit 4") < text.index("rw_companion rw-notice")
    assert text.index("rw_companion rw-watchdog") < text.index("rw_companion rw-notice")


def test_a_launcher_argument_that_would_end_its_section_is_refused() -> None:
    with pytest.raises(InvalidArgument):
        launcher_script("/w/r", "true", {}, ["--"])
    with pytest.raises(InvalidArgument):
        launcher_script("/w/r", "true", {}, [], notice_watcher=Script("true", ("--",)))
    with pytest.raises(InvalidArgument):
        launcher_script("--", "true", {}, [])


def test_the_launcher_clears_a_stale_run() -> None:
    text = launcher_script("/w/r", "true", {}, []).text
    begin = text.index("rm -f --")
    clearing = text[begin : text.index("|| exit 3", begin)].replace("\\\n", " ") + " "
    for name in (
        EXIT_FILE, CANCELLING_FILE, CANCEL_FILE, PID_FILE, WATCHDOG_PID_FILE, END_FILE,
        SNAPSHOT_REQUEST, SNAPSHOT_FILE, NOTICE_FILE, NOTICE_STATE_FILE, NOTICE_PID_FILE,
    ):  # fmt: skip
        assert f" {name} " in clearing, name


# Records its `$0`, arguments and environment in the run directory (its first
# argument), as a companion of the job.
RECORD = 'printf "%s\\000" "$0" "$@" > "$1/companion.args"; env > "$1/companion.env"'


def busybox_path(root: Path) -> str:
    """A directory of every busybox applet, to be a whole `PATH`: the launcher, the
    wrapper and the job's shell then all are busybox `sh`."""
    root.mkdir()
    busybox = shutil.which("busybox")
    assert busybox is not None
    applets = subprocess.run([busybox, "--list"], capture_output=True, text=True, check=True)
    for name in applets.stdout.split():
        (root / name).symlink_to(busybox)
    return str(root)


@pytest.mark.parametrize("shell", ["dash", "busybox"])
@pytest.mark.parametrize("how", ["command", "script"])
def test_the_launcher_gives_each_one_its_own_words(tmp_path: Path, shell: str, how: str) -> None:
    """The job gets its variables and secrets (and no positional parameter), the
    notice watcher only its own arguments then the job's pid and start time, none of
    the job's variables or secrets; under dash and under busybox alone."""
    env = dict(os.environ)
    if shell == "busybox":
        env["PATH"] = busybox_path(tmp_path / "bin")
    run = tmp_path / HOSTILE_DIR
    value = "a 'b' \"c\" $(touch PWNED) `touch PWNED` ;&|<>* \\ "
    secret = " s3cr3t $(touch PWNED) 'q' "
    script = (
        # One command, exec'd: its arguments are what it prints.
        "env printf %s:%s:%s 'one two' three 'four\"'"
        if how == "command"
        else 'printf "%s:%s:%s:%s" "$#" "$VISIBLE" "$HIDDEN" "$RUNWARDEN_RUN_ID"; exit 3'
    )
    assert single_command(script) is (how == "command")
    launcher = launcher_script(
        str(run),
        script,
        {"VISIBLE": value, "RUNWARDEN_RUN_ID": "t-words"},
        ["HIDDEN"],
        notice_watcher=Script(RECORD, (str(run), "x y", "")),
    )
    started = subprocess.run(
        ["sh", "-c", launcher.text, "rw", *launcher.args],
        input=f"{secret}\n".encode(),
        capture_output=True,
        env=env,
        start_new_session=True,
        timeout=30,
        check=True,
    )
    pid, start = started.stdout.decode().split()
    code = wait_for(lambda: (run / EXIT_FILE).exists() and (run / EXIT_FILE).read_text())
    log = (run / JOB_LOG).read_text()
    if how == "command":
        assert (code, log) == ("0\n", 'one two:three:four"')
    else:
        assert (code, log) == ("3\n", f"0:{value}:{secret}:t-words")
    args = wait_for(lambda: (run / "companion.args").exists() and (run / "companion.args"))
    assert args.read_text().split("\0") == ["rw-notice", str(run), "x y", "", pid, start, ""]
    companion_env = (run / "companion.env").read_text()
    assert "VISIBLE" not in companion_env
    assert "s3cr3t" not in companion_env
    assert "RUNWARDEN_RUN_ID" not in companion_env
    assert not list(tmp_path.rglob("PWNED"))
