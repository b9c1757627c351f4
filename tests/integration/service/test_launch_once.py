"""A launch is exactly once, with real processes: a real redis-server, real Celery
worker and beat processes (bench/harness/pipeline.py), the toy trainer as the job, and a real
sshd on loopback for the SSH faults (tests/integration/test_launch_once_ssh.py).

The worker process running a launch is killed with SIGKILL (a) during the upload,
(b) during the spawn, (c) after the spawn and before the record: the broker delivers
the message again (the pool process was lost: `task_reject_on_worker_lost`) and the
launch goes on from where it stopped. (d) The whole worker is killed (no redelivery
before the visibility timeout): `reconcile` settles the run. (e) An SSH spawn times
out, or (f) its connection breaks, after the remote job started: the run is followed
(tests/integration/test_launch_once_ssh.py).

"One job" is counted on the machine: the processes whose environment holds
`RUNWARDEN_RUN_ID=<run id>` (every process of a job carries it) and that run the toy
trainer; "followed" means the run is recorded running with that job's process
group, is in its target's followed set, and its metrics arrive.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from bench.harness.pipeline import Pipeline, running_pipeline, send_signed, toy
from bench.harness.processes import assert_one_followed_job, children, read_proc, trainers
from bench.harness.redis_server import running_redis
from schemas import Conflict, JobId, RunRecord, RunState
from schemas.auth import OPERATOR, WORKER
from schemas.chain import continuation_key
from schemas.events import TASK_LAUNCH, LaunchSpec
from schemas.idempotency import owned_launch_key
from store import RunStore
from workers.executors import quote
from workers.find_job import DIED_MESSAGE

from ...conftest import wait_for
from .test_cli import refused, run_cli

pytestmark = pytest.mark.slow

TRAIN = ("--steps", "100000", "--step-time", "0.05")


# --- the pipeline, one pool process --------------------------------------------------------


@pytest.fixture
def setsid_shim(tmp_path: Path) -> Path:
    """A directory holding a `setsid` that marks `.spawning` in the launcher's working
    directory (the run directory), waits 1.5 s, then runs the real one: a spawn that
    lasts long enough to be interrupted. Put first on the worker's PATH."""
    real = shutil.which("setsid")
    assert real is not None, "setsid is not installed"
    shim = tmp_path / "shim"
    shim.mkdir()
    script = shim / "setsid"
    script.write_text(f'#!/bin/sh\n: > "$PWD/.spawning"\nsleep 1.5\nexec {quote(real)} "$@"\n')
    script.chmod(0o755)
    return shim


@contextlib.contextmanager
def one_pool_process(tmp: Path, **env: str) -> Iterator[Pipeline]:
    """The pipeline with one worker of one pool process (the one a launch runs in)."""
    with running_pipeline(tmp, extra_env=env) as pipeline:
        try:
            pipeline.kill_worker("w1")
            pipeline.start_worker("w1", concurrency=1)
            pipeline.wait_worker("w1")
            yield pipeline
        finally:
            pipeline.kill_jobs()


def pool_process(pipeline: Pipeline, name: str = "w1") -> int:
    """The pool process of worker `name` (started with one)."""
    (main,) = children(pipeline.workers[name].pid)
    pool = wait_for(lambda: children(main), timeout_s=30)
    assert isinstance(pool, list)
    # A pool process is forked from the worker's main process (no exec): its command
    # line is the main process's, a job's is not.
    forked = read_proc(f"/proc/{main}/cmdline")
    (found,) = [p for p in pool if read_proc(f"/proc/{p}/cmdline") == forked]
    return found


def launch_in_background(pipeline: Pipeline, spec: LaunchSpec) -> dict[str, Any]:
    """Starts `api.launch(spec)` in a thread (as a producer waits for it); the result
    (`run` or `error`) lands in the returned dict."""
    answer: dict[str, Any] = {}

    def call() -> None:
        try:
            answer["run"] = pipeline.api.launch(spec, wait_s=180)
        except Exception as error:  # noqa: BLE001 - reported by the test
            answer["error"] = error

    thread = threading.Thread(target=call, daemon=True)
    thread.start()
    answer["thread"] = thread
    return answer


