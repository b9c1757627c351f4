"""A real single-node Slurm cluster for the tests: `munged`, `slurmctld` and `slurmd`
(Debian's `slurm-wlm` and `munge`) on loopback, private to one directory.

[`running_slurm`] writes a `slurm.conf` that needs no cgroup and no accounting
database (`ProctrackType=proctrack/pgid`, `TaskPlugin=task/none`,
`AccountingStorageType=accounting_storage/none`), a munge key of its own and a munge
socket in that directory (`AuthInfo=socket=...`), picks free TCP ports on loopback for
the two daemons, starts them in the foreground and waits, up to 30 s, for the node to
be `idle`. Clients find the cluster by `SLURM_CONF` ([`SlurmCluster.env`]); nothing
is written outside the directory (but for the sockets of a long one: in a short
private directory of the system's temporary one, removed at the end), so two
clusters can run side by side.

Every daemon dies with the thread that started it (`PR_SET_PDEATHSIG`); at the end
every job is cancelled (`scancel --full`, SIGKILL) before the daemons get SIGTERM.
Must run as root (slurmd starts jobs as their users). Plain code, no pytest.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from .ports import free_port
from .redis_server import _die_with_parent

__all__ = ["SlurmCluster", "running_slurm", "slurm_missing"]

_READY_S = 30.0
_SHORT = 40
"""Longest directory whose sockets stay under the limit of a unix socket's path."""
_COMMANDS = ("munged", "slurmctld", "slurmd", "sbatch", "squeue", "scontrol", "scancel")


def slurm_missing() -> list[str]:
    """The Slurm and munge commands this machine lacks (empty: all there)."""
    found = os.environ.get("PATH", "") + ":/usr/sbin:/sbin"
    return [c for c in _COMMANDS if shutil.which(c, path=found) is None]


