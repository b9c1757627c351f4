"""The runs-by-state gauge of a `/metrics` scrape, against the way it was read before.

`--runs` run records (default 10,000; a fifth running, the rest ended in the four
terminal states) in a private redis-server, then both ways of counting them:

- baseline: every record read (`Runs.find`: one MGET per 500 runs, each record
  parsed) and counted by state, as the scrape did before;
- now: the sizes of the sets of runs by state (`Runs.count_by_state`: one round trip
  of SCARDs, no record read).

Printed: the median of `--repeat` calls of each (after 2 warm-ups, which also build
the sets from the records once, as a store from before them would), and the ratio.
The two must agree, or it exits 1.

    .venv/bin/python bench/metrics_scrape.py
    .venv/bin/python bench/metrics_scrape.py --runs 1000 --repeat 21
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench._timing import median_s, ms  # noqa: E402
from bench.harness.redis_server import running_redis  # noqa: E402
from schemas import JobId, RunRecord, RunState, Settings  # noqa: E402
from store import RunStore  # noqa: E402
from store.steps import end_run  # noqa: E402

ENDS = (RunState.SUCCEEDED, RunState.FAILED, RunState.CANCELLED, RunState.STOPPED)


def fill(store: RunStore, runs: int) -> None:
    """`runs` records through the store's own writes: created, started, most ended."""
    t0 = datetime(2026, 1, 1, tzinfo=UTC)
    for n in range(runs):
        run_id = f"20260101-000000-{n:05d}-bench"
        store.runs.create(
            RunRecord(
                id=run_id,
                target="local",
                created=t0 + timedelta(seconds=n),
                remote_dir=f"/work/{run_id}",
                state=RunState.PREPARING,
                command="python train.py --epochs 100 --lr 3e-4",
            )
        )
        store.launches.start(run_id, JobId(dir=f"/work/{run_id}", pid=1000 + n % 30000))
        if n % 5:
            end_run(store, run_id, ENDS[n % 4], message="the run ended")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10_000)
    parser.add_argument("--repeat", type=int, default=9)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp, running_redis(Path(tmp)) as server:
        store = RunStore.from_settings(Settings(redis_url=server.url, state_dir=Path(tmp)))
        fill(store, args.runs)

        def baseline() -> dict[RunState, int]:
            counted = Counter(run.state for run in store.runs.find())
            return {state: counted[state] for state in RunState}

        def now() -> dict[RunState, int]:
            return store.runs.count_by_state()

        if baseline() != now():
            print(f"the counts differ: {baseline()} != {now()}")
            return 1
        before = median_s(baseline, repeat=args.repeat, warmup=2)
        after = median_s(now, repeat=args.repeat, warmup=2)
    print(f"runs by state of {args.runs} runs, median of {args.repeat}:")
    print(f"  baseline (every record read)  {ms(before)}")
    print(f"  now (sets of runs by state)   {ms(after)}")
    print(f"  ratio                         {before / after:8.1f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
