"""The service in the foreground, as `runwarden serve` runs it: the embedded Redis
(when no URL is set), a worker for the stops and the watch, a worker for retrievals,
beat, and optionally Flower and the web view; supervised until asked to stop or until
one of them ends, then stopped in order (workers finish what they run: a cancel runs
to its end)."""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from schemas import Settings
from schemas.auth import OPERATOR, WORKER
from schemas.events import DEFAULT_QUEUE, QUEUE, QUEUE_RETRIEVE, QUEUE_WATCH
from schemas.secrets import FLOWER_AUTH, producer_key_file

from .api import Runwarden
from .embedded import EmbeddedRedis
from .web import make_server

__all__ = ["FLOWER_CONFIG", "Service", "ServiceOptions"]

FLOWER_CONFIG: Final = Path(__file__).resolve().parent / "flower_config.py"
STOP_WAIT_S: Final = 60.0
"""How long a process has to end after SIGTERM before it is killed, in seconds."""


@dataclass(frozen=True)
class ServiceOptions:
    """What to run besides the workers and beat."""

    concurrency: int = 2
    flower: bool = False
    flower_port: int = 5555
    web: bool = False
    web_port: int = 8350


class _WebThread:
    """The web view served by uvicorn on a thread (uvicorn installs signal handlers on
    the main thread only, so the caller's stay in charge)."""

    def __init__(self, api: Runwarden, options: ServiceOptions, user: str, password: str) -> None:
        flower_url = f"http://127.0.0.1:{options.flower_port}" if options.flower else None
        self._server = make_server(
            api, "127.0.0.1", options.web_port, user=user, password=password, flower_url=flower_url
        )
        self._thread = threading.Thread(target=self._server.run, name="web", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=10)


class Service:
    """One run of the service with `settings` and `options`."""

    def __init__(self, settings: Settings, options: ServiceOptions) -> None:
        self.settings = settings
        self.options = options
        self.embedded = EmbeddedRedis(settings) if settings.redis_url is None else None
        self.env = dict(os.environ)
        self._web: _WebThread | None = None

    def credentials(self) -> tuple[str, str, Path]:
        """The `user:password` of Flower and the web view (the secrets directory's
        `flower-basic-auth`, generated once, mode 0600) and where it is."""
        made = f"runwarden:{secrets.token_urlsafe(24)}"
        value, _ = self.settings.secrets.ensure(FLOWER_AUTH, made)
        user, _, password = value.get_secret_value().partition(":")
        return user, password, self.settings.secrets.path / FLOWER_AUTH

    def prepare(self) -> list[str]:
        """Creates what is missing in the secrets directory, starts the embedded Redis,
        and returns what to tell the person.

        Raises:
            NotServing: the embedded Redis does not start.
            SecretsError: the secrets directory cannot be written.
        """
        said = []
        self.settings.state_dir.mkdir(parents=True, exist_ok=True)
        for producer in (OPERATOR, WORKER):
            self.settings.secrets.ensure(producer_key_file(producer))
        if self.embedded is not None:
            self.embedded.start()
            said.append(f"redis: embedded, {self.settings.embedded_socket}")
        if self.options.flower or self.options.web:
            user, password, where = self.credentials()
            said.append(f"credentials of Flower and the web view: {where}")
            if self.options.flower:
                self.env["RUNWARDEN_FLOWER_AUTH_FILE"] = str(where)
            if self.options.web:
                self._web = _WebThread(Runwarden(self.settings), self.options, user, password)
        return said

    def commands(self) -> list[list[str]]:
        """The command line of each process to run (no secret on any of them)."""
        python, options = sys.executable, self.options
        commands = [
            [python, "-m", "workers.reaper", "--restart", "--",
             python, "-m", "celery", "-A", "workers.app", "worker",
             "-Q", f"{QUEUE},{DEFAULT_QUEUE}", "-c", str(options.concurrency), "-E",
             "-n", "runwarden@%h", "--loglevel", "INFO"],
            # Retrievals download for as long as they take, on a worker of their own.
            [python, "-m", "workers.reaper", "--restart", "--",
             python, "-m", "celery", "-A", "workers.app", "worker", "-Q", QUEUE_RETRIEVE,
             "-c", "1", "-E", "-n", "retrieve@%h", "--loglevel", "INFO"],
            # The follow ticks, on a worker of their own: a storm of cancels (each holds
            # a process while its job dies) never holds back the reading of other runs.
            [python, "-m", "workers.reaper", "--restart", "--",
             python, "-m", "celery", "-A", "workers.app", "worker", "-Q", QUEUE_WATCH,
             "-c", "2", "-E", "-n", "watch@%h", "--loglevel", "INFO"],
            [python, "-m", "celery", "-A", "workers.app", "beat", "--loglevel", "INFO",
             "-s", str(self.settings.state_dir / "beat-schedule")],
        ]  # fmt: skip
        if options.flower:
            commands.append(
                [python, "-m", "celery", "-A", "workers.app", "flower",
                 f"--conf={FLOWER_CONFIG}", f"--port={options.flower_port}",
                 "--address=127.0.0.1"]
            )  # fmt: skip
        return commands

    def run(self, stopping: threading.Event, say: Callable[[str], None]) -> int:
        """Runs every process until `stopping` is set or one of them ends, then stops
        them all in order; returns the exit code (1 when one failed by itself)."""
        procs: list[subprocess.Popen[bytes]] = []
        try:
            for command in self.commands():
                procs.append(subprocess.Popen(command, env=self.env, start_new_session=True))
            if self._web is not None:
                self._web.start()
            shown = [
                f"worker (concurrency {self.options.concurrency})",
                "retrieval worker",
                "watch worker",
                "beat",
            ]
            if self.options.flower:
                shown.append(f"flower on http://127.0.0.1:{self.options.flower_port}")
            if self.options.web:
                shown.append(f"web view on http://127.0.0.1:{self.options.web_port}")
            say("serving: " + ", ".join(shown) + " - Ctrl-C stops everything")
            while not stopping.wait(0.2) and all(p.poll() is None for p in procs):
                pass
        finally:
            self._stop(procs)
        failed = [p for p in procs if p.returncode not in (0, -signal.SIGTERM, None)]
        return 1 if failed and not stopping.is_set() else 0

    def _stop(self, procs: list[subprocess.Popen[bytes]]) -> None:
        if self._web is not None:
            self._web.stop()
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(timeout=STOP_WAIT_S)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        if self.embedded is not None:
            self.embedded.stop()
