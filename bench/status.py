"""`runwarden status`'s figures, each beside its baseline in the same run:

1. detection: from a SIGKILL of the worker (then of beat) to the first report that
   is not ok, polled every 50 ms in this process, beside the heartbeat's time to
   live (the bound it rests on), over several rounds; and from the restart to ok;
2. one reading (`producers.health.read_health`) on a healthy service, beside a
   bare Redis PING on the same socket as the floor;
3. the `runwarden status` subprocess, beside `runwarden --help` (the interpreter
   and the CLI's imports) as the floor.

    .venv/bin/python -m workers.reaper -- .venv/bin/python bench/status.py
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench._timing import median_s, ms  # noqa: E402
from bench.harness.pipeline import Pipeline, running_pipeline  # noqa: E402
from producers.health import read_health  # noqa: E402
from schemas.health import HEARTBEAT_TTL_S  # noqa: E402


def _until(ok: bool, pipeline: Pipeline, timeout_s: float = 120.0) -> float:
    """Polls the report every 50 ms until its `ok` is `ok`; returns when (monotonic)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if read_health(pipeline.api.settings).ok is ok:
            return time.monotonic()
        time.sleep(0.05)
    raise SystemExit(f"the report never became ok={ok} in {timeout_s} s\n{pipeline.logs()}")


def _rounds(
    name: str, pipeline: Pipeline, kill: Callable[[], object], start: Callable[[], object], n: int
) -> None:
    down, up = [], []
    for _ in range(n):
        _until(True, pipeline)
        killed = time.monotonic()
        kill()
        down.append(_until(False, pipeline) - killed)
        started = time.monotonic()
        start()
        up.append(_until(True, pipeline) - started)
    print(
        f"   {name}: seen down after the SIGKILL in median {statistics.median(down):.2f} s, "
        f"max {max(down):.2f} s (time to live {HEARTBEAT_TTL_S:g} s); "
        f"up after the restart in median {statistics.median(up):.1f} s"
    )


def _cli(pipeline: Pipeline, *args: str) -> float:
    started = time.perf_counter()
    subprocess.run(
        [sys.executable, "-m", "producers.cli", *args],
        cwd=ROOT, env=pipeline.env, capture_output=True, check=False, timeout=120,
    )  # fmt: skip
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--tiny", action="store_true", help="the smoke test's run: least of all")
    args = parser.parse_args()
    readings, commands = 50, 3
    if args.tiny:
        args.rounds, readings, commands = 1, 5, 1
    with tempfile.TemporaryDirectory() as tmp, running_pipeline(Path(tmp)) as pipeline:
        print("== 1. detection of a SIGKILL (polled every 50 ms)")
        _rounds("worker", pipeline, lambda: pipeline.kill_worker("w1"),
                lambda: pipeline.start_worker("w1"), args.rounds)  # fmt: skip
        _rounds("beat", pipeline, pipeline.kill_beat, pipeline.start_beat, args.rounds)
        print("== 2. one reading on a healthy service")
        _until(True, pipeline)
        client = pipeline.redis.client()
        floor = median_s(client.ping, repeat=200)
        reading = median_s(lambda: read_health(pipeline.api.settings), repeat=readings, warmup=3)
        print(f"   read_health {ms(reading)}  vs  PING {ms(floor)}")
        client.close()
        print(f"== 3. the command as a subprocess (median of {commands})")
        help_s = statistics.median(_cli(pipeline, "--help") for _ in range(commands))
        status_s = statistics.median(_cli(pipeline, "status") for _ in range(commands))
        print(f"   runwarden status {status_s:.2f} s  vs  runwarden --help {help_s:.2f} s")


if __name__ == "__main__":
    main()
