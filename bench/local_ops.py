"""Median latency of the small operations on the local executor, beside the floor:
a bare `sh -c true` started the same way, measured in the same run.

    .venv/bin/python bench/local_ops.py [--repeat N]

`local` is LocalExecutor (a live job's status read here, from the kernel, with no
script: `executors/liveness.py`; read_from and put_file native); `shell` runs every
operation through the scripts, as the SSH executor does, over a local transport.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._timing import median_s, ms
from schemas import JobCommand
from workers.executors import LocalExecutor, LocalTransport, ScriptExecutor
from workers.reaper import become_subreaper


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=300)
    parser.add_argument("--tiny", action="store_true", help="the smoke test's run: least of all")
    args = parser.parse_args()
    if args.tiny:
        args.repeat = 10
    become_subreaper()
    root = Path(tempfile.mkdtemp(prefix="rw-bench-"))
    floor = median_s(
        lambda: subprocess.run(["sh", "-c", "true"], check=True, start_new_session=True),
        args.repeat,
    )
    print(f"floor: sh -c true                {ms(floor)}")
    print(f"{'operation':32} {'median':>11} {'x floor':>8}")
    for name, executor in (
        ("local", LocalExecutor(root)),
        ("shell", ScriptExecutor(LocalTransport(), str(root))),
    ):
        run_dir = f"{root}/{name}"
        job = executor.spawn(JobCommand(dir=run_dir, script="sleep 600"))
        data = Path(run_dir) / "data.bin"
        data.write_bytes(bytes(range(256)) * 64)
        ops = {
            "status": lambda e=executor, j=job: e.status(j),
            "read_from 4 KiB": lambda e=executor, p=str(data): e.read_from(p, 1000, 4096),
            "put_file": lambda e=executor, d=run_dir: e.put_file(
                f"{d}/snapshot.request", "requested"
            ),
        }
        for op, call in ops.items():
            median = median_s(call, args.repeat)
            print(f"{name + ' ' + op:32} {ms(median)} {median / floor:8.2f}")
        executor.cancel(job)


if __name__ == "__main__":
    main()