def run_dir_of(pipeline: Pipeline) -> Path:
    """The one run directory under the workdir, once claimed."""
    found = wait_for(lambda: [p for p in pipeline.workdir.iterdir() if p.is_dir()], 30, 0.002)
    assert isinstance(found, list)
    (run_dir,) = found
    return run_dir


@contextlib.contextmanager
def stopped(pid: int) -> Iterator[None]:
    """SIGSTOP `pid` for the block, SIGCONT after."""
    os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(pid, signal.SIGCONT)


@pytest.mark.parametrize("moment", ["upload", "spawn", "record"])
def test_a_launch_delivered_again_after_its_worker_was_killed_runs_one_followed_job(
    tmp_path: Path, setsid_shim: Path, moment: str
) -> None:
    """kill -9 of the pool process running the launch (a) during the upload, (b)
    during the spawn (the launcher goes on and starts the job after the kill), (c)
    after the spawn, before the record (Redis held still meanwhile). The message is
    delivered again; the run ends up running, its job the only one, followed."""
    env = {} if moment == "upload" else {"PATH": f"{setsid_shim}:{os.environ['PATH']}"}
    with one_pool_process(tmp_path, **env) as pipeline:
        project = tmp_path / "project"
        (project / "data").mkdir(parents=True)
        for i in range(3000):
            (project / "data" / f"part-{i:04d}.bin").write_bytes(os.urandom(8192))
        spec = LaunchSpec(
            target="local", command=toy(*TRAIN), name="once", upload=project, key="kill-" + moment
        )
        worker = pool_process(pipeline)
        answer = launch_in_background(pipeline, spec)
        run_dir = run_dir_of(pipeline)
        if moment == "upload":
            wait_for((run_dir / "data").is_dir, timeout_s=30, interval_s=0.001)
            assert not (run_dir / ".runwarden").exists()  # mid-upload
            os.kill(worker, signal.SIGKILL)
        elif moment == "spawn":
            wait_for((run_dir / ".spawning").exists, timeout_s=30, interval_s=0.002)
            assert not (run_dir / "job.pid").exists()
            os.kill(worker, signal.SIGKILL)
        else:
            wait_for((run_dir / ".spawning").exists, timeout_s=30, interval_s=0.002)
            redis_pid = pipeline.redis.pid
            assert redis_pid is not None
            with stopped(redis_pid):
                wait_for((run_dir / "job.pid").exists, timeout_s=10, interval_s=0.01)
                time.sleep(0.5)  # the spawn answered; the record waits for Redis
                os.kill(worker, signal.SIGKILL)
        killed_at = time.monotonic()
        run_id = run_dir.name
        assert pipeline.api.get_run(run_id).state is RunState.PREPARING

        answer["thread"].join(120)
        assert "error" not in answer, answer.get("error")
        assert answer["run"].id == run_id
        # The redelivered launch waited for the dead worker's lock to lapse.
        assert time.monotonic() - killed_at < 60
        run = assert_one_followed_job(pipeline.api.store, run_id)
        pipeline.wait_step(run_id, 3)
        assert_one_followed_job(pipeline.api.store, run_id)
        assert len(list((run_dir / "data").iterdir())) == 3000  # uploaded in full
        assert [p.name for p in pipeline.workdir.iterdir() if p.is_dir()] == [run_id]
        log = pipeline.worker_log("w1")
        assert "WorkerLostError" in log or "exited prematurely" in log
        came_again = f"run {run_id}: its launch came again"
        if moment == "upload":
            assert f"{came_again} before its job started: going on" in log
        else:
            assert f"{came_again}; its job (pid {run.job.pid}) is running" in log  # type: ignore[union-attr]
        pipeline.api.cancel(run_id)
        assert pipeline.wait_state(run_id).state is RunState.CANCELLED
        assert trainers(run.id) == {}


