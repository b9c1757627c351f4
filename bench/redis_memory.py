"""Redis's memory after many chatty runs, against the bound the run store promises.

1,000 runs (`--runs`) each write 100 MiB of log (`--mib-per-run`) through the store's
`Follow.record_tail`, the follow's own write path: one call per 256 KiB read (what one
follow tick reads of a file), round robin over the runs as a busy service follows
them, with a few metrics records each time. The lines have realistic sizes: mostly
log lines of 40-400 bytes (a timestamp, a logger, a step, numbers), and about half
the bytes in progress-bar lines of 8-128 KiB (a progress bar rewriting itself with
`\\r` writes one line until its loop ends), which the store cuts to its line cap;
`--lines long` makes every line a progress bar, the worst case for the byte budget.
Generated once and reused: only sizes and bytes matter here, not what they say.

Printed: Redis's `used_memory` (what maxmemory counts) and RSS, before the runs wrote
anything (the runs' records: the fixed part) and after all of them wrote, and the
bound: fixed part + runs x (log budget + metrics budget), with the ratio. The
budgets count each entry's bytes plus `store.streams.ENTRY_OVERHEAD_BYTES`; Redis's
stream nodes and its allocator's size classes make the real memory differ from that
by a few percent (up to 25 % for lines just above a size class: see
`store.streams`).

The server is private and runs without persistence (AOF off: 100 GB of appends would
be written to disk; with AOF on, Redis rewrites the file when it doubles, so it
stays within about twice the data set).

    .venv/bin/python bench/redis_memory.py                 # 1,000 x 100 MiB
    .venv/bin/python bench/redis_memory.py --lines long    # every line at the cap
    .venv/bin/python bench/redis_memory.py --runs 20 --mib-per-run 10
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.harness.redis_server import RedisServer  # noqa: E402
from schemas import JobId, RunRecord, RunState, Settings  # noqa: E402
from schemas.text import format_bytes  # noqa: E402
from store import LOG_CAP, METRICS_CAP, Offsets, RunStore  # noqa: E402
from store.steps import end_run  # noqa: E402

CHUNK = 256 * 1024
"""Bytes of log one `Follow.record_tail` carries: what one follow tick reads of a file."""
VARIANTS = 64
"""Distinct chunks generated; the runs cycle through them."""
MIB = 1024 * 1024


class VolatileRedis(RedisServer):
    """The tests' private redis-server without persistence (see the module docstring)."""

    def argv(self) -> list[str]:
        return [*super().argv(), "--appendonly", "no"]


def short_line(rng: random.Random, step: int) -> str:
    """A log line of 40-400 bytes, as a training script's logger writes them."""
    size = int(min(400, max(40, rng.lognormvariate(4.8, 0.5))))
    head = (
        f"2026-01-02 03:{step // 60 % 60:02d}:{step % 60:02d},{rng.randrange(1000):03d} "
        f"INFO trainer: step {step}/100000 loss={rng.uniform(0.5, 3):.4f} "
        f"lr={rng.uniform(1e-5, 1e-3):.2e} grad_norm={rng.uniform(0, 2):.3f}"
    )
    words = " tokens/s=12345.6 mem=23.4GiB eta=01:23:45 epoch=3 batch=256 warn=none"
    line = head
    while len(line) < size:
        line += words
    return line[:size]


def progress_line(rng: random.Random) -> str:
    """A progress bar that rewrote itself with `\\r` for 8-128 KiB before its newline."""
    size = rng.randint(8 * 1024, 128 * 1024)
    parts = []
    total = 0
    n = 0
    while total < size:
        n += 1
        bar = "█" * (n % 10) + " " * (10 - n % 10)
        rate = rng.uniform(50, 150)
        part = f"\r{n % 100:3d}%|{bar}| {n}/10000 [00:{n % 60:02d}<01:28, {rate:.2f}it/s]"
        parts.append(part)
        total += len(part.encode())
    return "".join(parts)


def chunk(rng: random.Random, first_step: int, long_share: float) -> tuple[list[str], int]:
    """Lines that make one 256 KiB read, and its exact size in bytes (newlines in);
    `long_share` of the lines are progress bars."""
    lines: list[str] = []
    size = 0
    step = first_step
    while size < CHUNK:
        line = progress_line(rng) if rng.random() < long_share else short_line(rng, step)
        step += 1
        lines.append(line)
        size += len(line.encode()) + 1
    return lines, size


def metrics(rng: random.Random, step: int) -> list[dict[str, Any]]:
    return [
        {"event": "log", "time": 1.0 * s, "step": s, "loss": rng.uniform(0.5, 3),
         "lr": 1e-4, "grad_norm": rng.uniform(0, 2)}
        for s in range(step, step + 5)
    ]  # fmt: skip


def used(client: Any) -> tuple[int, int]:
    """Redis's `used_memory` and `used_memory_rss`, in bytes."""
    info = client.info("memory")
    return int(info["used_memory"]), int(info["used_memory_rss"])


def arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=1000)
    parser.add_argument("--mib-per-run", type=float, default=100.0)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--lines",
        choices=["realistic", "long"],
        default="realistic",
        help="realistic: about half the bytes in progress bars (1 line in 250, against "
        "about 150 bytes a log line); long: every line a progress bar, the worst case "
        "for the byte budget (each entry at the line cap)",
    )
    parser.add_argument("--tiny", action="store_true", help="the smoke test's run: least of all")
    args = parser.parse_args()
    if args.tiny:
        args.runs, args.mib_per_run = 3, 0.25
    return args


