"""The command line's start-up cost: the median CPU time (user + system, of the child
process) of `runwarden --help`, `runwarden show --help` and `runwarden show RUN_ID` (a
real run record read from a real Redis), each beside `python -c pass` (the bare
interpreter) as the floor, with the ratio to it.

    .venv/bin/python bench/cli_startup.py            # 7 runs of each, median
    .venv/bin/python bench/cli_startup.py --runs 1   # a smoke run

Needs `redis-server` on PATH (started here on a unix socket in a temporary directory).
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RUN_ID = "20260601-020000-bench"


def _cpu_s(argv: list[str], env: dict[str, str]) -> float:
    """CPU seconds (user + system) of one run of `argv`; it must exit 0."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    done = subprocess.run(argv, env=env, capture_output=True, timeout=60, check=False)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise SystemExit(f"{argv} exited {done.returncode}: {done.stderr.decode()[-500:]}")
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def _runwarden() -> list[str]:
    script = Path(sys.executable).parent / "runwarden"
    return [str(script)] if script.is_file() else [sys.executable, "-m", "producers.cli"]


def _redis(directory: Path) -> tuple[subprocess.Popen[bytes], Path]:
    binary = shutil.which("redis-server")
    if binary is None:
        raise SystemExit("no redis-server on PATH")
    socket = directory / "redis.sock"
    server = subprocess.Popen(
        [binary, "--port", "0", "--unixsocket", str(socket), "--save", "", "--appendonly",
         "no", "--dir", str(directory)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    deadline = time.monotonic() + 10
    while not socket.exists():
        if time.monotonic() > deadline or server.poll() is not None:
            server.kill()
            raise SystemExit("redis-server did not start")
        time.sleep(0.02)
    return server, socket


def _seed(env: dict[str, str]) -> None:
    """Stores one run record, as a launch would, for `show` to read."""
    sys.path.insert(0, str(ROOT))
    os.environ.update(env)
    from schemas import RunRecord, Settings
    from store import RunStore

    store = RunStore.from_settings(Settings())
    record = RunRecord(id=RUN_ID, target="local", created=datetime.now(UTC),
                       remote_dir=f"/runs/{RUN_ID}")  # fmt: skip
    store.runs.create(record)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=7, help="runs of each command (median)")
    parser.add_argument("--tiny", action="store_true", help="the smoke test's run: least of all")
    args = parser.parse_args()
    runs = 1 if args.tiny else args.runs
    with tempfile.TemporaryDirectory(prefix="rw-cli-bench-") as tmp:
        server, socket = _redis(Path(tmp))
        try:
            env = {**os.environ, "RUNWARDEN_REDIS_URL": f"unix://{socket}",
                   "RUNWARDEN_STATE_DIR": str(Path(tmp) / "state"), "COLUMNS": "100"}  # fmt: skip
            _seed(env)
            cli = _runwarden()
            cases = {
                "python -c pass": [sys.executable, "-c", "pass"],
                "runwarden --help": [*cli, "--help"],
                "runwarden show --help": [*cli, "show", "--help"],
                f"runwarden show {RUN_ID}": [*cli, "show", RUN_ID],
            }
            medians = {
                name: statistics.median(_cpu_s(argv, env) for _ in range(runs))
                for name, argv in cases.items()
            }
        finally:
            server.kill()
            server.wait()
    floor = medians["python -c pass"]
    print(f"CPU time (user + system), median of {runs} run(s):")
    for name, seconds in medians.items():
        print(f"  {name:40} {seconds:6.3f} s  {seconds / max(floor, 1e-6):5.1f}x the floor")


if __name__ == "__main__":
    main()
