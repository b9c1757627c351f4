"""A local target whose jobs run as another user, through the real service
(bench/harness/pipeline.py: redis-server, Celery worker and beat, all root here): what such a
job cannot reach of the worker's, and that launch, status, follow, stop with a proof,
retrieval, resume and cancel all work for it.

Everything lives in a directory others may enter (bench/harness/users.py, `shared_dir`), so
that each refusal comes from the protection under test (a mode, `/proc`'s rule),
never from a parent directory the job could not enter anyway. The target `local`
(jobs as root, the worker's user) runs the same probe for contrast: it reads
everything the job run as JOB_USER cannot.
"""

from __future__ import annotations

import hashlib
import json
import secrets
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import pytest

from bench.harness.pipeline import Pipeline, running_pipeline
from bench.harness.processes import kill_processes_in
from bench.harness.users import JOB_USER, as_the_worker, ensure_user, job_python, shared_dir
from producers.embedded import EmbeddedRedis
from schemas import ArtifactsPhase, RunRecord, RunState, Settings, TargetConfig
from schemas.events import LaunchSpec
from workers.executors import quote

from ...conftest import TOY_TRAINER, wait_for

pytestmark = pytest.mark.slow

TOKEN = "probe-secret-" + secrets.token_hex(8)
"""The secret the worker reads from its secrets directory (file `PROBE_TOKEN`) and
passes to the probe job at its launch."""

PROBE = r'''
"""Tries to read what the worker holds; prints what it got, or why not, as JSON."""
import hashlib, json, os, socket, sys

paths = json.loads(os.environ["PROBE_PATHS"])
results = {}


def attempt(name, read):
    try:
        results[name] = {"got": read()}
    except OSError as error:
        results[name] = {"error": f"{type(error).__name__}: {error.strerror}"}


def environ(pid):
    data = open(f"/proc/{pid}/environ", "rb").read()
    names = [entry.split(b"=", 1)[0].decode() for entry in data.split(b"\0") if entry]
    mine = os.environ.get("PROBE_TOKEN", "").encode()
    return {
        "names": sorted(n for n in names if n.startswith("RUNWARDEN_")),
        "holds my secret": bool(mine) and mine in data,
    }


def ping(path):
    with socket.socket(socket.AF_UNIX) as sock:
        sock.settimeout(5)
        sock.connect(path)
        sock.sendall(b"PING\r\n")
        return sock.recv(64).decode()


for pid in paths["worker_pids"]:
    attempt(f"environ of worker process {pid}", lambda: environ(pid))
attempt("secrets directory (0700)", lambda: sorted(os.listdir(paths["secrets_dir"])))
attempt("file in the secrets directory", lambda: open(paths["secret_file"]).read())
attempt("redis password file (0600)", lambda: open(paths["password_file"]).read())
attempt("the service's redis socket (0700)", lambda: ping(paths["redis_socket"]))
attempt("embedded redis socket (0700)", lambda: ping(paths["embedded_socket"]))
token = os.environ.get("PROBE_TOKEN", "")
results["own secret"] = hashlib.sha256(token.encode()).hexdigest()
results["uid"] = os.getuid()
print("PROBE " + json.dumps(results, sort_keys=True), flush=True)
'''


@dataclass
class Service:
    pipeline: Pipeline
    base: Path
    python: str
    source: Path
    """Uploaded into every run directory: the toy trainer and the probe."""
    paths: dict[str, object]
    uid: int


def worker_pids(pipeline: Pipeline) -> list[int]:
    """The worker's processes: its reaper and every Celery process under it (never a
    job: jobs are re-parented to the reaper too). Started with exec (the module reads
    their environments in /proc, as a job would try to)."""
    reaper = pipeline.workers["w1"].pid
    children: dict[int, list[int]] = {}
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                ppid = int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(proc.name))
    found, todo = [reaper], list(children.get(reaper, []))
    while todo:
        pid = todo.pop()
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if b"workers.start" in cmdline:
            found.append(pid)
            todo.extend(children.get(pid, []))
    return found


