"""A Slurm target's follow tick against a real single-node cluster
(bench/harness/slurm.py): how many Slurm commands one tick runs, and its median wall
time, for 1, 10 and 100 runs (jobs that sleep; on a small node most wait in the
queue, which Slurm answers for the same way). Every Slurm command the login node runs
is counted through a shim directory first on the submitting shell's `PATH`, which
logs each call and runs the real one.

The baseline, in the same script: the same run directories followed by the plain
follow script (`ScriptExecutor` through `LocalTransport`, no Slurm), so the ratio is
the price of asking Slurm. Needs root (slurmd).

    .venv/bin/python bench/slurm_follow.py            # 1, 10, 100 runs; 9 ticks each, median
    .venv/bin/python bench/slurm_follow.py --tiny     # 1 and 3 runs, 3 ticks: a smoke run
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._timing import median_s
from bench.harness.slurm import running_slurm
from schemas import JobCommand, JobId
from schemas.targets import SlurmOptions
from workers.executors import LocalTransport, ScriptExecutor
from workers.executors.local import job_environment
from workers.executors.scripts.follow import FollowEntry
from workers.executors.slurm import SlurmExecutor

COMMANDS = ("sbatch", "squeue", "scontrol", "scancel", "sinfo", "sacct")


def _shims(root: Path, log: Path) -> Path:
    """A directory of scripts named as the Slurm commands, each appending its name to
    `log` and running the real command found on `PATH` after it."""
    shims = root / "shims"
    shims.mkdir()
    for name in COMMANDS:
        path = shims / name
        path.write_text(
            "#!/bin/sh\n"
            f"echo {name} >> '{log}'\n"
            f'PATH=$(printf %s "$PATH" | sed "s#^{shims}:##")\n'
            f'exec {name} "$@"\n'
        )
        path.chmod(0o755)
    return shims


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tiny", action="store_true", help="1 and 3 runs, 3 ticks")
    args = parser.parse_args()
    sizes, ticks = ((1, 3), 3) if args.tiny else ((1, 10, 100), 9)
    with tempfile.TemporaryDirectory(prefix="rw-slurm-bench-") as tmp:
        root = Path(tmp)
        with running_slurm(root / "cluster") as cluster:
            log = root / "commands.log"
            env = job_environment({**os.environ, "SLURM_CONF": str(cluster.conf)})
            env["PATH"] = f"{_shims(root, log)}:{env.get('PATH', '/usr/bin:/bin')}"
            work = root / "work"
            slurm = SlurmExecutor(LocalTransport(env=env), str(work), SlurmOptions())
            plain = ScriptExecutor(LocalTransport(env=env), str(work))
            jobs: list[JobId] = []
            print(f"{'runs':>5} {'slurm commands/tick':>20} {'tick':>10} {'baseline':>10} ratio")
            for size in sizes:
                while len(jobs) < size:
                    run = work / f"run-{len(jobs)}"
                    jobs.append(slurm.spawn(JobCommand(dir=str(run), script="sleep 600")))
                entries = [FollowEntry(job, 0, 0) for job in jobs]
                log.write_text("")
                slurm.follow(entries)
                per_tick = len(log.read_text().split())
                took = 1000 * median_s(functools.partial(slurm.follow, entries), ticks, 1)
                base = 1000 * median_s(functools.partial(plain.follow, entries), ticks, 1)
                print(
                    f"{size:>5} {per_tick:>20} {took:>8.1f} ms {base:>7.1f} ms "
                    f"{took / base:.2f}x the baseline",
                    flush=True,
                )
            cluster.cancel_all()
    print(
        f"(median of {ticks} ticks; 2 cores: the times vary by about 20% from run to run,"
        " the command counts not at all)"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
