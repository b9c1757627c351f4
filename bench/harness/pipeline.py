"""The whole service for integration tests: a real redis-server (AOF), real Celery
worker and beat processes (each under a reaper, as `runwarden serve` runs them),
shortened clocks, and the producers' API in the test process."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from producers.api import Runwarden
from schemas import (
    RunRecord,
    Settings,
    SshOptions,
    StopPhase,
    StopState,
    TargetConfig,
    UnknownTarget,
)
from schemas.auth import OPERATOR, WORKER, new_task_id, sign
from schemas.events import DEFAULT_QUEUE, QUEUE, QUEUE_RETRIEVE, QUEUE_WATCH
from schemas.secrets import REDIS_PASSWORD, producer_key_file, service_redis_password_file
from schemas.sentinel import SENTINEL_PASSWORD
from schemas.target_sig import TARGET_KEY, ensure_key_pair, next_version, sign_record
from store.acl import WORKER_USER, save_users, set_worker_user
from workers.executors import quote

from . import warm
from .paths import ROOT, TOY_TRAINER
from .processes import kill_job_groups, kill_processes_in
from .redis_server import RedisServer
from .sentinel import SentinelCluster
from .sshd import SshServer
from .users import JOB_USER, as_the_worker, ensure_user, job_python
from .warm import Warm

CLOCKS = {
    "RUNWARDEN_PROOF_TIMEOUT_S": "6",
    "RUNWARDEN_END_TIMEOUT_S": "4",
    "RUNWARDEN_FOLLOW_POLL_S": "0.5",
    "RUNWARDEN_RECONCILE_S": "1",
    "RUNWARDEN_DEADLINE_LEASE_S": "10",
    "RUNWARDEN_POLICY_S": "1",
    "RUNWARDEN_WATCHDOG_POLL_S": "0.5",
    "RUNWARDEN_RETRIEVE_BACKOFF_S": "1",
    "RUNWARDEN_RETRIEVE_BACKOFF_MAX_S": "4",
    "RUNWARDEN_DISK_PROBE_S": "2",
    # The disk policy is on for every run: off here, so that a nearly full disk on
    # the test machine stops no run; the disk tests turn it on.
    "RUNWARDEN_DISK_USED_FRACTION": "1",
    "RUNWARDEN_DISK_CHECKPOINT_FACTOR": "0",
}


def signed(
    settings: Settings, task: str, body: Any, producer: str = OPERATOR, task_id: str = ""
) -> dict[str, Any]:
    """The keyword arguments of the message of `task` with `body` and id `task_id`,
    signed by `producer` of `settings` (its key created in the secrets directory when
    missing). Send it with that id (`send_signed` does both)."""
    key, _ = settings.secrets.ensure(producer_key_file(producer))
    return {"body": body, "auth": sign(task, body, producer, key, at=time.time(), task_id=task_id)}


def send_signed(
    app: Any, settings: Settings, task: str, body: Any, producer: str = OPERATOR
) -> Any:
    """Sends `task` with `body` signed by `producer` (a fresh task id, the one signed);
    returns Celery's `AsyncResult`."""
    task_id = new_task_id()
    kwargs = signed(settings, task, body, producer, task_id)
    return app.send_task(task, kwargs=kwargs, task_id=task_id)


def put_signed_target(store: Any, settings: Settings, config: dict[str, Any]) -> None:
    """Stores target `config` at a new version signed with the operator's target key
    of `settings` (its pair made in the secrets directory when missing), as
    `runwarden targets add` does, without `add_target`'s checks of the config."""
    ensure_key_pair(settings.secrets)
    key = settings.secrets.read(TARGET_KEY)
    assert key is not None
    name = config["name"]
    try:
        stored = store.targets.get_signed(name).version
    except UnknownTarget:
        stored = None
    version = next_version(stored)
    store.targets.put(name, config, sign_record(name, config, version, key), version)