@pytest.fixture(scope="module")
def service() -> Iterator[Service]:
    uid = ensure_user(JOB_USER).pw_uid
    python = job_python()
    with shared_dir() as base:
        source = base / "src"
        source.mkdir()
        shutil.copy(TOY_TRAINER, source / "toy_trainer.py")
        (source / "probe.py").write_text(PROBE)
        # The test's redis-server has no password: a 0600 file stands for the one
        # `redis-password` of the secrets directory would hold.
        password = base / "redis.password"
        password.touch(mode=0o600)
        password.chmod(0o600)
        password.write_text("redis-password-in-a-0600-file")
        embedded = EmbeddedRedis(Settings(state_dir=base / "embedded"))
        embedded.start()
        try:
            with running_pipeline(base, exec_start=True) as pipeline:
                secrets_dir = pipeline.api.settings.secrets.path
                pipeline.api.settings.secrets.ensure("PROBE_TOKEN", TOKEN)
                # Only the directory (0700) protects it.
                (secrets_dir / "PROBE_TOKEN").chmod(0o644)
                allowed = {"allow_secrets": ("PROBE_TOKEN",), "upload_roots": (str(source),)}
                pipeline.api.add_target(
                    TargetConfig(
                        name="as-job", kind="local", workdir=str(base / "jobs"),
                        run_as=JOB_USER, **allowed,
                    )
                )  # fmt: skip
                pipeline.api.add_target(
                    TargetConfig(
                        name="local", kind="local", workdir=str(pipeline.workdir), **allowed,
                        **as_the_worker(),
                    )
                )
                paths: dict[str, object] = {
                    "worker_pids": worker_pids(pipeline),
                    "secrets_dir": str(secrets_dir),
                    "secret_file": str(secrets_dir / "PROBE_TOKEN"),
                    "password_file": str(password),
                    "redis_socket": str(pipeline.redis.socket_path),
                    "embedded_socket": str(embedded.socket),
                }
                try:
                    yield Service(pipeline, base, python, source, paths, uid)
                finally:
                    pipeline.kill_jobs()
                    kill_processes_in(base / "jobs")
        finally:
            embedded.stop()


def toy_spec(service: Service, target: str, *args: str, prefix: str = "") -> LaunchSpec:
    words = " ".join(quote(a) for a in ["--step-time", "0.05", *args])
    command = f"{prefix}exec {quote(service.python)} -u toy_trainer.py {words}"
    return LaunchSpec(target=target, command=command, upload=service.source)


def probe(service: Service, target: str) -> tuple[RunRecord, dict[str, object]]:
    """Runs the probe on `target` to its end; returns its run and what it printed."""
    paths = quote(json.dumps(service.paths))
    spec = LaunchSpec(
        target=target,
        command=f"PROBE_PATHS={paths} exec {quote(service.python)} probe.py",
        upload=service.source,
        secrets=("PROBE_TOKEN",),
    )
    pipeline = service.pipeline
    run = pipeline.wait_state(pipeline.api.launch(spec, wait_s=60).id)
    log = (Path(run.remote_dir) / "job.log").read_text()
    assert run.state is RunState.SUCCEEDED, (run, log)
    lines = [line for line in log.splitlines() if line.startswith("PROBE ")]
    assert len(lines) == 1, log
    return run, json.loads(lines[0].removeprefix("PROBE "))


def attempts_of(results: dict[str, object]) -> dict[str, dict[str, object]]:
    """Every attempt of the probe, each with what it got or why not."""
    return {k: v for k, v in results.items() if isinstance(v, dict)}


GONE: Final = {"error": "FileNotFoundError: No such file or directory"}


def attempts(results: dict[str, object]) -> dict[str, dict[str, object]]:
    """The probe's attempts, less the worker processes that were gone by then: the
    listing may take a process the worker forked just before its exec (a script's
    `sh`: still `workers.start` on its command line), which a gone process cannot
    leak anything of. The reaper, the Celery main and a pool process always stay."""
    tried = attempts_of(results)
    kept = {k: v for k, v in tried.items() if not (k.startswith("environ of") and v == GONE)}
    assert sum(k.startswith("environ of") for k in kept) >= 3, tried
    return kept


def test_a_job_run_as_its_user_cannot_read_what_the_worker_holds(service: Service) -> None:
    run, denied = probe(service, "as-job")
    shown = json.dumps(denied, indent=1)
    print("run as", JOB_USER, shown)
    assert denied["uid"] == service.uid, shown
    # The worker (reaper, Celery main and pool processes), the two files, two sockets.
    assert len(attempts_of(denied)) == len(service.paths["worker_pids"]) + 5, shown  # type: ignore[arg-type]
    tried = attempts(denied)
    for name, result in tried.items():
        # What the job got instead is in its log: one refusal per attempt.
        assert result == {"error": "PermissionError: Permission denied"}, (name, shown)
    # The secret passed to its launch still reached it.
    assert denied["own secret"] == hashlib.sha256(TOKEN.encode()).hexdigest()
    # Its log was followed into the store like any job's.
    lines = [entry.line for entry in service.pipeline.api.store.follow.read_log(run.id)]
    assert any(line.startswith("PROBE ") for line in lines), lines

    # The same job as the worker's user reads every one of them.
    _, allowed = probe(service, "local")
    shown = json.dumps(allowed, indent=1)
    print("run as the worker's user", shown)
    assert allowed["uid"] == 0
    tried = attempts(allowed)
    for name, result in tried.items():
        assert "got" in result, (name, shown)
        if name.startswith("environ"):
            got = result["got"]
            assert isinstance(got, dict)
            assert "RUNWARDEN_REDIS_URL" in got["names"], (name, shown)
            # ... where no secret is: the worker reads them from its secrets directory.
            assert got["holds my secret"] is False, (name, shown)
            assert not [n for n in got["names"] if "SECRET" in n], (name, shown)
    assert "PROBE_TOKEN" in tried["secrets directory (0700)"]["got"]  # type: ignore[operator]
    assert tried["file in the secrets directory"]["got"] == TOKEN + "\n"
    assert tried["redis password file (0600)"]["got"] == "redis-password-in-a-0600-file"
    assert tried["the service's redis socket (0700)"]["got"] == "+PONG\r\n"
    # The embedded default also has a password: the worker's user reaches its socket,
    # the password is what keeps it out there.
    assert tried["embedded redis socket (0700)"]["got"] == "-NOAUTH Authentication required.\r\n"
    assert allowed["own secret"] == denied["own secret"]