@pytest.mark.parametrize("moment", ["upload", "record"])
def test_reconcile_settles_a_launch_whose_whole_worker_was_killed(
    tmp_path: Path, setsid_shim: Path, moment: str
) -> None:
    """The whole worker (every process) is killed: no redelivery before the visibility
    timeout. A fresh worker's reconcile settles the run once it is older than the
    launch's limit plus the grace: killed after the spawn -> running with the job that
    started, followed; killed during the upload -> failed, saying why."""
    env = {"RUNWARDEN_LAUNCH_MAX_RUNTIME_S": "20", "RUNWARDEN_LAUNCH_GRACE_S": "2"}
    if moment == "record":
        env["PATH"] = f"{setsid_shim}:{os.environ['PATH']}"
    with one_pool_process(tmp_path, **env) as pipeline:
        project = tmp_path / "project"
        (project / "data").mkdir(parents=True)
        for i in range(3000):
            (project / "data" / f"part-{i:04d}.bin").write_bytes(b"x" * 8192)
        spec = LaunchSpec(target="local", command=toy(*TRAIN), upload=project)
        pipeline.send("runwarden.launch", spec.model_dump(mode="json"))
        run_dir = run_dir_of(pipeline)
        if moment == "upload":
            wait_for((run_dir / "data").is_dir, timeout_s=30, interval_s=0.001)
            pipeline.kill_worker("w1")
        else:
            wait_for((run_dir / ".spawning").exists, timeout_s=30, interval_s=0.002)
            redis_pid = pipeline.redis.pid
            assert redis_pid is not None
            with stopped(redis_pid):
                wait_for((run_dir / "job.pid").exists, timeout_s=10, interval_s=0.01)
                time.sleep(0.5)
                pipeline.kill_worker("w1")
        run_id = run_dir.name
        store = pipeline.api.store
        created = store.runs.get(run_id).created
        assert store.runs.get(run_id).state is RunState.PREPARING
        if moment == "record":
            assert len(trainers(run_id)) == 1  # a job nobody follows, for now

        pipeline.start_worker("w2")
        pipeline.wait_worker("w2")
        deadline = time.monotonic() + 60
        while store.runs.get(run_id).state is RunState.PREPARING:
            assert time.monotonic() < deadline, pipeline.logs()
            time.sleep(0.1)
        settled_at = datetime.now(UTC)
        assert (settled_at - created).total_seconds() >= 22 - 0.5  # never before its time
        if moment == "record":
            assert_one_followed_job(store, run_id)
            pipeline.wait_step(run_id, 3)
            pipeline.api.cancel(run_id)
            assert pipeline.wait_state(run_id).state is RunState.CANCELLED
        else:
            run = store.runs.get(run_id)
            assert run.state is RunState.FAILED
            assert run.message == DIED_MESSAGE
            assert run.job is None
            assert trainers(run_id) == {}
            assert not (run_dir / "job.pid").exists()


# --- the store's launch steps on a real server ----------------------------------------------


def test_the_launch_steps_of_the_store_on_a_real_redis(tmp_path: Path) -> None:
    """`Runs.create` with a key (the Lua script), its refusals, the preparing index and
    `Launches.start` on redis-server (the unit tests run them on fakeredis)."""
    with running_redis(tmp_path / "redis") as server:
        store = RunStore.from_url(server.url)
        now = datetime.now(UTC)

        def preparing(run_id: str) -> RunRecord:
            return RunRecord(id=run_id, target="t", created=now, remote_dir=f"/w/{run_id}")

        assert store.runs.create(preparing("r1"), key="k1")
        with pytest.raises(Conflict):
            store.runs.create(preparing("r2"), key="k1")
        assert not store.runs.create(preparing("r1"), key="k2")  # the id is taken
        assert store.launches.launch("k2") is None
        store.runs.transition("r1", RunState.FAILED, message="run directory taken")
        assert store.runs.create(preparing("r1-2"), key="k1", replaces="r1")
        assert store.runs.create(preparing("r1-2"), key="k1", replaces="r1")  # a retry
        assert store.launches.launch("k1") == "r1-2"
        assert store.launches.preparing(now) == [("r1-2", "k1")]
        record, changed = store.launches.start("r1-2", JobId(dir="/w/r1-2", pid=4242))
        assert changed
        assert record.state is RunState.RUNNING
        assert store.follow.runs("t") == ["r1-2"]
        assert store.launches.preparing(now) == []
        client = server.client()
        try:
            assert client.zcard(store.keys.preparing) == 0
            assert client.hlen(store.keys.preparing_keys) == 0
        finally:
            client.close()


