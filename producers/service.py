"""The service in the foreground, as `runwarden serve` runs it: the embedded Redis
(when no URL is set), a worker for the stops and launches, one for retrievals, one
for the follow ticks, beat, and optionally Flower, the web view and the metrics
endpoint; supervised until asked to stop, then stopped in order, Redis last (workers
finish what they run: a cancel runs to its end).

Supervision (`producers.supervision`): every child, process or thread, that ends by
itself is started again after a backoff, with a line on stderr naming it and how it
ended; a child that keeps ending stops the service (exit 1, said why). Serve writes
what it supervises, with the restarts, to the store every
`schemas.health.SERVE_WRITE_S` (`runwarden status` shows it).

No child outlives serve: each process is started from serve's main thread with its
parent-death signal armed (`workers.deathsig`: SIGTERM when serve ends, `kill -9`
included), the workers' own processes with theirs (`workers.reaper`, Celery's pool),
the web view and the metrics endpoint are threads of serve. One serve per state
directory: it holds the lock of `<state dir>/serve.pid` while it runs (the kernel
drops it when serve dies, so a dead serve's file is stale, never in the way).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import secrets
import socket
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from schemas import RunError, RunwardenError, Settings
from schemas.auth import OPERATOR, WORKER
from schemas.errors import require_extra
from schemas.events import DEFAULT_QUEUE, QUEUE, QUEUE_RETRIEVE, QUEUE_WATCH
from schemas.health import SERVE_TTL_S, SERVE_WRITE_S, ServeChild, ServeState
from schemas.secrets import FLOWER_AUTH, producer_key_file, service_redis_password_file
from schemas.target_sig import ensure_key_pair
from store import RunStore
from store.acl import WEB_USER, WORKER_USER

from .api import Runwarden
from .embedded import EmbeddedRedis, NotServing
from .supervision import Child, ProcessChild, RedisChild, Supervisor, ThreadChild

__all__ = [
    "FLOWER_CONFIG",
    "ServeError",
    "Service",
    "ServiceOptions",
]

FLOWER_CONFIG: Final = Path(__file__).resolve().parent / "flower_config.py"
ORPHAN_WAIT_S: Final = 15.0
"""How long the Redis of a serve that died is given to end (its parent-death signal)
before a new serve refuses to start, in seconds."""
PID_FILE: Final = "serve.pid"


class ServeError(RunError):
    """A part of the service cannot start (the metrics port is taken)."""


@dataclass(frozen=True)
class ServiceOptions:
    """What to run besides the workers and beat."""

    concurrency: int = 2
    flower: bool = False
    flower_port: int = 5555
    web: bool = False
    web_port: int = 8350
    metrics_port: int | None = None
    """The metrics endpoint's port on 127.0.0.1; None: no endpoint."""


