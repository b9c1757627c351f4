"""Fixtures shared by every test: the executors under test, the toy trainer, one real
redis-server for the session, and the reaping this machine needs.

This process becomes a child subreaper at start: jobs whose spawner died (a test
does that on purpose) and job processes that outlive their leader are re-parented
here, and the executors reap them by process group. Without it they would go to
init, which on some machines (this one) never reaps, and a zombie counts as a live
group member.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from hypothesis import settings as hypothesis_settings

from bench.harness.paths import JOBSIDE, ROOT, TOY_TRAINER
from bench.harness.redis_server import RedisServer, running_redis
from bench.harness.slurm import SlurmCluster, running_slurm
from bench.harness.sshd import SshServer, running_sshd
from schemas import JobId
from workers.executors import LocalExecutor, LocalTransport, ScriptExecutor
from workers.executors.base import Executor
from workers.executors.ssh import SshExecutor
from workers.reaper import become_subreaper

become_subreaper()

# The machine is shared (2 cores, several suites at once): a property's example may
# take far longer than hypothesis' 200 ms default without anything being wrong, so
# no property test fails on its timing; what each checks is its result.
hypothesis_settings.register_profile("runwarden", deadline=None)
hypothesis_settings.load_profile("runwarden")


_LONGEST: tuple[str, ...] = (
    "tests/integration/service/test_hostile_jobs.py",
    "tests/integration/service/test_launch_once.py",
    "tests/integration/workers/executors/test_notices.py",
    "tests/integration/workers/jobside/test_runwarden_loop.py",
    "tests/integration/service/test_slurm.py",
    "tests/integration/service/test_chaos.py",
    "tests/integration/service/test_budgets.py",
    "tests/integration/workers/executors/test_contract.py",
    "tests/integration/service/test_cli.py",
    "tests/integration/service/test_hostile_jobs_ssh_runas.py",
    "tests/integration/service/test_policies_resume.py",
    "tests/integration/service/test_hostile_jobs_runas.py",
    "tests/integration/workers/executors/test_cgroups.py",
    "tests/integration/service/test_preemption.py",
    "tests/integration/service/test_faults.py",
    "tests/integration/bench/test_campaign_benches.py",
    "tests/integration/bench/test_service_benches.py",
    "tests/integration/workers/executors/scripts/test_launch_shells.py",
    "tests/integration/conformance/test_check_trainer.py",
    "tests/integration/workers/jobside/test_runwarden_hf.py",
    "tests/integration/workers/jobside/test_runwarden_lightning.py",
    "tests/integration/workers/executors/scripts/test_launch.py",
    "tests/integration/producers/test_web_browser.py",
    "tests/integration/workers/executors/test_notices_choice.py",
    "tests/integration/service/test_sentinel.py",
    "tests/integration/service/test_loop_resume.py",
    "tests/integration/workers/executors/test_runas_ssh_contract.py",
    "tests/integration/workers/executors/test_slurm.py",
    "tests/integration/service/test_pipeline.py",
    "tests/integration/service/test_status.py",
    "tests/integration/workers/executors/test_runas_contract.py",
    "tests/integration/service/test_webhooks.py",
    "tests/integration/workers/executors/scripts/test_launch_notices.py",
    "tests/integration/producers/test_embedded.py",
)
"""The longest test files, longest first (their wall time in a full run, 158 s down to
25 s; refresh from `--junitxml`, summed per file, when they change: a stale entry costs
only scheduling)."""
_FIRST: tuple[str, ...] = (
    "tests/integration/service/",
    "tests/integration/workers/jobside/",
    "tests/integration/workers/",
    "tests/integration/bench/",
    "tests/integration/",
)
"""Then where the other long files are, by directory."""


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Orders the files longest first ([`_LONGEST`], then by [`_FIRST`]; each file's
    tests keep their order and stay together, so a module's fixtures start once), the
    same order in every process. xdist (`--dist loadfile --no-loadscope-reorder`;
    without the second it orders files by their number of tests, so the long files of
    one test came last) hands the files out in this order and each process holds its
    file and the next: a long file handed out last, or queued behind another long one,
    holds the run's end alone (full runs ended with one 33-38 s file running alone)."""

    def rank(item: pytest.Item) -> int:
        path = item.nodeid.split("::", 1)[0]
        if path in _LONGEST:
            return _LONGEST.index(path)
        where = next((i for i, prefix in enumerate(_FIRST) if path.startswith(prefix)), len(_FIRST))
        return len(_LONGEST) + where

    items.sort(key=rank)


