"""A private service for one command (`runwarden demo`, `runwarden check-trainer`):
`runwarden serve` on the embedded default in a fresh temporary state directory, with
short clocks, and a local target in it. Nothing of it is shared with another service:
its own Redis, worker and beat, stopped when the command is done.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Final

from schemas import Settings, TargetConfig

from .api import OperationFailed, Runwarden
from .embedded import EmbeddedRedis

__all__ = ["LOCAL_TARGET", "add_local_target", "private_service"]

LOCAL_TARGET: Final = "local"
START_TIMEOUT_S: Final = 60.0
"""How long the service may take to answer (seconds)."""
STOP_TIMEOUT_S: Final = 90.0
"""How long it may take to stop on SIGINT before it is killed (seconds)."""
# Short clocks: a stop completes in seconds even when its job misbehaves.
CLOCKS: Final = {
    "RUNWARDEN_FOLLOW_POLL_S": "0.5",
    "RUNWARDEN_PROOF_TIMEOUT_S": "60",
    "RUNWARDEN_END_TIMEOUT_S": "30",
    "RUNWARDEN_RECONCILE_S": "2",
}


def _serve(state_dir: Path, clocks: Mapping[str, str]) -> subprocess.Popen[bytes]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RUNWARDEN_")}
    env["RUNWARDEN_STATE_DIR"] = str(state_dir)
    env.update(clocks)
    log = (state_dir / "serve.log").open("ab")
    return subprocess.Popen(
        [sys.executable, "-m", "producers.cli", "serve", "--concurrency", "1"],
        env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip


@contextlib.contextmanager
def private_service(
    prefix: str, clocks: Mapping[str, str] | None = None
) -> Iterator[tuple[Runwarden, Path]]:
    """Starts the service in a new state directory `<tmp>/<prefix>XXXX` (kept: its
    `serve.log` and run directories are the command's record), with `CLOCKS` and
    `clocks` over them; yields its API and the directory once Redis answers; stops it
    (SIGINT, then SIGKILL to its group after `STOP_TIMEOUT_S`) on the way out. Within
    it, a SIGTERM raises `KeyboardInterrupt` (main thread only), so that a command
    killed politely ends its runs and the service like one interrupted.

    Raises:
        OperationFailed: the service did not start within `START_TIMEOUT_S`.
    """
    state_dir = Path(tempfile.mkdtemp(prefix=prefix))
    settings = Settings(state_dir=state_dir, redis_url=None)
    # A SIGTERM to the command unwinds it as Ctrl-C does: what it started is stopped.
    previous = signal.signal(signal.SIGTERM, signal.default_int_handler)
    server = _serve(state_dir, {**CLOCKS, **(clocks or {})})
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while not EmbeddedRedis(settings).ping():
            if server.poll() is not None or time.monotonic() > deadline:
                raise OperationFailed(f"the service did not start; see {state_dir / 'serve.log'}")
            time.sleep(0.1)
        yield Runwarden(settings), state_dir
    finally:
        server.send_signal(signal.SIGINT)
        try:
            server.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()
        finally:
            signal.signal(signal.SIGTERM, previous)


def add_local_target(api: Runwarden, workdir: Path, name: str = LOCAL_TARGET) -> None:
    """Adds the local target `name` working in `workdir`. Its jobs run as this user;
    as root, that is said (a root worker refuses a local target that does not)."""
    as_root = {"run_as": "root"} if os.geteuid() == 0 else {}
    api.add_target(TargetConfig(name=name, kind="local", workdir=str(workdir), **as_root))