def create_runs(store: RunStore, count: int) -> list[str]:
    """`count` running, followed runs; their ids."""
    ids = [f"bench-{i:05d}" for i in range(count)]
    now = datetime.now(UTC)
    for run_id in ids:
        record = RunRecord(
            id=run_id, target="local", created=now, remote_dir=f"/work/{run_id}",
            state=RunState.RUNNING, job=JobId(dir=f"/work/{run_id}", pid=4242),
        )  # fmt: skip
        store.runs.create(record)
        store.follow.add(run_id)
    return ids


def feed(
    store: RunStore,
    ids: list[str],
    variants: list[tuple[list[str], int]],
    reads: int,
    rng: random.Random,
) -> tuple[int, float]:
    """`reads` reads of each run, round robin, through `Follow.record_tail`; the bytes of log
    written and the seconds it took."""
    offsets = {run_id: Offsets(0, 0) for run_id in ids}
    started = time.monotonic()
    written = 0
    for tick in range(reads):
        for index, run_id in enumerate(ids):
            lines, size = variants[(index * 7 + tick) % VARIANTS]
            before = offsets[run_id]
            after = Offsets(before.log + size, before.metrics + 5 * 150)
            if not store.follow.record_tail(run_id, lines=lines, records=metrics(rng, tick * 5),
                                     from_offsets=before, to_offsets=after):  # fmt: skip
                raise SystemExit(f"record_tail refused {run_id} at {before}")
            offsets[run_id] = after
            written += size
        if tick % 10 == 9 or tick == reads - 1:
            elapsed = time.monotonic() - started
            print(f"  {tick + 1}/{reads} reads a run: {format_bytes(written)} written, "
                  f"used_memory {format_bytes(used(store.client)[0])}, "
                  f"{written / elapsed / MIB:.0f} MiB/s", flush=True)  # fmt: skip
    return written, time.monotonic() - started


def main() -> None:
    args = arguments()
    settings = Settings()
    rng = random.Random(args.seed)  # noqa: S311 - sizes for a benchmark, nothing secret
    long_share = 0.004 if args.lines == "realistic" else 1.0
    variants = [chunk(rng, i * 1000, long_share) for i in range(VARIANTS)]
    per_chunk = sum(size for _, size in variants) / VARIANTS
    lines_per_chunk = sum(len(lines) for lines, _ in variants) / VARIANTS
    reads = max(1, round(args.mib_per_run * MIB / per_chunk))
    print(f"{args.runs} runs x {reads} reads of {format_bytes(per_chunk)} "
          f"({lines_per_chunk:.0f} lines each, {format_bytes(per_chunk / lines_per_chunk)} "
          f"a line on average) = {format_bytes(reads * per_chunk)} of log a run; "
          f"budgets a run: log {format_bytes(settings.log_bytes_per_run)}, metrics "
          f"{format_bytes(settings.metrics_bytes_per_run)}, line cap "
          f"{settings.log_line_bytes} bytes, entry caps {LOG_CAP} and {METRICS_CAP}")  # fmt: skip

    with tempfile.TemporaryDirectory(prefix="rw-bench-redis-") as tmp:
        server = VolatileRedis(Path(tmp) / "redis")
        server.start()
        try:
            client = server.client(socket_timeout=60)
            store = RunStore(
                client,
                line_bytes=settings.log_line_bytes,
                log_bytes=settings.log_bytes_per_run,
                metrics_bytes=settings.metrics_bytes_per_run,
                retention_s=settings.retention_s,
            )
            empty, _ = used(client)
            ids = create_runs(store, args.runs)
            fixed, _ = used(client)
            written, elapsed = feed(store, ids, variants, reads, rng)
            full, full_rss = used(client)
            for run_id in ids:
                end_run(store, run_id, RunState.SUCCEEDED)
            ended, ended_rss = used(client)
            held = [store.follow.stream_bytes(run_id) for run_id in ids]
            client.close()
        finally:
            server.stop()

    counted = sum(h.log + h.metrics for h in held)
    budget = settings.log_bytes_per_run + settings.metrics_bytes_per_run
    bound = fixed + args.runs * budget
    figure = max(full, ended)
    print(f"written: {format_bytes(written)} of log in {elapsed:.0f} s "
          f"({written / elapsed / MIB:.0f} MiB/s)")  # fmt: skip
    print(f"used_memory, empty server:           {format_bytes(empty)}")
    print(f"used_memory, the runs' records:      {format_bytes(fixed)} "
          f"({(fixed - empty) / args.runs:.0f} bytes a run)")  # fmt: skip
    print(f"held by the streams, as counted:     log {format_bytes(sum(h.log for h in held))},"
          f" metrics {format_bytes(sum(h.metrics for h in held))}")  # fmt: skip
    print(f"used_memory after the writes:        {full} bytes = {format_bytes(full)} "
          f"(RSS {format_bytes(full_rss)})")  # fmt: skip
    print(f"used_memory after the runs ended:    {ended} bytes = {format_bytes(ended)} "
          f"(RSS {format_bytes(ended_rss)})")  # fmt: skip
    print(f"bound = records + runs x (log + metrics budget) = {format_bytes(fixed)} + "
          f"{args.runs} x {format_bytes(budget)} = {bound} bytes = {format_bytes(bound)}")
    print(f"ratio used_memory / bound: {figure / bound:.3f}")
    print(f"streams in Redis / counted: {format_bytes((figure - fixed) / args.runs)} / "
          f"{format_bytes(counted / args.runs)} a run ({(figure - fixed) / max(1, counted):.3f}x)")


if __name__ == "__main__":
    main()
