"""What the notice watcher's tests and benchmark run it in: a shell (dash or busybox
`sh`), a PATH holding only the tools asked for (so the others are absent: no curl,
no wget, busybox's wget in place of GNU's), and a run directory with a stand-in job
(a `sleep` in a process group of its own, its pid in `job.pid`), as the watchdog's
tests do."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import cast

from schemas.protocol import PID_FILE, SNAPSHOT_REQUEST
from workers.executors.notices import (
    NOTICE_FILE,
    NOTICE_PID_FILE,
    NOTICE_STATE_FILE,
    NOTICE_TOOLS,
    Provider,
    notice_watch_script,
)

from .fakecloud import FAKES, FakeCloud
from .processes import kill_session

__all__ = [
    "CLIENTS",
    "ENVS",
    "HOSTILE_DIR",
    "Env",
    "Watched",
    "closed_port_url",
    "none_naming",
    "processes_naming",
    "running",
    "tool_dir",
    "wait_until",
]

HOSTILE_DIR = "r $(touch PWNED) 'q' \"d\" `touch PWNED` ;&|<>*?\n\tend"
CLIENTS = ("curl", "wget", "busybox-wget", "none")


@dataclass(frozen=True)
class Env:
    """A shell and an HTTP client: `dash` runs with the GNU tools, `busybox` with
    busybox's applets for every tool (as on a busybox-only target)."""

    shell: str
    client: str

    @property
    def id(self) -> str:
        return f"{self.shell}-{self.client}"


ENVS = tuple(Env(shell, client) for shell in ("dash", "busybox") for client in CLIENTS)


def _which(name: str) -> str:
    found = shutil.which(name)
    if found is None:
        raise RuntimeError(f"{name} is not installed here (make system-deps installs it)")
    return found


def tool_dir(root: Path, env: Env) -> Path:
    """A directory of symbolic links to exactly the tools of `env`: the shell as
    `sh`, [`NOTICE_TOOLS`], `timeout`, and its client (none for `none`)."""
    bin_dir = root / f"bin-{env.id}"
    bin_dir.mkdir(parents=True)
    busybox = _which("busybox")
    for tool in (*NOTICE_TOOLS, "timeout"):
        if tool == "sh":
            target = busybox if env.shell == "busybox" else _which("dash")
        else:
            target = busybox if env.shell == "busybox" else _which(tool)
        (bin_dir / tool).symlink_to(target)
    if env.client == "curl":
        (bin_dir / "curl").symlink_to(_which("curl"))
    elif env.client == "wget":
        (bin_dir / "wget").symlink_to(_which("wget"))
    elif env.client == "busybox-wget":
        (bin_dir / "wget").symlink_to(busybox)
    return bin_dir


class Watched:
    """A run directory (a hostile name) with a stand-in job, and the watcher run on
    it by the shell of an [`Env`], with only that env's tools on its PATH."""

    def __init__(self, root: Path, env: Env) -> None:
        self.env = env
        self.bin = tool_dir(root, env)
        self.dir = root / "work" / HOSTILE_DIR
        self.dir.mkdir(parents=True)
        self.job = subprocess.Popen(["sleep", "600"], start_new_session=True)
        (self.dir / PID_FILE).write_text(f"{self.job.pid}\n")
        self.proc: subprocess.Popen[bytes] | None = None
        self._nonces: dict[int, str] = {}

    def start(
        self,
        provider: str,
        urls: Mapping[str, str],
        poll_s: float,
        extra_env: Mapping[str, str] | None = None,
    ) -> subprocess.Popen[bytes]:
        # The generator checks the provider: a test may pass any string.
        script = notice_watch_script(str(self.dir), cast(Provider, provider), urls, poll_s)
        self.proc = subprocess.Popen(
            [str(self.bin / "sh"), "-c", script.text, "rw-notice", *script.args],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
            env={"PATH": str(self.bin), "HOME": "/nonexistent", **(extra_env or {})},
        )
        self._nonces[self.proc.pid] = script.args[6]
        return self.proc

    def scratch(self, proc: subprocess.Popen[bytes] | None = None) -> list[Path]:
        """The scratch directories in /tmp of the watcher `proc` (the last one started
        by default), found by its pid and nonce: pids wrap within a suite, and a
        watcher another test killed may have left one under the same pid."""
        proc = proc or self.proc
        assert proc is not None
        return list(Path("/tmp").glob(f"rw-notice.{proc.pid}.{self._nonces[proc.pid]}*"))

    @property
    def request(self) -> Path:
        return self.dir / SNAPSHOT_REQUEST

    @property
    def notice(self) -> Path:
        return self.dir / NOTICE_FILE

    @property
    def pid_file(self) -> Path:
        return self.dir / NOTICE_PID_FILE

    def state(self) -> str:
        """The state line, or "" while there is none."""
        try:
            return (self.dir / NOTICE_STATE_FILE).read_text().strip()
        except FileNotFoundError:
            return ""

    def end_job(self) -> None:
        self.job.kill()
        self.job.wait()

    def cleanup(self) -> None:
        """Ends the job; the watcher then ends by itself (SIGKILL after 3 s), with
        everything of its session; a scratch directory it left is removed."""
        self.end_job()
        if self.proc is None:
            return
        try:
            self.proc.communicate(timeout=3)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, 9)
            self.proc.communicate()
        # Its children and requests share its session: none may outlive it.
        kill_session(self.proc.pid)
        for scratch in Path("/tmp").glob(f"rw-notice.{self.proc.pid}.*"):
            shutil.rmtree(scratch, ignore_errors=True)


def processes_naming(port: int) -> list[int]:
    """Live processes whose command line names `127.0.0.1:<port>`: the watcher (its
    arguments hold the URL), its loops and its HTTP clients; zombies left out. A pass
    over every process of the machine ([`none_naming`] waits on it)."""
    needle = f"127.0.0.1:{port}".encode()
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        with contextlib.suppress(OSError, IndexError):
            if needle not in cmdline.read_bytes():
                continue
            stat = (cmdline.parent / "stat").read_text()
            if stat.rsplit(")", 1)[1].split()[0] != "Z":
                found.append(int(cmdline.parent.name))
    return found


def none_naming(port: int, timeout_s: float) -> bool:
    """Whether, within `timeout_s`, no live process names `127.0.0.1:<port>`
    ([`processes_naming`], a pass over every process: looked at every 50 ms)."""
    return wait_until(lambda: not processes_naming(port), timeout_s, interval_s=0.05) is not None


def wait_until(condition: object, timeout_s: float, interval_s: float = 0.005) -> float | None:
    """Seconds until `condition()` is truthy, polled every `interval_s`; None when it
    was not within `timeout_s`."""
    assert callable(condition)
    started = time.monotonic()
    while True:
        if condition():
            return time.monotonic() - started
        if time.monotonic() - started > timeout_s:
            return None
        time.sleep(interval_s)


@contextlib.contextmanager
def running(cloud: str) -> Iterator[FakeCloud]:
    """A fake of `cloud` (`aws`, `gcp`, `azure`), closed at the end."""
    fake = FAKES[cloud]()
    try:
        yield fake
    finally:
        fake.close()


def closed_port_url() -> str:
    """A loopback base URL where nothing listens (connections are refused)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}"
