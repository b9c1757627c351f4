"""How late a stop's cancel comes after it was due, through the real service: Redis,
Celery workers (the follow ticks on a worker of their own, as `runwarden serve` lays
them out) and beat (bench/harness/pipeline.py), real jobs on the local target.

    .venv/bin/python bench/stop_timing.py [--runs 20] [--follow 1.0] [--batch 5] [--spacing 1.0]

The workers are laid out as `runwarden serve` lays them out (its defaults): the main
worker (2 processes: launches, stops, deadlines, cancels), the retrieval worker (1)
and the watch worker (2: the follow ticks). Two kinds of runs, `--runs` of each,
stopped with short timeouts, `--batch` of each kind running at once, their stops
asked `--spacing` seconds apart (0: all at once, a storm of cancels due together,
queued on the main worker's two processes):

- prove-then-hang (the toy trainer's `--hang-after-proof`: the end of a distributed
  training whose teardown never returns after the save): due when its end timeout
  has passed since its proof (the proof's own `time` + end timeout). The follow
  must see the proof for this to hold: counted from the proof deadline, the cancel
  would be the proof timeout late;
- deaf (`--ignore-requests`: never proves): due at its proof deadline (asked_at +
  proof timeout).

Per run it takes the cancel's lateness: the ledger's `cancel_decided` time minus the
due time (the workers' clock; the same machine as the job's), and, for information,
when the job's group was gone (`job_cancelled`). Baseline, in the same run: the
follow period (`--follow`), which bounds how long a proof waits to be seen.

Target: p95 lateness <= follow period + 2 s, for each kind.
"""

from __future__ import annotations

import argparse
import json
import secrets
import shutil
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.harness.pipeline import Pipeline, running_pipeline, toy  # noqa: E402
from schemas import RunLimits, RunRecord  # noqa: E402
from schemas.budget import StopTimeouts  # noqa: E402
from schemas.events import DEFAULT_QUEUE, QUEUE, LaunchSpec  # noqa: E402
from schemas.ledger import CancelDecided, JobCancelled, LedgerEvent, StopOpened  # noqa: E402
from workers.reaper import become_subreaper  # noqa: E402

PROOF_S = {"hang": 30.0, "deaf": 4.0}
"""Each kind's proof timeout, in seconds: a prove-then-hang run's is long, so a cancel
counted from its proof deadline would stand out."""
END_S = 3.0
"""Every run's end timeout, in seconds."""


def percentile(samples: list[float], q: int) -> float:
    if len(samples) < 2:
        return samples[0]
    return statistics.quantiles(samples, n=100, method="inclusive")[q - 1]


NAME = f"stoptiming-{secrets.token_hex(3)}"
"""The runs' name: their ids unique to this bench (another service on this machine
may start runs in the same second, and a cancel sweeps the processes of its run's id)."""


def launch(pipeline: Pipeline, kind: str) -> RunRecord:
    flag = "--hang-after-proof" if kind == "hang" else "--ignore-requests"
    spec = LaunchSpec(
        target="local",
        name=f"{NAME}-{kind}",
        command=toy("--steps", "100000", "--step-time", "0.05", flag),
        limits=RunLimits(disk=False),
        timeouts=StopTimeouts(proof_timeout_s=PROOF_S[kind], end_timeout_s=END_S),
    )
    return pipeline.api.launch(spec, wait_s=120)


def ledger_once(pipeline: Pipeline, run_id: str, kind: str, timeout_s: float) -> list[LedgerEvent]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        events = pipeline.api.ledger(run_id)
        if any(e.kind == kind for e in events):
            return events
        time.sleep(0.1)
    raise RuntimeError(f"run {run_id}: no {kind} in its ledger\n{pipeline.logs()}")


def due_of(run: RunRecord, kind: str, events: list[LedgerEvent]) -> datetime:
    """When the run's cancel was due: its proof's own time + the end timeout (read from
    the job's `snapshot.json`), or its proof deadline."""
    if kind == "hang":
        written = json.loads((Path(run.remote_dir) / "snapshot.json").read_text())["time"]
        return datetime.fromtimestamp(written, UTC) + timedelta(seconds=END_S)
    [opened] = [e for e in events if isinstance(e, StopOpened)]
    return opened.proof_deadline


