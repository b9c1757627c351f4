"""What Redis holds after a day of periodic ticks, simulated: the service's keys and
`used_memory` before and after a few minutes of beat at fast clocks, with runs
followed, their growth per tick, and that growth stretched to a day at the default
periods, beside the fixed part (the runs' own records) as the baseline.

Beat sends the follow tick (fanned out to one task per target), the policy tick and
reconcile at `--tick` seconds each (defaults: 5, 60 and 10 s), against a real
redis-server and real Celery worker and beat (`bench.harness.pipeline`), for
`--seconds`; `--runs` runs on `--targets` local targets are followed all along, their
jobs one shared `sleep`. A key is counted by its family (the part before the first
`:` or `-` that names it: `rw`, `celery-task-meta`, `_kombu`, ...), so a family that
grows with the ticks shows as such. Periodic tasks keep no result (`QuietTask`): the
figure to read is the keys per tick, which should be 0.

    .venv/bin/python -m workers.reaper -- .venv/bin/python bench/redis_keys.py
"""

from __future__ import annotations

import argparse
import collections
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.harness.pipeline import Pipeline, running_pipeline  # noqa: E402
from bench.harness.users import as_the_worker  # noqa: E402
from bench.pipeline import register_runs  # noqa: E402
from schemas import TargetConfig  # noqa: E402
from schemas.settings import Settings  # noqa: E402

DAY_S = 24 * 3600


def families(pipeline: Pipeline) -> tuple[collections.Counter[str], int]:
    """Keys by family, and Redis's `used_memory` in bytes."""
    client = pipeline.redis.client()
    counts: collections.Counter[str] = collections.Counter()
    for key in client.scan_iter(count=1000):
        name = key.decode("utf-8", "replace")
        cut = min((i for i in (name.find(":"), name.find("-")) if i > 0), default=len(name))
        if name.startswith("celery-task-meta"):
            cut = len("celery-task-meta")
        counts[name[:cut]] += 1
    return counts, int(client.info("memory")["used_memory"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=120.0, help="beat's run, measured (s)")
    parser.add_argument("--warm", type=float, default=10.0, help="beat's run before it (s)")
    parser.add_argument("--tick", type=float, default=0.2, help="each periodic task's period")
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--targets", type=int, default=10)
    parser.add_argument("--tiny", action="store_true", help="the smoke test's run: least of all")
    args = parser.parse_args()
    if args.tiny:
        args.seconds, args.warm, args.runs, args.targets = 3.0, 2.0, 4, 2
    tick = str(args.tick)
    clocks = {
        "RUNWARDEN_FOLLOW_POLL_S": tick,
        "RUNWARDEN_RECONCILE_S": tick,
        "RUNWARDEN_POLICY_S": tick,
        "RUNWARDEN_PROOF_TIMEOUT_S": "3600",
    }
    tmp = Path(tempfile.mkdtemp(prefix="rw-bench-keys-"))
    with running_pipeline(tmp, beat=False, extra_env=clocks) as pipeline:
        names = [f"k{t}" for t in range(args.targets)]
        for name in names:
            (pipeline.tmp / name).mkdir()
            workdir = str(pipeline.tmp / name)
            config = TargetConfig(name=name, kind="local", workdir=workdir, **as_the_worker())
            pipeline.api.add_target(config)
        leader = subprocess.Popen(["sleep", "3600"], start_new_session=True)
        try:
            for run in register_runs(pipeline, "keys", names, max(1, args.runs // args.targets),
                                     leader=leader.pid, labels={}):  # fmt: skip
                pipeline.api.store.follow.add(run.id)
            fixed, memory_fixed = families(pipeline)
            pipeline.start_beat()
            # A first tick of each kind makes the keys that are made once (a target's
            # last tick, the periodic tasks' health): counted from after it.
            time.sleep(args.warm)
            before, memory_before = families(pipeline)
            time.sleep(args.seconds)
            after, memory_after = families(pipeline)
        finally:
            leader.kill()
            leader.wait()
    ticks = args.seconds / args.tick
    grown = {k: after[k] - before[k] for k in sorted(set(before) | set(after))}
    defaults = Settings()
    # Ticks of a day at the default periods: each follow tick fans out to every target.
    day = DAY_S * (
        (1 + args.targets) / defaults.follow_poll_s
        + 1 / defaults.policy_s
        + 1 / defaults.reconcile_s
    )
    here = ticks * (1 + args.targets + 2)
    print(
        f"== Redis after {args.seconds:g} s of beat at {args.tick:g} s ticks: about "
        f"{here:.0f} periodic tasks ({args.runs} runs followed on {args.targets} targets)"
    )
    print(f"  before beat: {sum(fixed.values())} keys, {memory_fixed / 2**20:.1f} MiB (the "
          f"runs and targets: the baseline); after {args.warm:g} s of beat: "
          f"{sum(before.values())} keys")  # fmt: skip
    for family, count in grown.items():
        print(f"  {family:<36} {before[family]:>7} -> {after[family]:>7} keys ({count:+d})")
    per_task = sum(grown.values()) / here
    growth = memory_after - memory_before
    print(
        f"  used_memory {memory_before / 2**20:.1f} -> {memory_after / 2**20:.1f} MiB "
        f"({growth / 2**20:+.2f} MiB)"
    )
    print(f"  {per_task:.4f} keys per periodic task; a day at the default periods "
          f"({day:.0f} tasks) would add {per_task * day:.0f} keys and "
          f"{growth / here * day / 2**20:.1f} MiB   target 0 keys: "
          f"{'yes' if sum(grown.values()) <= 0 else 'NO'}")  # fmt: skip


if __name__ == "__main__":
    main()