def wait_for(
    condition: Callable[[], object], timeout_s: float = 10.0, interval_s: float = 0.05
) -> object:
    """Polls `condition` until it returns something truthy, which is returned; fails
    the test after `timeout_s` seconds."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"condition not met within {timeout_s} s")
        time.sleep(interval_s)


def toy_command(*args: str) -> str:
    """A job script running the toy trainer with `args`, the job side on its path."""
    from workers.executors import quote

    words = " ".join(quote(a) for a in args)
    return (
        f"PYTHONPATH={quote(str(JOBSIDE))} exec {quote(sys.executable)} -u "
        f"{quote(str(TOY_TRAINER))} {words}"
    )


def toy_env(run_dir: str) -> dict[str, str]:
    """The job-side variables launch sets for a job in `run_dir`."""
    return {
        "RUNWARDEN_SNAPSHOT_REQUEST": f"{run_dir}/snapshot.request",
        "RUNWARDEN_METRICS": f"{run_dir}/metrics.jsonl",
    }


@dataclass
class Target:
    """An executor under test and the directory its run directories live in."""

    kind: str
    executor: Executor
    workdir: Path
    make: Callable[[], Executor]
    """A fresh executor of the same kind on the same target (another process would
    build the same)."""
    spawner: str
    """Python source that builds an executor of this kind from `sys.argv[1]` (the
    workdir) and binds it to `executor`."""

    def run_dir(self, name: str = "run") -> str:
        return str(self.workdir / name)

    def spawn_from_a_dying_process(self, script: str, **fields: object) -> JobId:
        """Spawns `script` (with the other `JobCommand` `fields`) in `run_dir()` from
        a Python process that exits at once after the spawn, as a worker killed right
        then would; returns the job."""
        code = (
            "import json, os, sys\n" + self.spawner + "from schemas import JobCommand\n"
            "job = executor.spawn(JobCommand(dir=sys.argv[2], **json.loads(sys.argv[3])))\n"
            "print(job.model_dump_json(), flush=True)\n"
            "os._exit(0)\n"
        )
        fields_json = json.dumps({"script": script, **fields})
        out = subprocess.run(
            [sys.executable, "-c", code, str(self.workdir), self.run_dir(), fields_json],
            capture_output=True,
            check=True,
            cwd=ROOT,
            timeout=60,
        )
        return JobId.model_validate_json(out.stdout)


def process_alive(pid: int) -> bool:
    """Whether `pid` exists and is not a zombie (this machine's PID 1 may leave
    zombies: `kill -0` alone would say alive)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as handle:
            state = handle.read().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):  # gone before the open, or the read
        return False
    return state not in ("Z", "X")


def _local(workdir: Path) -> Executor:
    return LocalExecutor(workdir)


def _shell(workdir: Path) -> Executor:
    return ScriptExecutor(LocalTransport(), str(workdir))


_SPAWNERS = {
    "local": "from workers.executors import LocalExecutor\nexecutor = LocalExecutor(sys.argv[1])\n",
    "shell": "from workers.executors import ScriptExecutor, LocalTransport\n"
    "executor = ScriptExecutor(LocalTransport(), sys.argv[1])\n",
}


