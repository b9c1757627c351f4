"""How far behind a job's log the recorded log (the run's log stream in Redis) is,
for a job writing about 1 MB/s, at the default follow period (5 s) and at 1 s, with
the default log budget (4 MiB a run). The baseline is the job itself: each line
carries the time it was written, so the lag is now minus the time of the newest
line recorded; after the job stops writing, how long until its last line is
recorded (or how far behind the follow still is after `--wait` seconds).

    .venv/bin/python -m workers.reaper -- .venv/bin/python bench/follow_lag.py
    .venv/bin/python -m workers.reaper -- .venv/bin/python bench/follow_lag.py --seconds 60
"""

from __future__ import annotations

import argparse
import shlex
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.harness.pipeline import running_pipeline  # noqa: E402
from schemas.events import LaunchSpec  # noqa: E402

JOB = """
import sys, time
line, i, start = 'x' * 80, 0, time.monotonic()
while time.monotonic() - start < {seconds}:
    began = time.monotonic()
    now = time.time()
    sys.stdout.write(''.join(f'{{i + k:08d}} {{now:.3f}} {{line}}\\n' for k in range(1000)))
    sys.stdout.flush()
    i += 1000
    time.sleep(max(0.0, 0.1 - (time.monotonic() - began)))
print('last line', flush=True)
time.sleep(3600)
"""
"""About 1.07 MB/s: 1,000 lines of 107 bytes every 0.1 s, each with its time."""


def measure(tmp: Path, period_s: float, seconds: float, wait_s: float) -> None:
    env = {"RUNWARDEN_FOLLOW_POLL_S": str(period_s)}
    with running_pipeline(tmp, extra_env=env) as pipeline:
        store = pipeline.api.store
        script = JOB.format(seconds=seconds)
        command = f"exec {shlex.quote(sys.executable)} -u -c {shlex.quote(script)}"
        run = pipeline.api.launch(LaunchSpec(target="local", command=command), wait_s=60)
        log = Path(run.remote_dir) / "job.log"
        lags: list[float] = []
        behind: list[int] = []
        started = time.monotonic()
        while time.monotonic() - started < seconds:
            newest = store.follow.read_log_newest(run.id, count=1)
            words = newest[0].line.split() if newest else []
            if len(words) == 3:  # a line of the job's: index, time, filler
                lags.append(time.time() - float(words[1]))
            if log.exists():
                behind.append(log.stat().st_size - store.follow.offsets(run.id).log)
            time.sleep(0.25)
        size = log.stat().st_size
        stopped = time.monotonic()
        caught = None
        while time.monotonic() - stopped < wait_s:
            newest = store.follow.read_log_newest(run.id, count=1)
            if newest and newest[0].line == "last line":
                caught = time.monotonic() - stopped
                break
            time.sleep(0.1)
        left = log.stat().st_size - store.follow.offsets(run.id).log
        held = store.follow.stream_bytes(run.id).log
        ended = pipeline.api.get_run(run.id)
        if ended.state.is_terminal:
            print(f"   the job ended early: {ended.state} {ended.message}")
        else:
            pipeline.api.cancel(run.id)
    late = sorted(lags) or [float("nan")]
    print(f"== follow period {period_s:g} s: {size / seconds / 1e6:.2f} MB/s for {seconds:g} s")
    print(f"   recorded log behind the job: median {statistics.median(late):.1f} s, "
          f"p95 {late[int(0.95 * (len(late) - 1))]:.1f} s, max {late[-1]:.1f} s "
          f"(max {max(behind or [0]) / 1e6:.1f} MB of job.log unread)")  # fmt: skip
    if caught is not None:
        print(f"   its last line recorded {caught:.1f} s after the job stopped writing")
    else:
        print(f"   not caught up {wait_s:g} s after the job stopped: {left / 1e6:.1f} MB unread")
    print(f"   held in Redis: {held / 1024:.0f} KiB (the budget: 4096 KiB)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=30.0, help="how long the job writes")
    parser.add_argument("--wait", type=float, default=60.0, help="most seconds to wait after")
    parser.add_argument("--periods", default="5,1", help="follow periods to measure, in s")
    parser.add_argument("--tiny", action="store_true", help="the smoke test's run: least of all")
    args = parser.parse_args()
    if args.tiny:
        args.seconds, args.wait, args.periods = 3.0, 30.0, "1"
    with tempfile.TemporaryDirectory(prefix="rw-follow-lag-") as tmp:
        for i, period in enumerate(float(p) for p in args.periods.split(",")):
            measure(Path(tmp) / str(i), period, args.seconds, args.wait)


if __name__ == "__main__":
    main()