# --- the key through the producers: the API and the CLI -----------------------------------


def test_the_same_key_through_the_api_and_the_cli_is_one_run(tmp_path: Path) -> None:
    """`Runwarden.launch` and `runwarden launch --key K` with a used key return that
    run and start nothing; without a key each launch is its own run; a bad key is
    refused before anything is sent; a raw message without a key still runs."""
    with running_pipeline(tmp_path) as pipeline:
        try:
            api = pipeline.api
            spec = LaunchSpec(target="local", command=toy(*TRAIN), key="cli-key-1")
            first = api.launch(spec, wait_s=60)
            assert api.launch(spec, wait_s=60) == api.get_run(first.id)
            # The same key for another launch: refused, saying why; nothing started.
            words = ["launch", "--target", "local", "--key", "cli-key-1", "--", "true"]
            refused(run_cli(pipeline.env, *words), 1, f"already started run {first.id}")
            assert len(trainers(first.id)) == 1
            assert [r.id for r in api.list_runs()] == [first.id]

            keyless = LaunchSpec(target="local", command="true")
            one, two = api.launch(keyless, wait_s=60), api.launch(keyless, wait_s=60)
            assert one.id != two.id
            assert api.store.launches.launch(first.id) is None  # a run id is no key
            raw = send_signed(api.app, api.settings, TASK_LAUNCH, keyless.model_dump(mode="json"))
            made = raw.get(timeout=60)
            stored = owned_launch_key(OPERATOR, f"task-{raw.id}")
            assert api.store.launches.launch(stored) == made["run_id"]

            for bad in ("a b", "$(touch x)", "k" * 129, "-k"):
                words = ["launch", "--target", "local", "--key", bad, "--", "true"]
                refused(run_cli(pipeline.env, *words), 2, "invalid launch key")
            assert len(api.list_runs()) == 4
            assert api.get_run(first.id).state is RunState.RUNNING
            api.cancel(first.id)
        finally:
            pipeline.kill_jobs()


def test_a_key_belongs_to_its_producer(tmp_path: Path) -> None:
    """Two producers launching with the same key get a run each: neither reaches the
    other's (nor a key the workers derive, `continue.<run id>`, which no producer's
    launch can take first: it is stored as the workers' own)."""
    with running_pipeline(tmp_path) as pipeline:
        try:
            api = pipeline.api
            body = LaunchSpec(target="local", command="sleep 600", key="nightly-0601")

            def launch_as(producer: str, spec: LaunchSpec) -> str:
                body = spec.model_dump(mode="json")
                sent = send_signed(api.app, api.settings, TASK_LAUNCH, body, producer)
                run_id: str = sent.get(timeout=60)["run_id"]
                return run_id

            mallory = launch_as("mallory", body)
            billing = launch_as("billing", body)
            assert mallory != billing
            assert launch_as("billing", body) == billing  # still exactly once per producer
            assert api.store.launches.launch(owned_launch_key("billing", "nightly-0601")) == billing
            assert api.store.launches.launch("nightly-0601") is None
            hijack = body.model_copy(update={"key": continuation_key(billing)})
            taken = launch_as("mallory", hijack)
            stored = owned_launch_key(WORKER, continuation_key(billing))
            assert api.store.launches.launch(stored) is None  # still free for the workers
            assert api.store.launches.launch(owned_launch_key("mallory", hijack.key or "")) == taken
            for run_id in (mallory, billing, taken):
                api.cancel(run_id)
        finally:
            pipeline.kill_jobs()