def one_batch(
    pipeline: Pipeline, size: int, spacing_s: float, disturbed: list[str]
) -> dict[str, list[tuple[float, float]]]:
    """`size` runs of each kind at once; per kind, each cancel's lateness and the
    job's end after its due time, in seconds. A run that did not get as far as its
    stop, or ended otherwise (something else on this shared machine killed it), is
    added to `disturbed`, with why, and left out."""
    api = pipeline.api
    runs = [(kind, launch(pipeline, kind)) for _ in range(size) for kind in ("hang", "deaf")]
    asked: list[tuple[str, RunRecord]] = []
    for kind, run in runs:
        try:
            pipeline.wait_step(run.id, 2, timeout_s=60)
            if asked:
                time.sleep(spacing_s)
            api.stop(run.id, asked_by="bench")
        except Exception as error:  # noqa: BLE001 - told, and left out of the figures
            disturbed.append(f"{run.id} ({kind}): not stopped: {str(error).splitlines()[0]}")
            continue
        asked.append((kind, run))
    found: dict[str, list[tuple[float, float]]] = {"hang": [], "deaf": []}
    for kind, run in asked:
        wait_s = PROOF_S[kind] + END_S + 60
        try:
            events = ledger_once(pipeline, run.id, "job_cancelled", wait_s)
        except RuntimeError:
            disturbed.append(f"{run.id} ({kind}): {api.get_run(run.id).message}")
            continue
        [cancel] = [e for e in events if isinstance(e, CancelDecided)]
        want = "end_timeout" if kind == "hang" else "proof_timeout"
        if cancel.cause != want:
            disturbed.append(f"{run.id} ({kind}): cancelled for {cancel.cause}")
            continue
        gone = next(e for e in events if isinstance(e, JobCancelled))
        due = due_of(api.get_run(run.id), kind, events)
        found[kind].append(
            ((cancel.at - due).total_seconds(), (gone.at - due).total_seconds())
        )
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20, help="runs of each kind (20)")
    parser.add_argument("--follow", type=float, default=1.0, help="follow period, s (1.0)")
    parser.add_argument("--batch", type=int, default=5, help="runs of each kind at once (5)")
    parser.add_argument(
        "--spacing", type=float, default=1.0, help="seconds between two stops (1.0; 0: a storm)"
    )
    parser.add_argument("--tiny", action="store_true", help="the smoke test's run: least of all")
    args = parser.parse_args()
    if args.tiny:
        args.runs, args.batch = 1, 1
    become_subreaper()  # the jobs' orphans come here, and are reaped
    tmp = Path(tempfile.mkdtemp(prefix="rw-bench-stop-timing-"))
    extra = {"RUNWARDEN_FOLLOW_POLL_S": str(args.follow)}
    results: dict[str, list[tuple[float, float]]] = {"hang": [], "deaf": []}
    disturbed: list[str] = []
    started = time.monotonic()
    with running_pipeline(tmp, workers=0, extra_env=extra, watch_worker=True) as pipeline:
        # As `runwarden serve` lays them out (the retrievals' worker is the pipeline's).
        pipeline.start_worker("main", 2, queues=f"{QUEUE},{DEFAULT_QUEUE}")
        for name in ("main", "retrieve"):
            pipeline.wait_worker(name, 60)
        try:
            left = args.runs
            while left > 0:
                size = min(args.batch, left)
                for kind, samples in one_batch(pipeline, size, args.spacing, disturbed).items():
                    results[kind].extend(samples)
                left -= size
        finally:
            pipeline.kill_jobs()
    shutil.rmtree(tmp, ignore_errors=True)  # our own temporary directory
    target = args.follow + 2.0
    print(
        f"local target, follow period {args.follow:g} s, end timeout {END_S:g} s, "
        f"{args.runs} runs of each kind, {args.batch} of each at once, stops "
        f"{args.spacing:g} s apart ({time.monotonic() - started:.0f} s)"
    )
    print(f"{'kind':16} {'due':26} {'median':>8} {'p95':>8} {'max':>8} "
          f"{'p95 gone':>9}  target p95 <= {target:g} s")  # fmt: skip
    met = True
    for kind, due in (("hang", "proof time + end timeout"), ("deaf", "asked_at + proof timeout")):
        late = [s[0] for s in results[kind]]
        if not late:
            print(f"{kind}: no run measured")
            met = False
            continue
        gone = [s[1] for s in results[kind]]
        p95 = percentile(late, 95)
        ok = p95 <= target
        met = met and ok
        name = "prove-then-hang" if kind == "hang" else "deaf"
        print(
            f"{name:16} {due:26} {statistics.median(late):7.2f}s {p95:7.2f}s "
            f"{max(late):7.2f}s {percentile(gone, 95):8.2f}s  {'met' if ok else 'NOT met'}"
        )
        print("  each cancel's lateness, s: " + " ".join(f"{s:.2f}" for s in late))
    for line in disturbed:
        print(f"left out, disturbed: {line}")
    print(f"target (p95 <= follow period + 2 s): {'met' if met else 'NOT met'}")


if __name__ == "__main__":
    main()
