"""One follow tick's cost over many runs whose stops wait for a proof: the median wall
time of the tick's one script (`sh/follow.sh`, as a target over SSH or a run-as one
of a worker that is not root runs it; here through `LocalTransport`) over RUNS run
directories, each with a log, metrics and a `snapshot.json`, in three forms:

- baseline: no proof asked (the runs have no stop);
- proof read: every proof read (the first tick of a stop, or a changed proof);
- proof unchanged: each proof's signature from the previous tick given, and the same
  (a proof found not valid yet, as `workers.watch` remembers it);
- read by the worker: the baseline's tick read by the worker itself, no script
  (`rundir.follow_here`: what `LocalExecutor.follow` does, and a root worker for a
  `--run-as` target).

Each is printed with its ratio to the baseline, in the same script, on this machine.

    .venv/bin/python bench/follow_tick.py              # 60 runs, 15 ticks of each, median
    .venv/bin/python bench/follow_tick.py --tiny       # a smoke run
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from schemas import JobId
from workers.executors import LocalExecutor, LocalTransport, ScriptExecutor
from workers.executors.rundir import follow_here
from workers.executors.scripts.follow import FollowEntry


def _runs(root: Path, count: int) -> list[JobId]:
    """`count` run directories of a live job (this process: its status is running)."""
    jobs = []
    for index in range(count):
        run = root / f"run-{index}"
        run.mkdir()
        (run / "job.log").write_text("step 1\n" * 10)
        (run / "metrics.jsonl").write_text('{"step": 1}\n')
        proof = {"checkpoint": "output/checkpoint-7", "step": 7, "time": time.time()}
        (run / "snapshot.json").write_text(json.dumps(proof))
        jobs.append(JobId(dir=str(run), pid=os.getpid()))
    return jobs


def _median_ms(tick: Callable[[], object], ticks: int) -> float:
    took = []
    for _ in range(ticks):
        started = time.perf_counter()
        tick()
        took.append(time.perf_counter() - started)
    return statistics.median(took) * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=60, help="run directories in the tick")
    parser.add_argument("--ticks", type=int, default=15, help="ticks of each form (median)")
    parser.add_argument("--tiny", action="store_true", help="the smoke test's run: least of all")
    args = parser.parse_args()
    runs, ticks = (5, 3) if args.tiny else (args.runs, args.ticks)
    with tempfile.TemporaryDirectory(prefix="rw-follow-tick-") as tmp:
        root = Path(tmp)
        LocalExecutor(root)  # makes the workdir as a target does
        executor = ScriptExecutor(LocalTransport(), str(root))
        jobs = _runs(root, runs)
        first = executor.follow([FollowEntry(job, 0, 0, proof=True) for job in jobs])
        seen = [update.proof_sig for update in first]
        forms = {
            "baseline (no proof)": [FollowEntry(job, 0, 0) for job in jobs],
            "proof read": [FollowEntry(job, 0, 0, proof=True) for job in jobs],
            "proof unchanged": [
                FollowEntry(job, 0, 0, True, sig) for job, sig in zip(jobs, seen, strict=True)
            ],
        }
        base = None
        print(f"one follow tick over {runs} runs, median of {ticks} (2 cores: +-10% is noise)")
        for name, entries in forms.items():
            ms = _median_ms(lambda e=entries: executor.follow(e, timeout_s=30), ticks)  # type: ignore[misc]
            base = base or ms
            print(f"{name:<20} {ms:8.1f} ms  {ms / base:5.2f}x the baseline")
        plain = forms["baseline (no proof)"]
        ms = _median_ms(lambda: follow_here(plain, None), ticks)
        print(f"{'read by the worker':<20} {ms:8.1f} ms  {ms / (base or ms):5.2f}x the baseline")


if __name__ == "__main__":
    main()