@dataclass
class SlurmCluster:
    """One running cluster: `conf` is its `slurm.conf`, `node` its single node (2
    CPUs or the machine's count, whichever is larger), `partition` its default
    partition."""

    root: Path
    conf: Path
    node: str
    partition: str = "debug"
    cpus: int = 2
    _procs: list[subprocess.Popen[bytes]] = field(default_factory=list)

    @property
    def env(self) -> dict[str, str]:
        """This process's environment with `SLURM_CONF` pointing at the cluster."""
        return {**os.environ, "SLURM_CONF": str(self.conf)}

    def run(self, *argv: str, check: bool = True) -> str:
        """Runs a Slurm client command against the cluster, in the cluster's directory
        (where a job submitted with no `--output` writes its `slurm-<id>.out`); its
        standard output. Raises `subprocess.CalledProcessError` when it fails and
        `check` is set."""
        done = subprocess.run(
            argv,
            env=self.env,
            cwd=self.root,
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        if check and done.returncode != 0:
            raise subprocess.CalledProcessError(done.returncode, argv, done.stdout, done.stderr)
        return done.stdout

    def jobs(self) -> dict[str, str]:
        """Every job slurmctld still knows: id -> state (`squeue --states=all`)."""
        out = self.run("squeue", "-h", "--states=all", "-o", "%i|%T")
        return dict(line.split("|", 1) for line in out.splitlines() if "|" in line)

    def state(self, job_id: str) -> str | None:
        """Job `job_id`'s state (`RUNNING`, `PENDING`, `COMPLETED`, ...), or None."""
        return self.jobs().get(job_id)

    def wait_state(self, job_id: str, states: set[str], timeout_s: float = 30.0) -> str:
        """Polls until job `job_id` is in one of `states`; the state. Raises
        `TimeoutError` with the last state seen."""
        deadline = time.monotonic() + timeout_s
        seen: str | None = None
        while time.monotonic() < deadline:
            seen = self.state(job_id)
            if seen in states:
                return seen
            time.sleep(0.1)
        raise TimeoutError(f"job {job_id} is {seen}, not one of {sorted(states)}")

    def cancel_all(self) -> None:
        """SIGKILL to every process of every job, then every job cancelled."""
        ids = [i for i, s in self.jobs().items() if s in {"RUNNING", "PENDING", "COMPLETING"}]
        if ids:
            self.run("scancel", "--full", "--signal=KILL", *ids, check=False)
            self.run("scancel", *ids, check=False)

    def _start(self, argv: list[str], env: Mapping[str, str]) -> None:
        name = next(a for a in argv if a.startswith("slurm") or a.endswith("munged"))
        log = (self.root / "log" / f"{Path(name).name}.out").open("ab")
        self._procs.append(
            subprocess.Popen(
                argv,
                env=dict(env),
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                preexec_fn=_die_with_parent,  # noqa: PLW1509 - only prctl, async-signal-safe
            )
        )

    def stop(self) -> None:
        """Cancels every job and waits up to 10 s for them to end, ends the daemons
        (SIGTERM, SIGKILL after 10 s), then SIGKILLs every `slurmstepd` left of this
        cluster (found by `SLURM_CONF` in its environment): a step daemon whose slurmd
        is gone would retry for ever, and one of another cluster with the same job id
        keeps that job `COMPLETING`."""
        with contextlib.suppress(Exception):
            self.cancel_all()
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline and any(
                s in {"RUNNING", "PENDING", "COMPLETING"} for s in self.jobs().values()
            ):
                time.sleep(0.1)
        for proc in reversed(self._procs):
            proc.terminate()
        for proc in reversed(self._procs):
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self._procs.clear()
        mark = f"SLURM_CONF={self.conf}".encode()
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                if (entry / "comm").read_text().strip() != "slurmstepd":
                    continue
                if mark not in (entry / "environ").read_bytes().split(b"\0"):
                    continue
                os.kill(int(entry.name), signal.SIGKILL)
            except OSError:
                continue


def _config(root: Path, sockets: Path, host: str, node: str, cpus: int) -> str:
    return "\n".join([
        "ClusterName=rwtest",
        f"SlurmctldHost={host}(127.0.0.1)",
        f"SlurmctldPort={free_port()}",
        f"SlurmdPort={free_port()}",
        "AuthType=auth/munge",
        f"AuthInfo=socket={sockets}/munge/munge.socket",
        "CredType=cred/munge",
        "ProctrackType=proctrack/pgid",
        "TaskPlugin=task/none",
        "JobAcctGatherType=jobacct_gather/none",
        "AccountingStorageType=accounting_storage/none",
        "SchedulerType=sched/backfill",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_Core",
        "SlurmUser=root",
        "SlurmdUser=root",
        f"StateSaveLocation={root}/state",
        f"SlurmdSpoolDir={sockets}/spool",
        f"SlurmctldPidFile={root}/slurmctld.pid",
        f"SlurmdPidFile={root}/slurmd.pid",
        f"SlurmctldLogFile={root}/log/slurmctld.log",
        f"SlurmdLogFile={root}/log/slurmd.log",
        "ReturnToService=2",
        "MpiDefault=none",
        # Finished jobs stay visible to squeue for 5 minutes (Slurm's default too).
        "MinJobAge=300",
        "KillWait=10",
        f"NodeName={node} NodeHostname={host} NodeAddr=127.0.0.1 CPUs={cpus} State=UNKNOWN",
        # Preemption by partition: a job of `high` preempts one of `low`, which gets
        # SIGTERM and 20 s of grace before it is requeued (runwarden submits --no-requeue:
        # ended, PREEMPTED, instead); `debug` is never preempted.
        "PreemptType=preempt/partition_prio",
        "PreemptMode=REQUEUE",
        "PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP PreemptMode=OFF",
        "PartitionName=low Nodes=ALL MaxTime=INFINITE State=UP PriorityTier=1 GraceTime=20",
        "PartitionName=high Nodes=ALL MaxTime=INFINITE State=UP PriorityTier=2 PreemptMode=OFF",
        "",
    ])  # fmt: skip


@contextlib.contextmanager
def running_slurm(root: Path) -> Iterator[SlurmCluster]:
    """A single-node cluster in `root` (see the module docstring), ended on exit.

    Raises:
        RuntimeError: a command is missing, this process is not root, or the node
            is not idle within 30 s (the daemons' logs are in `root/log`).
    """
    missing = slurm_missing()
    if missing:
        raise RuntimeError(f"Slurm is not installed here: no {', '.join(missing)}")
    if os.geteuid() != 0:
        raise RuntimeError("a test Slurm cluster needs root (slurmd starts jobs as users)")
    # Unix socket paths hold about 107 bytes: munged's socket and the step daemons'
    # (in the spool) go to a short private directory when `root` is long.
    short = None
    if len(str(root)) > _SHORT:
        # Not under TMPDIR, which may be as long (a test's own directory).
        short = Path(tempfile.mkdtemp(prefix="rw-slurm-", dir="/tmp"))
    sockets = short or root
    for sub in ("state", "log"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    for sub in ("munge", "spool"):
        (sockets / sub).mkdir(parents=True, exist_ok=True)
    (sockets / "munge").chmod(0o700)
    key = sockets / "munge" / "munge.key"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o400)
    host = socket.gethostname().split(".")[0]
    node = f"rw{os.getpid()}"
    cpus = max(2, os.cpu_count() or 2)
    conf = root / "slurm.conf"
    conf.write_text(_config(root, sockets, host, node, cpus))
    cluster = SlurmCluster(root=root, conf=conf, node=node, cpus=cpus)
    sbin = "/usr/sbin"
    env = {**cluster.env, "PATH": os.environ.get("PATH", "") + f":{sbin}"}
    try:
        cluster._start(
            [shutil.which("munged", path=env["PATH"]) or "munged", "-F", "-f",
             f"--socket={sockets}/munge/munge.socket", f"--key-file={key}",
             f"--log-file={root}/log/munged.log", f"--pid-file={sockets}/munge/munged.pid",
             f"--seed-file={sockets}/munge/seed"],
            env,
        )  # fmt: skip
        _wait_for((sockets / "munge" / "munge.socket").exists, "munged", root)
        cluster._start(["slurmctld", "-D", "-c", "-f", str(conf)], env)
        # slurmd under a reaper of its own: the step daemons it starts, and the jobs'
        # processes they leave, are re-parented there and reaped at once (a zombie
        # left in a job's process group keeps the job COMPLETING; the test process,
        # a subreaper itself, reaps only its own jobs).
        reaper = [sys.executable, "-m", "workers.reaper", "--"]
        cluster._start([*reaper, "slurmd", "-D", "-f", str(conf), "-N", node], env)

        def idle() -> bool:
            done = subprocess.run(
                ["sinfo", "-h", "-n", node, "-o", "%T"], env=env, capture_output=True,
                text=True, timeout=10, check=False,
            )  # fmt: skip
            return done.stdout.strip() == "idle"

        _wait_for(idle, "the Slurm node", root)
        yield cluster
    finally:
        cluster.stop()
        if sockets != root:
            shutil.rmtree(sockets, ignore_errors=True)


def _wait_for(ready: Callable[[], bool], what: str, root: Path) -> None:
    deadline = time.monotonic() + _READY_S
    while time.monotonic() < deadline:
        if ready():
            return
        time.sleep(0.1)
    logs = "; ".join(
        f"{p.name}: {p.read_text(errors='replace')[-400:]}"
        for p in sorted((root / "log").glob("*"))
    )
    raise RuntimeError(f"{what} is not ready within {_READY_S:.0f} s ({logs})")