def wait_artifacts(pipeline: Pipeline, run_id: str) -> RunRecord:
    def done() -> RunRecord | None:
        run = pipeline.api.get_run(run_id)
        ready = run.artifacts is not None and run.artifacts.phase is not ArtifactsPhase.PENDING
        return run if ready else None

    return wait_for(done, timeout_s=60)  # type: ignore[return-value]


def test_status_follow_stop_retrieval_and_resume_as_the_user(service: Service) -> None:
    pipeline = service.pipeline
    run = pipeline.api.launch(toy_spec(service, "as-job", "--steps", "100000"), wait_s=60)
    assert run.state is RunState.RUNNING
    assert run.job is not None
    assert Path(f"/proc/{run.job.pid}").stat().st_uid == service.uid
    pipeline.wait_step(run.id, 5)  # metrics followed
    assert pipeline.api.store.follow.read_log(run.id)  # the log followed

    pipeline.api.stop(run.id, asked_by="test")
    ended = pipeline.wait_state(run.id)
    assert ended.state is RunState.STOPPED, (ended, pipeline.logs())
    assert ended.snapshot is not None
    checkpoint = Path(run.remote_dir) / ended.snapshot.checkpoint
    assert checkpoint.is_dir()
    for path in [Path(run.remote_dir), *Path(run.remote_dir).rglob("*")]:
        assert path.lstat().st_uid == service.uid, path
    retrieved = wait_artifacts(pipeline, run.id)
    assert retrieved.artifacts is not None
    assert retrieved.artifacts.phase is ArtifactsPhase.DONE, retrieved.artifacts
    home = pipeline.api.settings.artifacts_root / run.id
    assert (home / ended.snapshot.checkpoint / "state.json").is_file()

    # Resumed on the same target: the checkpoint is uploaded (as the user) and checked.
    spec = toy_spec(service, "as-job", "--steps", str(ended.snapshot.step + 3))
    resumed = pipeline.api.launch(spec.model_copy(update={"resume_from": run.id}), wait_s=60)
    done = pipeline.wait_state(resumed.id)
    assert done.state is RunState.SUCCEEDED, (done, pipeline.logs())
    log = (Path(resumed.remote_dir) / "job.log").read_text()
    assert f"at step {ended.snapshot.step + 1}" in log, log


def marked(run_id: str) -> list[tuple[int, int, int]]:
    """(pid, session, uid) of every live process carrying the run's mark."""
    entry = f"RUNWARDEN_RUN_ID={run_id}".encode()
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if entry not in (proc / "environ").read_bytes().split(b"\0"):
                continue
            fields = (proc / "stat").read_text().rsplit(")", 1)[1].split()
            uid = proc.stat().st_uid
        except OSError:
            continue
        if fields[0] not in ("Z", "X"):
            found.append((int(proc.name), int(fields[3]), uid))
    return found


def test_cancel_as_the_user_sweeps_a_child_that_left_the_session(service: Service) -> None:
    pipeline = service.pipeline
    spec = toy_spec(
        service, "as-job", "--steps", "100000", "--ignore-requests", prefix="setsid sleep 600 & "
    )
    run = pipeline.api.launch(spec, wait_s=60)
    assert run.job is not None
    pipeline.wait_step(run.id, 2)
    processes = marked(run.id)
    escaped = [p for p in processes if p[1] != run.job.pid]
    assert escaped, processes  # the `setsid sleep`: in a session of its own
    assert all(uid == service.uid for _, _, uid in processes), processes
    # Contained too (a root worker): every process of the run is in its cgroup.
    assert run.job.cgroup is not None
    procs = Path(run.job.cgroup, "cgroup.procs").read_text().split()
    assert {str(pid) for pid, _, _ in processes} <= set(procs), (processes, procs)

    cancelled = pipeline.api.cancel(run.id)
    assert cancelled.state is RunState.CANCELLED, (cancelled, pipeline.logs())
    assert marked(run.id) == []
    assert Path(run.job.cgroup, "cgroup.procs").read_text() == ""