def read_small(path: Path, limit: int = 64) -> str:
    """At most `limit` bytes of the regular file `path`, as a job may have written it:
    a link is never followed and a FIFO never blocks (a hostile job puts either in
    place of `job.pid`, bench/harness/hostile.py).

    Raises:
        OSError: for a missing file, a link, or anything but a regular file."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(f"{path} is not a regular file")
        return os.read(fd, limit).decode("ascii", "replace").strip()
    finally:
        os.close(fd)


def ssh_target(server: SshServer, workdir: Path, name: str = "ssh") -> TargetConfig:
    """The SSH target of `server` (its key, strict known_hosts) running in `workdir`."""
    return TargetConfig(
        name=name,
        kind="ssh",
        workdir=str(workdir),
        ssh=SshOptions(
            destination=server.destination,
            identity=str(server.client_key),
            known_hosts=str(server.known_hosts),
        ),
    )


def toy(*args: str) -> str:
    """The job command running the toy trainer (its job side comes from launch)."""
    words = " ".join(quote(a) for a in args)
    return f"exec {quote(sys.executable)} -u {quote(str(TOY_TRAINER))} {words}"


@dataclass(frozen=True)
class RunAsPlace:
    """A local target whose jobs run as [`users.JOB_USER`] (`run_as`), and how its jobs
    run the toy trainer (a copy, by a Python that user can run)."""

    target: TargetConfig
    toy: Callable[..., str]
    base: Path
    """The shared directory: the workdir (`work`) and the toy trainer's copy are in it."""
    python: str
    """A Python the jobs' user can run."""


def runas_target(base: Path, name: str = "runas") -> RunAsPlace:
    """The run-as target `name` with its workdir in `base` (a `users.shared_dir`: the
    jobs' user must reach it), the job user created when missing."""
    ensure_user(JOB_USER)
    trainer = base / "toy_trainer.py"
    shutil.copy(TOY_TRAINER, trainer)
    python = job_python()

    def runas_toy(*args: str) -> str:
        words = " ".join(quote(a) for a in args)
        return f"exec {quote(python)} -u {quote(str(trainer))} {words}"

    (base / "work").mkdir()  # the worker's, as root makes it: it gives each run dir away
    target = TargetConfig(name=name, kind="local", workdir=str(base / "work"), run_as=JOB_USER)
    return RunAsPlace(target, runas_toy, base, python)