@pytest.fixture(scope="session")
def sshd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SshServer]:
    """One real OpenSSH server on loopback for the session: key auth, strict
    known_hosts, run under a reaper (see bench/harness/sshd.py)."""
    with running_sshd(tmp_path_factory.mktemp("sshd")) as server:
        yield server


@pytest.fixture(scope="session")
def slurm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    """One real single-node Slurm cluster (munged, slurmctld, slurmd on loopback) for
    the session's process, started when a test first asks for it; a test that asks
    for it fails (never skips) when Slurm cannot be started (bench/harness/slurm.py).
    Its clients find it through `SLURM_CONF`, set in this process's environment while
    it runs."""
    with running_slurm(tmp_path_factory.mktemp("slurm")) as cluster:
        before = os.environ.get("SLURM_CONF")
        os.environ["SLURM_CONF"] = str(cluster.conf)
        try:
            yield cluster
        finally:
            if before is None:
                os.environ.pop("SLURM_CONF", None)
            else:
                os.environ["SLURM_CONF"] = before


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """One real redis-server for the session (AOF on, unix socket; see
    bench/harness/redis_server.py), started when a test first asks for it. A test that asks
    for it fails (never skips) when `redis-server` cannot be started. The store tests'
    `redis_client` (tests/unit/store/conftest.py) empties it before each test."""
    with running_redis(tmp_path_factory.mktemp("redis")) as server:
        yield server


def ssh_executor(server: SshServer, workdir: Path | str) -> SshExecutor:
    """An SSH executor for `server`, host key checked against its known_hosts."""
    return SshExecutor.connect(
        server.destination,
        str(workdir),
        identity=server.client_key,
        known_hosts=server.known_hosts,
    )


@pytest.fixture(params=["local", "shell", "ssh"])
def target(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Target]:
    """Each executor of the contract: `local` (LocalExecutor, native file access),
    `shell` (every operation through the shared scripts, over a local transport), and
    `ssh` (SshExecutor against a real sshd on loopback)."""
    yield from _target(request, tmp_path, request.param)


@pytest.fixture(params=["local", "shell"])
def argument_target(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Target]:
    """The executors for an argument check that must refuse before reaching the target:
    `local` and `shell` are its two code paths (LocalExecutor overrides some operations);
    SshExecutor is ScriptExecutor with another transport and overrides none, so `ssh`
    would run `shell`'s check again behind an SSH connection."""
    yield from _target(request, tmp_path, request.param)


def _target(request: pytest.FixtureRequest, tmp_path: Path, kind: str) -> Iterator[Target]:
    workdir = tmp_path / "work"
    workdir.mkdir()
    factory: Callable[[Path], Executor]
    if kind == "ssh":
        server: SshServer = request.getfixturevalue("sshd")

        def factory(path: Path) -> Executor:
            return ssh_executor(server, path)

        spawner = (
            "from pathlib import Path\n"
            "from workers.executors.ssh import SshExecutor\n"
            f"executor = SshExecutor.connect({server.destination!r}, sys.argv[1], "
            f"identity=Path({str(server.client_key)!r}), "
            f"known_hosts=Path({str(server.known_hosts)!r}))\n"
        )
    else:
        factory = _local if kind == "local" else _shell
        spawner = _SPAWNERS[kind]
    executor = factory(workdir)
    yield Target(kind, executor, workdir, lambda: factory(workdir), spawner)
    executor.close()


@pytest.fixture
def env_without_runwarden(monkeypatch: pytest.MonkeyPatch) -> None:
    """Removes the service's own variables from this process, as a clean worker."""
    for name in list(os.environ):
        if name.startswith(("RUNWARDEN_", "OVERBRAINER_", "VAULT_")):
            monkeypatch.delenv(name)


def put_signed_target(store: Any, settings: Any, config: dict[str, Any]) -> None:
    """Stores target `config` signed as `runwarden targets add` signs it
    (`bench.harness.pipeline.put_signed_target`)."""
    from bench.harness.pipeline import put_signed_target as put

    put(store, settings, config)
