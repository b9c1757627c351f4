"""The pipeline's three figures, each beside its baseline in the same run:

1. stop latency: from the producer's call to `snapshot.request` on a local target,
   warm worker, beside a bare Celery round trip (a task that does nothing) as the
   floor;
2. one poll tick over 1,000 followed runs on 10 SSH targets (one sshd, ten
   workdirs): SSH commands counted and time measured, beside polling each run with
   its own command;
3. the worker's peak RSS with 1,000 followed runs and 1,000 pending countdowns;
4. a bulk stop of 1,000 runs on 10 local targets (`Runwarden.stop_many`, one
   `runwarden.stop_many` task): from the call to every run's `snapshot.request` on
   its target, beside one `Runwarden.stop` per run (each awaited, as a loop over
   `runwarden stop` would be, without the CLI's start-up) over the same number of runs.
   The runs are registered in the store as running, their job one shared `sleep`
   process group (not 1,000 trainers): what is measured is the stop's own path (the
   stops opened with their deadlines, the countdowns sent, the ledger, the request
   files written), not a job's reaction to it.

    .venv/bin/python -m workers.reaper -- .venv/bin/python bench/pipeline.py

The stops and countdowns are signed as the workers require (the operator's key for a
stop, the workers' for a deadline: `bench.harness.pipeline.signed`), and every wait
has a deadline: a stop that never reaches the target ends the bench with the
workers' logs, it does not hang. `--tiny` is the smoke test's run
(tests/integration/bench/).
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench._timing import ms  # noqa: E402
from bench.harness.pipeline import (  # noqa: E402
    Pipeline,
    put_signed_target,
    running_pipeline,
    signed,
    toy,
)
from bench.harness.sshd import running_sshd  # noqa: E402
from bench.harness.users import as_the_worker  # noqa: E402
from schemas import JobId, RunRecord, RunState, SshOptions, TargetConfig  # noqa: E402
from schemas.auth import new_task_id  # noqa: E402
from schemas.events import LaunchSpec  # noqa: E402
from workers import watch  # noqa: E402
from workers.context import Context  # noqa: E402
from workers.executors import FollowEntry  # noqa: E402
from workers.executors.ssh import SshTransport  # noqa: E402

STOP_DEADLINE_S = 30.0
"""How long a stop may take to reach the target before the bench gives up."""


def wait_file(path: Path, pipeline: Pipeline, deadline_s: float = STOP_DEADLINE_S) -> None:
    """Returns as soon as `path` exists; ends the bench with the workers' logs when it
    does not within `deadline_s`."""
    deadline = time.perf_counter() + deadline_s
    while not path.exists():
        if time.perf_counter() > deadline:
            raise SystemExit(f"{path} never appeared in {deadline_s:g} s\n{pipeline.logs()}")
        time.sleep(0.0002)


def stop_latency(tmp: Path, runs: int, rounds: int) -> None:
    print("== 1. stop latency (local target, warm worker)")
    with running_pipeline(tmp / "p1", beat=False) as pipeline:
        api = pipeline.api
        floor = []
        for _ in range(rounds):
            started = time.perf_counter()
            api.app.send_task("runwarden.reconcile").get(timeout=30)
            floor.append(time.perf_counter() - started)
        ids = [
            api.launch(
                LaunchSpec(target="local", command=toy("--steps", "100000", "--ignore-requests"))
            ).id
            for _ in range(runs)
        ]
        samples = []
        for run_id in ids:
            request = Path(api.get_run(run_id).remote_dir) / "snapshot.request"
            task = "runwarden.snapshot_request"
            task_id = new_task_id()
            kwargs = signed(api.settings, task, {"run_id": run_id}, task_id=task_id)
            started = time.perf_counter()
            api.app.send_task(task, kwargs=kwargs, task_id=task_id)  # as a producer sends
            wait_file(request, pipeline)
            samples.append(time.perf_counter() - started)
        for run_id in ids:
            api.cancel(run_id)
    lat, base = statistics.median(samples), statistics.median(floor)
    print(f"  celery round trip (floor)   {ms(base)}   (median of {rounds})")
    print(
        f"  call -> snapshot.request    {ms(lat)}   (median of {runs} stops)  "
        f"{lat / base:.2f}x the floor   target <= 20 ms: {'yes' if lat <= 0.020 else 'NO'}"
    )


class Counting:
    """Counts the commands sent over SSH (every transport run)."""

    def __init__(self) -> None:
        self.count = 0
        self._lock = threading.Lock()
        self._run = SshTransport.run

        def run(transport: SshTransport, *args: object, **kw: object) -> object:
            with self._lock:
                self.count += 1
            return self._run(transport, *args, **kw)  # type: ignore[arg-type]

        SshTransport.run = run  # type: ignore[method-assign,assignment]


def tick_all(worker: Context, names: list[str], now: datetime) -> None:
    """One follow tick of each target in `names`, all at once, as the workers run them."""
    threads = [threading.Thread(target=watch.watch_target, args=(worker, n, now)) for n in names]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)  # each tick's SSH calls have their own deadlines
        if thread.is_alive():
            raise SystemExit("a watch tick still runs after 120 s")


def per_target_ticks(worker: Context, names: list[str], now: datetime) -> list[float]:
    """The time of one follow tick of each target of `names`, one at a time (s)."""
    took = []
    for name in names:
        started = time.perf_counter()
        watch.watch_target(worker, name, now)
        took.append(time.perf_counter() - started)
    return took


def poll_tick(tmp: Path, targets: int, per_target: int, rounds: int) -> None:
    print(f"== 2. one poll tick over {targets * per_target} runs on {targets} SSH targets")
    import fakeredis

    from schemas.settings import Settings
    from store import RunStore

    with running_sshd(tmp / "sshd") as server:
        store = RunStore(fakeredis.FakeRedis())
        settings = Settings(state_dir=tmp / "state")
        worker = Context(store, settings, lambda *_: None)
        leaders = []
        now = datetime.now(UTC)
        for t in range(targets):
            workdir = tmp / f"target-{t}"
            workdir.mkdir()
            name = f"t{t}"
            put_signed_target(
                store,
                settings,
                TargetConfig(
                    name=name,
                    kind="ssh",
                    workdir=str(workdir),
                    ssh=SshOptions(
                        destination=server.destination,
                        identity=str(server.client_key),
                        known_hosts=str(server.known_hosts),
                    ),
                ).model_dump(mode="json"),
            )
            # One live process group stands for the jobs of a target.
            leader = subprocess.Popen(["sleep", "3600"], start_new_session=True)
            leaders.append(leader)
            for r in range(per_target):
                run_id = f"{name}-run-{r}"
                run_dir = workdir / run_id
                run_dir.mkdir()
                (run_dir / "job.log").write_text("step 1\n")
                store.runs.create(
                    RunRecord(
                        id=run_id,
                        target=name,
                        created=now,
                        remote_dir=str(run_dir),
                        job=JobId(dir=str(run_dir), pid=leader.pid),
                        state=RunState.RUNNING,
                    )
                )
                store.follow.add(run_id)
        names = [f"t{t}" for t in range(targets)]
        for name in names:  # warm: connections open, logs read once
            watch.watch_target(worker, name, now)
        per_target_s = per_target_ticks(worker, names, now)
        counter = Counting()
        batched = []
        for _ in range(rounds):
            counter.count = 0
            started = time.perf_counter()
            tick_all(worker, names, now)
            batched.append(time.perf_counter() - started)
        batched_commands = counter.count
        single = []
        for _ in range(max(1, rounds // 2) if targets * per_target <= 1000 else 1):
            counter.count = 0
            started = time.perf_counter()
            for name in names:
                executor = worker.executor(name)
                for run_id in store.follow.runs(name):
                    run = store.runs.get(run_id)
                    offsets = store.follow.offsets(run_id)
                    assert run.job is not None
                    executor.follow([FollowEntry(run.job, offsets.log, offsets.metrics)])
            single.append(time.perf_counter() - started)
        single_commands = counter.count
        for leader in leaders:
            leader.kill()
            leader.wait()
    b, s = statistics.median(batched), statistics.median(single)
    slowest = max(per_target_s)
    print(
        f"  one target's batch ({per_target} runs): {statistics.median(per_target_s) * 1000:.0f} "
        f"ms median, {slowest * 1000:.0f} ms the slowest of {targets}   target <= 1 s: "
        f"{'yes' if slowest <= 1 else 'NO'}"
    )
    print(
        f"  batched: {batched_commands} SSH commands, tick {b * 1000:.0f} ms (median of {rounds})"
    )
    print(f"  one command per run: {single_commands} SSH commands, tick {s * 1000:.0f} ms")
    print(
        f"  batched is {s / b:.1f}x faster   targets >= 20x and tick <= 2 s: "
        f"{'yes' if s / b >= 20 and b <= 2 else 'NO'}"
    )


FAN_OUT_PROCESSES = 4
"""The worker processes the fan-out of a follow tick is measured with."""


def fan_out(tmp: Path, targets: int, per_target: int, rounds: int) -> None:
    """A follow tick's fan-out through a real worker of `FAN_OUT_PROCESSES` processes:
    one `watch_target` task per SSH target (one sshd on loopback, a workdir each),
    from the first sent to the last done, with `per_target` runs on each."""
    print(f"== 2b. a follow tick's fan-out over {targets} SSH targets, {targets * per_target} "
          f"runs, {FAN_OUT_PROCESSES} worker processes")  # fmt: skip
    with (
        running_sshd(tmp / "sshd-fan") as server,
        running_pipeline(tmp / "p2", beat=False, concurrency=FAN_OUT_PROCESSES) as pipeline,
    ):
        api = pipeline.api
        names = [f"f{t}" for t in range(targets)]
        for name in names:
            workdir = pipeline.tmp / name
            workdir.mkdir()
            api.add_target(TargetConfig(
                name=name, kind="ssh", workdir=str(workdir),
                ssh=SshOptions(destination=server.destination, identity=str(server.client_key),
                               known_hosts=str(server.known_hosts)),
            ))  # fmt: skip
        leader = subprocess.Popen(["sleep", "3600"], start_new_session=True)
        try:
            for run in register_runs(pipeline, "fan", names, per_target, leader=leader.pid,
                                     labels={}):  # fmt: skip
                (Path(run.remote_dir) / "job.log").write_text("step 1\n")
                api.store.follow.add(run.id)
            took = []
            for _ in range(rounds + 1):  # the first warms: connections, executors
                started = time.perf_counter()
                results = [api.app.send_task("runwarden.watch_target", kwargs={"target": n},
                                             ignore_result=False) for n in names]  # fmt: skip
                for result in results:
                    result.get(timeout=300)
                took.append(time.perf_counter() - started)
        finally:
            leader.kill()
            leader.wait()
    f = statistics.median(took[1:])
    print(f"  every target's tick done in {f:.2f} s (median of {rounds}; "
          f"{min(took[1:]):.2f}-{max(took[1:]):.2f} s)   target <= 2 s: "
          f"{'yes' if f <= 2 else 'NO'}")  # fmt: skip


def _tree(pid: int) -> list[int]:
    """`pid` and all its descendants."""
    found, todo = [], [pid]
    while todo:
        current = todo.pop()
        found.append(current)
        try:
            children = Path(f"/proc/{current}/task/{current}/children").read_text().split()
        except FileNotFoundError:
            continue
        todo.extend(int(c) for c in children)
    return found


def memory_mib(pid: int) -> tuple[float, float, int]:
    """The PSS (shared pages counted once: divided between the processes sharing
    them) and the RSS of `pid` and all its descendants, in MiB, now; and how many
    processes that is."""
    pss = rss = 0
    tree = _tree(pid)
    for current in tree:
        try:
            rollup = Path(f"/proc/{current}/smaps_rollup").read_text()
        except FileNotFoundError:
            continue
        for line in rollup.splitlines():
            if line.startswith("Pss:"):
                pss += int(line.split()[1])
            elif line.startswith("Rss:"):
                rss += int(line.split()[1])
    return pss / 1024, rss / 1024, len(tree)


def worker_memory(tmp: Path, runs: int, targets: int) -> None:
    """The worker (main and pool processes) idle, then following `runs` runs on
    `targets` local targets, each run with a stop open: its proof and end deadlines
    pending, opened by one bulk stop as the service opens them (proof timeouts of an
    hour: beyond the countdown horizon, so they wait in the deadline table; the
    countdowns the worker holds are counted)."""
    print(f"== 3. worker memory with {runs} followed runs on {targets} targets and "
          f"{runs} pending deadlines")  # fmt: skip
    slow = {"RUNWARDEN_PROOF_TIMEOUT_S": "3600", "RUNWARDEN_END_TIMEOUT_S": "3600"}
    with running_pipeline(tmp / "p3", beat=False, extra_env=slow) as pipeline:
        api, store = pipeline.api, pipeline.api.store
        worker = pipeline.workers["w1"]
        names = [f"m{t}" for t in range(targets)]
        for name in names:
            (pipeline.tmp / name).mkdir()
            api.add_target(TargetConfig(name=name, kind="local", workdir=str(pipeline.tmp / name),
                                        **as_the_worker()))  # fmt: skip
        for name in names:  # each target's executor built, its code loaded
            api.app.send_task("runwarden.watch_target", kwargs={"target": name}).get(timeout=60)
        time.sleep(1)
        idle = memory_mib(worker.pid)
        leader = subprocess.Popen(["sleep", "3600"], start_new_session=True)
        try:
            per_target = max(1, runs // targets)
            loaded_runs = register_runs(pipeline, "mem", names, per_target, leader=leader.pid,
                                        labels={"bench": "memory"})  # fmt: skip
            for run in loaded_runs:
                store.follow.add(run.id)
            summary = api.stop_many(names, labels={"bench": "memory"}, wait_s=600)
            pending = len(store.stops.pending_deadlines(limit=10 * runs))
            for _ in range(3):  # ticks over every run of every target
                for name in names:
                    api.app.send_task("runwarden.watch_target", kwargs={"target": name}).get(
                        timeout=300
                    )
            time.sleep(1)
            loaded = memory_mib(worker.pid)
            parts = [memory_mib(pid)[:2] for pid in _tree(worker.pid)]
            reserved = api.app.control.inspect(timeout=2).scheduled() or {}
            held = sum(len(v) for v in reserved.values())
        finally:
            leader.kill()
            leader.wait()
    print(f"  stops opened: {len(summary.asked)}; deadlines pending: {pending}; "
          f"countdown tasks held by the worker: {held}")  # fmt: skip
    print(f"  worker ({idle[2]} processes: reaper, main, pool) PSS idle {idle[0]:.0f} MiB, "
          f"loaded {loaded[0]:.0f} MiB (RSS {idle[1]:.0f} -> {loaded[1]:.0f} MiB)   "
          f"target PSS <= 200 MiB: {'yes' if loaded[0] <= 200 else 'NO'}")  # fmt: skip
    # memory_mib of a process counts its descendants: the pool processes are leaves.
    print("  loaded, by process (PSS / RSS MiB): reaper and main "
          f"{parts[0][0] - sum(p[0] for p in parts[2:]):.0f} / "
          f"{parts[0][1] - sum(p[1] for p in parts[2:]):.0f}, pool "
          + ", ".join(f"{p[0]:.0f} / {p[1]:.0f}" for p in parts[2:]))  # fmt: skip


def register_runs(pipeline: Pipeline, prefix: str, targets: list[str], per_target: int,
                  *, leader: int, labels: dict[str, str]) -> list[RunRecord]:  # fmt: skip
    """`per_target` runs on each of `targets`, recorded running with job `leader`."""
    store, now, runs = pipeline.api.store, datetime.now(UTC), []
    for target in targets:
        workdir = pipeline.tmp / target
        for r in range(per_target):
            run_dir = workdir / f"{prefix}-{target}-{r}"
            run_dir.mkdir(parents=True)
            run = RunRecord(id=f"{prefix}-{target}-{r}", target=target, created=now,
                            remote_dir=str(run_dir), job=JobId(dir=str(run_dir), pid=leader),
                            state=RunState.RUNNING, labels=labels)  # fmt: skip
            store.runs.create(run)
            runs.append(run)
    return runs


CLI_SAMPLE = 5
"""`runwarden stop` processes timed for the one-process-per-run baseline."""


def all_asked(runs: list[RunRecord]) -> bool:
    return all((Path(run.remote_dir) / "snapshot.request").exists() for run in runs)


def bulk_stop(tmp: Path, targets: int, per_target: int, rounds: int) -> None:
    total = targets * per_target
    print(f"== 4. bulk stop of {total} runs on {targets} local targets")
    # Long proof timeouts: no deadline fires (and cancels the shared job) meanwhile.
    slow = {"RUNWARDEN_PROOF_TIMEOUT_S": "3600", "RUNWARDEN_END_TIMEOUT_S": "3600"}
    with running_pipeline(tmp / "p4", beat=False, extra_env=slow) as pipeline:
        api = pipeline.api
        names = [f"b{t}" for t in range(targets)]
        for name in names:
            (pipeline.tmp / name).mkdir()
            api.add_target(TargetConfig(name=name, kind="local", workdir=str(pipeline.tmp / name),
                                        **as_the_worker()))  # fmt: skip
        leader = subprocess.Popen(["sleep", "3600"], start_new_session=True)
        try:
            warm = register_runs(
                pipeline, "warm", names, 1, leader=leader.pid, labels={"round": "warm"}
            )
            api.stop_many(names, labels={"round": "warm"})  # executors built, code loaded
            assert all_asked(warm)
            bulk = []
            for k in range(rounds):
                runs = register_runs(pipeline, f"k{k}", names, per_target, leader=leader.pid,
                                     labels={"round": str(k)})  # fmt: skip
                started = time.perf_counter()
                summary = api.stop_many(names, labels={"round": str(k)}, wait_s=120)
                elapsed = time.perf_counter() - started
                if len(summary.asked) != total or not all_asked(runs):
                    raise SystemExit(f"bulk stop asked {len(summary.asked)} of {total}\n"
                                     f"{summary.refused[:3]}\n{pipeline.logs()}")  # fmt: skip
                bulk.append(elapsed)
            runs = register_runs(
                pipeline, "single", names, per_target, leader=leader.pid, labels={}
            )
            started = time.perf_counter()
            for run in runs:
                api.stop(run.id, asked_by="bench")
            single = time.perf_counter() - started
            if not all_asked(runs):
                raise SystemExit("a single stop left no request\n" + pipeline.logs())
            # `runwarden stop RUN` itself, a process per run: a few, timed one by one.
            sample = register_runs(pipeline, "cli", names[:1], CLI_SAMPLE, leader=leader.pid,
                                   labels={})  # fmt: skip
            per_cli = []
            for run in sample:
                started = time.perf_counter()
                argv = [sys.executable, "-m", "producers.cli", "stop", run.id]
                subprocess.run(argv, env=pipeline.env, cwd=ROOT, capture_output=True, check=True)
                per_cli.append(time.perf_counter() - started)
        finally:
            leader.kill()
            leader.wait()
    b = statistics.median(bulk)
    spread = f"{min(bulk):.2f}-{max(bulk):.2f} s"
    print(f"  bulk: {total} runs asked in {b:.2f} s (median of {rounds}; {spread})")
    print(f"  one stop per run: {total} runs asked in {single:.2f} s "
          f"({single / total * 1000:.1f} ms a run)")  # fmt: skip
    cli = statistics.median(per_cli) * total
    print(f"  one `runwarden stop` process per run: {statistics.median(per_cli) * 1000:.0f} ms "
          f"a run (median of {CLI_SAMPLE}), {cli:.0f} s for {total} (extrapolated)")  # fmt: skip
    print(f"  bulk is {single / b:.1f}x faster than one API stop per run, {cli / b:.0f}x than "
          f"one CLI stop per run   targets <= 2 s and >= 100x one `runwarden stop` per run: "
          f"{'yes' if b <= 2 and cli / b >= 100 else 'NO'}")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stops", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--targets", type=int, default=10)
    parser.add_argument("--per-target", type=int, default=100)
    parser.add_argument("--runs", type=int, help="runs in all: 100 a target (--targets ignored)")
    parser.add_argument("--only-bulk", action="store_true", help="only the bulk stop (4.)")
    parser.add_argument("--only-memory", action="store_true", help="only the memory (3.)")
    parser.add_argument("--tiny", action="store_true", help="the smoke test's run: least of all")
    args = parser.parse_args()
    floor_rounds = 50
    if args.tiny:
        args.stops, args.rounds, args.targets, args.per_target = 2, 2, 2, 3
        floor_rounds = 5
    if args.runs is not None:
        args.per_target = min(100, args.runs)
        args.targets = max(1, args.runs // args.per_target)
    tmp = Path(tempfile.mkdtemp(prefix="rw-bench-pipeline-"))
    try:
        if not (args.only_bulk or args.only_memory):
            stop_latency(tmp, args.stops, floor_rounds)
            poll_tick(tmp, args.targets, args.per_target, args.rounds)
            fan_out(tmp, args.targets, args.per_target, min(args.rounds, 3))
        if not args.only_bulk:
            worker_memory(tmp, args.targets * args.per_target, args.targets)
        if not args.only_memory:
            bulk_stop(tmp, args.targets, args.per_target, min(args.rounds, 3))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