@dataclass
class Pipeline:
    tmp: Path
    redis: RedisServer
    env: dict[str, str]
    api: Runwarden
    workdir: Path
    workers: dict[str, subprocess.Popen[bytes] | Warm] = field(default_factory=dict)
    beat: subprocess.Popen[bytes] | Warm | None = None
    sentinel: SentinelCluster | None = None
    """The Sentinel set the service runs on (`running_pipeline(sentinel=True)`); then
    `redis` is its first primary."""
    exec_start: bool = False
    """Start the workers and beat with `exec` (as `runwarden serve` does), not forked
    warm: for a test that reads their command lines or environments in /proc."""
    _groups: dict[str, tuple[int, int]] = field(default_factory=dict, repr=False)
    """Run directory name -> (its `job.pid`'s mtime in ns, the group it names)."""

    def start_worker(
        self, name: str = "w1", concurrency: int = 2, queues: str | None = None
    ) -> subprocess.Popen[bytes] | Warm:
        """Starts worker `name`; with `queues` (`-Q`, comma-separated) it consumes only
        those, else every queue of the app."""
        argv = ["worker", "-n", f"{name}@%h", "-c", str(concurrency), "--loglevel", "INFO",
                "--without-gossip", "--without-mingle"]  # fmt: skip
        argv += ["-Q", queues] if queues else []
        # As `runwarden serve` starts its workers: under a restarting reaper.
        proc = self._start(argv, f"worker-{name}.log", reaper=True)
        self.workers[name] = proc
        return proc

    def start_beat(self) -> None:
        argv = ["beat", "-s", str(self.tmp / "beat-schedule"), "--loglevel", "INFO"]
        self.beat = self._start(argv, "beat.log", reaper=False)

    def _start(self, argv: list[str], log: str, reaper: bool) -> subprocess.Popen[bytes] | Warm:
        """`python -m workers.start ARGV` in a session of its own, its output appended
        to the log `log`: forked warm (bench/harness/warm.py) unless `exec_start`."""
        env = {**self.env, "RUNWARDEN_REDIS_USER": WORKER_USER}
        if not self.exec_start:
            return warm.start(argv, env, ROOT, self.tmp / log, reaper)
        under = [sys.executable, "-m", "workers.reaper", "--restart", "--"] if reaper else []
        with (self.tmp / log).open("ab") as out:
            return subprocess.Popen(
                [*under, sys.executable, "-m", "workers.start", *argv],
                cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
                start_new_session=True,
            )  # fmt: skip

    def kill_beat(self) -> None:
        """SIGKILLs beat (its whole session)."""
        assert self.beat is not None, "beat is not running"
        os.killpg(self.beat.pid, signal.SIGKILL)
        self.beat.wait()
        self.beat = None

    def send(self, task: str, body: Any, producer: str = OPERATOR, **options: Any) -> Any:
        """Publishes `task` with `body` signed by `producer` (its key created in the
        secrets directory when missing), as a producer service would, with Celery's
        `options` (`eta`...); returns the Celery result."""
        task_id = new_task_id()
        kwargs = signed(self.api.settings, task, body, producer, task_id)
        return self.api.app.send_task(task, kwargs=kwargs, task_id=task_id, **options)

    def kill_worker(self, name: str = "w1") -> None:
        """SIGKILLs the worker and its pool processes (its whole session)."""
        proc = self.workers.pop(name)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()

    def wait_ready(self, timeout_s: float = 30.0) -> None:
        """Waits until a worker answers a ping."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                replies = self.api.app.control.ping(timeout=0.5)
            except Exception:  # noqa: BLE001 - a Redis restarted under a stale client
                self.api = Runwarden(self.api.settings)
                time.sleep(0.2)
                continue
            if replies:
                return
        raise AssertionError("no worker answered: " + self.logs())

    def wait_state(self, run_id: str, timeout_s: float = 60.0) -> RunRecord:
        """Waits until the run ends; returns its record."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            run = self.api.get_run(run_id)
            if run.state.is_terminal:
                return run
            time.sleep(0.1)
        raise AssertionError(f"run {run_id} did not end: {self.api.get_run(run_id)}\n{self.logs()}")

    def wait_step(self, run_id: str, step: int, timeout_s: float = 30.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            progress = self.api.store.follow.last_metrics(run_id)
            if progress is not None and (progress.step or 0) >= step:
                return
            time.sleep(0.1)
        raise AssertionError(f"run {run_id} never reached step {step}\n{self.logs()}")

    def wait_worker(self, name: str, timeout_s: float = 30.0) -> float:
        """Waits until worker `name` answers a ping; returns the wall-clock time
        (`time.time()`) it answered at."""
        node = f"{name}@{socket.gethostname()}"
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.api.app.control.ping(destination=[node], timeout=0.5):
                return time.time()
        raise AssertionError(f"worker {name} did not answer: " + self.logs())

    def wait_phase(self, run_id: str, phase: StopPhase, timeout_s: float = 30.0) -> StopState:
        """Waits until the run's open stop is in `phase`; returns it."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            stop = self.api.get_stop(run_id)
            if stop is not None and stop.phase is phase:
                return stop
            time.sleep(0.05)
        raise AssertionError(
            f"the stop of run {run_id} never reached {phase}: {self.api.get_stop(run_id)}\n"
            + self.logs()
        )

    def wait_terminal(self, run_id: str, timeout_s: float = 60.0) -> tuple[RunRecord, float]:
        """Waits until the run ends, polling the store every 50 ms; returns its record
        and the wall-clock time (`time.time()`) the end was first seen at."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            run = self.api.get_run(run_id)
            if run.state.is_terminal:
                return run, time.time()
            time.sleep(0.05)
        raise AssertionError(f"run {run_id} did not end: {self.api.get_run(run_id)}\n{self.logs()}")

    def worker_log(self, name: str) -> str:
        """The whole log of worker `name` (every worker started under that name)."""
        path = self.tmp / f"worker-{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def job_groups(self) -> list[int]:
        """The process group of every job started under the workdir (its `job.pid`,
        read again only when it changed: the reaper asks four times a second, and a
        campaign has a hundred run directories)."""
        groups = []
        for path in self.workdir.glob("*/job.pid"):
            with contextlib.suppress(OSError, ValueError):
                seen = path.lstat().st_mtime_ns
                known = self._groups.get(path.parent.name)
                if known is None or known[0] != seen:
                    known = (seen, int(read_small(path)))
                    self._groups[path.parent.name] = known
                if known[1] > 1:
                    groups.append(known[1])
        return groups

    def reap_jobs(self) -> None:
        """Reaps the exited job processes that were re-parented to this process.

        The test process is a child subreaper (tests/conftest.py). A job's processes
        are reaped by its wrapper and by the worker's reaper (`workers.reaper`);
        after `kill_worker`, which kills that reaper too, the job's orphans come
        here. Left as zombies they would count as live members of the job's group,
        and a fresh worker could never see the job gone (cancel: "survived
        SIGKILL")."""
        for pgid in self.job_groups():
            while True:
                try:
                    pid, _ = os.waitpid(-pgid, os.WNOHANG)
                except ChildProcessError:
                    break
                if pid == 0:
                    break

    def kill_jobs(self) -> None:
        """SIGKILLs what is left of every job (best effort: for the teardown of a test
        that failed half-way), and reaps them: each recorded run's group while it is
        still the job's (`kill_job_groups`: never a group by a `job.pid` alone, which
        may be another test's by now), and every process working or named under the
        workdir (`kill_processes_in`)."""
        with contextlib.suppress(Exception):  # the store may be gone already
            kill_job_groups(self.api.list_runs())
        kill_processes_in(self.workdir)
        time.sleep(0.1)
        self.reap_jobs()

    def logs(self) -> str:
        text = []
        for path in sorted(self.tmp.glob("*.log")):
            text.append(f"--- {path.name}\n" + path.read_text(errors="replace")[-3000:])
        return "\n".join(text)

    def stop(self) -> None:
        for proc in [*self.workers.values(), *([self.beat] if self.beat else [])]:
            try:
                os.killpg(proc.pid, signal.SIGTERM)
                proc.wait(timeout=15)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        self.workers.clear()
        self.beat = None


def state_dir_of(tmp: Path) -> Path:
    """The state directory of the pipeline in `tmp`: beside it, never inside the upload
    root `tmp` (`Runwarden.add_target` refuses a root holding it)."""
    return tmp.parent / f"{tmp.name}.state"


@contextmanager
def running_pipeline(
    tmp: Path,
    workers: int = 1,
    beat: bool = True,
    extra_env: Mapping[str, str] | None = None,
    concurrency: int = 2,
    *,
    watch_worker: bool = False,
    exec_start: bool = False,
    sentinel: bool = False,
) -> Iterator[Pipeline]:
    """The whole service in `tmp`: `workers` workers of `concurrency` processes each,
    beat unless told not to, the clocks of [`CLOCKS`] with `extra_env` on top. The
    workers consume every queue, unless `watch_worker`: then the queues are laid out
    as `runwarden serve` lays them out: the follow ticks have a worker of their own
    (`watch`, 2 processes), the retrievals too (`retrieve`, 1 process), and the
    `workers` consume the others. A test that times stops needs this layout: a storm
    of ended runs' retrievals on the stops' workers delays every proof deadline
    behind them (the hostile matrix on a loaded machine: 13 s). With `exec_start`, the
    workers and beat are started as `runwarden serve` starts them (`Pipeline.exec_start`).
    With `sentinel`, Redis is a primary, a replica and three sentinels
    (`bench/harness/sentinel.py`), reached by its `sentinel://` URL, its passwords in
    the secrets directory (`redis-password`, `redis-password.worker`,
    `redis-sentinel-password`)."""
    cluster: SentinelCluster | None = None
    if sentinel:
        secrets = Settings(state_dir=state_dir_of(tmp), redis_url=None).secrets
        cluster = SentinelCluster(
            tmp / "redis",
            password=secrets.ensure(REDIS_PASSWORD)[0],
            sentinel_password=secrets.ensure(SENTINEL_PASSWORD)[0],
            worker_password=secrets.ensure(service_redis_password_file(WORKER_USER))[0],
        )
        cluster.start()
        redis: RedisServer = cluster.servers[0]
    else:
        # Users in an ACL file: the workers' user outlives a restart (chaos, faults).
        redis = RedisServer(tmp / "redis", acl_file=True)
        redis.start()
    env = {k: v for k, v in os.environ.items() if not k.startswith("RUNWARDEN_")}
    env.update(CLOCKS)
    env.update(extra_env or {})
    env["RUNWARDEN_REDIS_URL"] = redis.url if cluster is None else cluster.url
    env["RUNWARDEN_STATE_DIR"] = str(state_dir_of(tmp))
    env["PYTHONPATH"] = str(ROOT)
    fields: dict[str, Any] = {
        k.removeprefix("RUNWARDEN_").lower(): v
        for k, v in env.items()
        if k.startswith("RUNWARDEN_")
    }
    settings = Settings(**fields)
    for producer in (OPERATOR, WORKER):  # as `runwarden serve` creates them
        settings.secrets.ensure(producer_key_file(producer))
    ensure_key_pair(settings.secrets)
    # The workers and beat connect as their own user, as serve starts them
    # (store/acl.py, worker_rules); the test's own API and CLI as the operator.
    if cluster is None:  # a Sentinel set's servers start with their users
        password, _ = settings.secrets.ensure(service_redis_password_file(WORKER_USER))
        admin = redis.client()
        set_worker_user(admin, password)
        assert save_users(admin), "the test server has an ACL file"
        admin.close()
    api = Runwarden(settings)
    workdir = tmp / "work"
    workdir.mkdir()
    # As an operator would: uploads from the test's own directory only (the state
    # directory is beside it: a root holding it is refused).
    api.add_target(
        TargetConfig(
            name="local",
            kind="local",
            workdir=str(workdir),
            upload_roots=(str(tmp),),
            **as_the_worker(),
        )
    )
    pipeline = Pipeline(tmp, redis, env, api, workdir, sentinel=cluster, exec_start=exec_start)
    done = threading.Event()

    def reap() -> None:
        # Orphans come here only once their worker's reaper was killed (kill_worker).
        while not done.wait(0.25):
            pipeline.reap_jobs()

    reaper = threading.Thread(target=reap, name="job-reaper", daemon=True)
    reaper.start()
    try:
        others = f"{QUEUE},{DEFAULT_QUEUE}" if watch_worker else None
        for i in range(workers):
            pipeline.start_worker(f"w{i + 1}", concurrency, queues=others)
        if watch_worker:
            pipeline.start_worker("watch", 2, queues=QUEUE_WATCH)
            pipeline.start_worker("retrieve", 1, queues=QUEUE_RETRIEVE)
        if beat:
            pipeline.start_beat()
        pipeline.wait_ready()
        yield pipeline
    finally:
        pipeline.stop()
        if cluster is not None:
            cluster.stop()
        else:
            redis.stop()
        done.set()
        reaper.join()