class _WebThread:
    """The web view served by uvicorn on a thread (uvicorn installs signal handlers on
    the main thread only, so the caller's stay in charge)."""

    def __init__(self, api: Runwarden, options: ServiceOptions, user: str, password: str) -> None:
        from .web import make_server  # noqa: PLC0415 - the `web` extra, checked by prepare

        flower_url = f"http://127.0.0.1:{options.flower_port}" if options.flower else None
        self._server = make_server(
            api, "127.0.0.1", options.web_port, user=user, password=password, flower_url=flower_url
        )
        self.thread = threading.Thread(target=self._server.run, name="web", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self._server.should_exit = True
        self.thread.join(timeout=10)


_WORKERS: Final = {"runwarden": "worker", "retrieve": "retrieval worker", "watch": "watch worker"}


def _named(command: list[str]) -> str:
    """A process's name for people: a worker by its node (`-n`), else beat or Flower."""
    if "-n" in command[:-1]:
        node = command[command.index("-n") + 1].partition("@")[0]
        return _WORKERS.get(node, f"{node} worker")
    for name in ("beat", "flower"):
        if name in command:
            return name
    return Path(command[0]).name


def _hold(state_dir: Path) -> int:
    """Takes the lock of `state_dir`'s pid file and writes this pid into it; returns
    the descriptor that holds it.

    Raises:
        NotServing: another serve holds it.
    """
    fd = os.open(state_dir / PID_FILE, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        held = os.read(fd, 32).decode(errors="replace").strip()
        os.close(fd)
        raise NotServing(
            f"another `runwarden serve` (pid {held or 'unknown'}) already runs on {state_dir}"
        ) from None
    os.ftruncate(fd, 0)
    os.write(fd, f"{os.getpid()}\n".encode())
    return fd


class Service:
    """One run of the service with `settings` and `options`."""

    def __init__(self, settings: Settings, options: ServiceOptions) -> None:
        self.settings = settings
        self.options = options
        self.embedded = EmbeddedRedis(settings) if settings.redis_url is None else None
        self.env = dict(os.environ)
        self.name = f"serve@{socket.gethostname()}"
        self._supervisor = Supervisor()
        self._lock: int | None = None
        self._started: float | None = None
        self._store: RunStore | None = None

    def credentials(self) -> tuple[str, str, Path]:
        """The `user:password` of Flower and the web view (the secrets directory's
        `flower-basic-auth`, generated once, mode 0600) and where it is."""
        made = f"runwarden:{secrets.token_urlsafe(24)}"
        value, _ = self.settings.secrets.ensure(FLOWER_AUTH, made)
        user, _, password = value.get_secret_value().partition(":")
        return user, password, self.settings.secrets.path / FLOWER_AUTH

    def prepare(self) -> list[str]:
        """Takes the state directory (one serve each), creates what is missing in the
        secrets directory, starts the embedded Redis and the metrics endpoint, and
        returns what to tell the person. Call it from the main thread, as `run`.

        Raises:
            NotServing: another serve runs on the state directory, or the embedded
                Redis does not start (a server left by a serve that died is given
                `ORPHAN_WAIT_S` to end first).
            SecretsError: the secrets directory cannot be written.
            ServeError: the metrics port cannot be bound.
            MissingExtra: a package of what was asked for is not installed (the
                workers' `worker` extra; `web` for the web view and the metrics
                endpoint; `flower`), checked before anything starts.
        """
        self._check_extras()
        self.settings.state_dir.mkdir(parents=True, exist_ok=True)
        self._lock = _hold(self.settings.state_dir)
        try:
            return self._prepare()
        except BaseException:
            self._stop()  # what did start, and the state directory's lock
            raise

    def _check_extras(self) -> None:
        require_extra("worker", "runwarden serve (its workers)", "paramiko")
        if self.options.web:
            require_extra("web", "the web view (--web)", "fastapi", "jinja2", "uvicorn")
        if self.options.metrics_port is not None:
            require_extra("web", "the metrics endpoint (--metrics-port)", "prometheus_client")
        if self.options.flower:
            require_extra("flower", "Flower (--flower)", "flower")

    def _prepare(self) -> list[str]:
        said = []
        for producer in (OPERATOR, WORKER):
            self.settings.secrets.ensure(producer_key_file(producer))
        ensure_key_pair(self.settings.secrets)  # the targets' signatures
        if self.embedded is not None:
            # The workers' and beat's own Redis user, and the web view's (store/acl.py,
            # worker_rules, web_rules).
            for user in (WORKER_USER, WEB_USER):
                self.settings.secrets.ensure(service_redis_password_file(user))
            self.embedded.start(orphan_wait_s=ORPHAN_WAIT_S)
            self._supervisor.children.append(
                RedisChild("redis", up_since=time.monotonic(), embedded=self.embedded)
            )
            said.append(f"redis: embedded, {self.settings.embedded_socket}")
        try:
            # Target records of the form before versions, signed with the operator's
            # HMAC key: given their Ed25519 signature, so an upgrade keeps them.
            resigned = Runwarden(self.settings).resign_targets()
        except RunwardenError as error:
            said.append(f"targets: not checked for re-signing ({error})")
        else:
            if resigned:
                said.append(f"targets signed again with the target key: {', '.join(resigned)}")
        port = self.options.metrics_port
        if port is not None:
            metrics = ThreadChild(
                "metrics", up_since=time.monotonic(), make=lambda: self._metrics(port)
            )
            try:
                metrics.launch()
            except OSError as error:
                raise ServeError(f"cannot serve metrics on 127.0.0.1:{port}: {error}") from error
            self._supervisor.children.append(metrics)
            said.append(f"metrics: http://127.0.0.1:{port}/metrics")
        if self.options.flower or self.options.web or port is not None:
            user, password, where = self.credentials()
            said.append(f"credentials of Flower, the web view and the metrics: {where}")
            if self.options.flower:
                self.env["RUNWARDEN_FLOWER_AUTH_FILE"] = str(where)
            if self.options.web:
                api = Runwarden(self.web_settings())
                self._supervisor.children.append(
                    ThreadChild("web view", make=lambda: self._web(api, user, password))
                )
        return said

    def web_settings(self) -> Settings:
        """The settings the web view connects to Redis with: with the embedded server,
        as its own user `web` (store/acl.py, `web_rules`: it reads the store and sends
        stops and cancels, nothing else); else as serve itself does (the URL's user, or
        `RUNWARDEN_REDIS_USER`)."""
        if self.embedded is None:
            return self.settings
        return self.settings.model_copy(update={"redis_user": WEB_USER})

    def _metrics(self, port: int) -> tuple[threading.Thread, Callable[[], None]]:
        from .metrics import serve_metrics  # noqa: PLC0415 - the `web` extra, checked by prepare

        server = serve_metrics(self.settings, port=port)
        return server.thread, server.close

    def _web(
        self, api: Runwarden, user: str, password: str
    ) -> tuple[threading.Thread, Callable[[], None]]:
        web = _WebThread(api, self.options, user, password)
        web.start()
        return web.thread, web.stop

    def commands(self) -> list[list[str]]:
        """The command line of each process to run (no secret on any of them): the
        main, retrieval and watch workers, beat, then Flower when asked. A worker runs
        under the reaper without `--restart`: an ended worker ends its reaper, and
        serve starts it again (and counts it)."""
        python, options = sys.executable, self.options
        commands = [
            [python, "-m", "workers.reaper", "--",
             python, "-m", "workers.start", "worker",
             "-Q", f"{QUEUE},{DEFAULT_QUEUE}", "-c", str(options.concurrency),
             "-n", "runwarden@%h", "--loglevel", "INFO"],
            # Retrievals download for as long as they take, on a worker of their own.
            [python, "-m", "workers.reaper", "--",
             python, "-m", "workers.start", "worker", "-Q", QUEUE_RETRIEVE,
             "-c", "1", "-n", "retrieve@%h", "--loglevel", "INFO"],
            # The follow ticks, on a worker of their own: a storm of cancels (each holds
            # a process while its job dies) never holds back the reading of other runs.
            [python, "-m", "workers.reaper", "--",
             python, "-m", "workers.start", "worker", "-Q", QUEUE_WATCH,
             "-c", "2", "-n", "watch@%h", "--loglevel", "INFO"],
            [python, "-m", "workers.start", "beat", "--loglevel", "INFO",
             "-s", str(self.settings.state_dir / "beat-schedule")],
        ]  # fmt: skip
        if options.flower:
            commands.append(
                [python, "-m", "celery", "-A", "workers.app", "flower",
                 f"--conf={FLOWER_CONFIG}", f"--port={options.flower_port}",
                 "--address=127.0.0.1"]
            )  # fmt: skip
        return commands

    def _processes(self) -> list[Child]:
        """The processes of `commands`, each named by what it runs. With the embedded
        server, the workers and beat connect as its `worker` user (no dangerous
        command); Flower as the operator (the web view, a thread, as `web`:
        `web_settings`)."""
        as_worker = self.env
        if self.embedded is not None:
            as_worker = {**self.env, "RUNWARDEN_REDIS_USER": WORKER_USER}
        return [
            ProcessChild(_named(c), command=c, env=as_worker if "workers.start" in c else self.env)
            for c in self.commands()
        ]

    def run(
        self,
        stopping: threading.Event,
        say: Callable[[str], None],
        warn: Callable[[str], None] | None = None,
    ) -> int:
        """Starts every process and thread and supervises them (see the module) until
        `stopping` is set (returns 0) or a child keeps ending (returns 1); then stops
        them all in order, Redis last. Each end and restart is a line to `warn`
        (default: stderr). Call it from the main thread, as `prepare`: a process's
        parent-death signal follows the thread that started it."""
        warn = warn or (lambda line: print(line, file=sys.stderr, flush=True))
        code = 0
        try:
            if stopping.is_set():  # asked while preparing: start nothing more
                return code
            web = [c for c in self._supervisor.children if c.name == "web view"]
            fresh = self._processes() + web
            for child in fresh:
                child.launch()
                child.up_since = time.monotonic()
            self._supervisor.children = [
                c for c in self._supervisor.children if c not in web
            ] + fresh
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
            written = 0.0
            while not stopping.wait(0.2):
                changed, reason = self._supervisor.look(warn)
                if reason is not None:
                    warn(f"serve: {reason}; stopping everything")
                    code = 1
                    break
                if changed or time.monotonic() - written >= SERVE_WRITE_S:
                    self._publish()
                    written = time.monotonic()
        finally:
            self._stop()
        return code

    def _state(self) -> ServeState:
        now = time.monotonic()
        return ServeState(
            name=self.name,
            hostname=socket.gethostname(),
            pid=os.getpid(),
            started=self._started,
            children=tuple(
                ServeChild(
                    name=c.name,
                    pid=c.pid if c.due is None else None,
                    state="up" if c.due is None else "restarting",
                    restarts=c.restarts,
                    last_end=c.last_end,
                    last_end_ago_s=None if c.last_end_at is None else max(0.0, now - c.last_end_at),
                )
                for c in self._supervisor.children
            ),
        )

    def _publish(self) -> None:
        """Writes what serve supervises to the store; a Redis that is down (being
        restarted) is tried again at the next write."""
        try:
            if self._store is None:
                self._store = RunStore.from_url(self.settings.store_url(), timeout_s=1.0)
            written = self._store.health.write_serve(self._state(), SERVE_TTL_S)
        except (RunwardenError, ValueError):
            return
        self._started = written.started

    def _stop(self) -> None:
        """Stops every child (`Supervisor.stop`), then Redis; releases the state
        directory."""
        self._supervisor.stop()
        if self._store is not None:
            with contextlib.suppress(RunwardenError):
                self._store.health.end_serve(self.name)
            self._store.client.close()
        if self.embedded is not None:
            self.embedded.stop()
        if self._lock is not None:
            os.close(self._lock)
            self._lock = None
