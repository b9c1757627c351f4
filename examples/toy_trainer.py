"""A toy "training" loop for the demo and the tests: stdlib only, no model.

It imports `runwarden_job`, found through `PYTHONPATH`: launch ships it into the run
directory (`.runwarden/`) and puts that folder on the job's `PYTHONPATH`; to run this
by hand, use `PYTHONPATH=workers/jobside python examples/toy_trainer.py`.

Run it with the run directory as the current directory. Steps are numbered
`1..--steps`; after step k the global step is k, and a resumed run continues the
numbering. At the end of every step it checks for a snapshot request; on one it
saves `output/checkpoint-<step>/` (`state.json`, `weights.bin`), writes the proof,
logs `end` and exits 0. After the last step it saves `output/checkpoint-<steps>/`
and exits 0.

Saves: `--save-every N` saves a checkpoint every N steps and reports each of these
periodic saves in its metrics (a `save` line: how long the save and the step before
it took), from which runwarden learns its stops' proof timeout; `--save-time S`
makes every save take S seconds more (a large model's checkpoint).

Preemption: it installs `runwarden_job.install_preemption_signals()` (the signals of
`$RUNWARDEN_PREEMPT_SIGNALS`, default `TERM,USR1`; empty: none), so SIGTERM or
SIGUSR1 from outside makes it save at the end of the current step and write a proof
with reason `preempted`, then exit 0; runwarden's cancel (which writes `cancelling`
first) still ends it at once. With `--ignore-requests` nothing is installed (a
signal acts as by default); with `--ignore-sigterm` SIGTERM is ignored.

Some flags make it misbehave on purpose, for the tests of stop and cancel:
`--ignore-requests`, `--hang-after-proof`, `--ignore-sigterm`, `--spawn-child`,
`--fail-at`.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time

import runwarden_job

WEIGHTS_SIZE = 4 * 1024
CHILD_PID_FILE = "child.pid"
# A child that survives SIGTERM (and SIGHUP) and a kill of the leader alone: only a
# SIGKILL of the whole process group ends it.
CHILD_CODE = (
    "import signal, time\n"
    "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
    "signal.signal(signal.SIGHUP, signal.SIG_IGN)\n"
    "while True:\n"
    "    time.sleep(3600)\n"
)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=100, help="last step (default 100)")
    parser.add_argument(
        "--step-time", type=float, default=0.1, help="seconds a step takes (default 0.1)"
    )
    parser.add_argument(
        "--output",
        default=runwarden_job.OUTPUT_DIR,
        help="checkpoint folder, relative to the run directory (default: output); "
        "a proof can only be written for `output`",
    )
    parser.add_argument(
        "--save-every", type=int, default=0, help="save a checkpoint every N steps (0: never)"
    )
    parser.add_argument(
        "--save-time",
        type=float,
        default=0.0,
        metavar="S",
        help="seconds every checkpoint save takes (default 0)",
    )
    parser.add_argument(
        "--resume-from",
        default=os.environ.get(runwarden_job.RESUME_ENV) or None,
        metavar="DIR",
        help=f"checkpoint to resume from (default: ${runwarden_job.RESUME_ENV})",
    )
    parser.add_argument(
        "--ignore-requests", action="store_true", help="never look for a snapshot request"
    )
    parser.add_argument(
        "--hang-after-proof", action="store_true", help="sleep forever after the proof"
    )
    parser.add_argument("--ignore-sigterm", action="store_true", help="ignore SIGTERM")
    parser.add_argument(
        "--spawn-child",
        action="store_true",
        help=f"start a child in the same process group that ignores SIGTERM; "
        f"its pid goes to {CHILD_PID_FILE}",
    )
    parser.add_argument("--fail-at", type=int, metavar="STEP", help="exit at this step")
    parser.add_argument(
        "--exit-code", type=int, default=1, help="exit code of --fail-at (default 1)"
    )
    parser.add_argument(
        "--print-env",
        nargs="+",
        default=[],
        metavar="NAME",
        help="print whether each variable is set and the sha256 of its value",
    )
    args = parser.parse_args(argv)
    if min(args.steps, args.save_every, args.step_time, args.save_time) < 0:
        parser.error("--steps, --save-every, --step-time and --save-time must not be negative")
    return args


def fake_loss(step: int) -> float:
    """A loss that only depends on the step, so a resumed run continues the curve."""
    return 0.05 + 2.5 / (1.0 + 0.1 * step)


def learning_rate(step: int, steps: int) -> float:
    return 1e-3 * max(0.0, 1.0 - step / max(steps, 1))


def weights(step: int) -> bytes:
    """WEIGHTS_SIZE deterministic bytes for `step`: a chain of sha256 digests."""
    chunks: list[bytes] = []
    digest = f"toy-weights-{step}".encode()
    while sum(map(len, chunks)) < WEIGHTS_SIZE:
        digest = hashlib.sha256(digest).digest()
        chunks.append(digest)
    return b"".join(chunks)[:WEIGHTS_SIZE]


def write_file(path: str, data: bytes) -> None:
    with open(path, "wb") as file:
        file.write(data)
        file.flush()
        os.fsync(file.fileno())


def save_checkpoint(output: str, step: int, loss: float, save_time: float = 0.0) -> str:
    """Saves `<output>/checkpoint-<step>/` and returns its path, taking `save_time`
    seconds more. The files are written to `<output>/.tmp-checkpoint-<step>` and the
    folder renamed, so the checkpoint appears complete or not at all. A checkpoint
    already there for this step (a periodic save, then the final one) is kept: it
    holds the same state."""
    final = os.path.join(output, f"checkpoint-{step}")
    if os.path.isdir(final):
        return final
    os.makedirs(output, exist_ok=True)
    temp = os.path.join(output, f".tmp-checkpoint-{step}")
    # Left over by a run killed mid-save.
    shutil.rmtree(temp, ignore_errors=True)
    os.makedirs(temp)
    state = json.dumps({"step": step, "loss": loss}).encode()
    write_file(os.path.join(temp, "state.json"), state)
    write_file(os.path.join(temp, "weights.bin"), weights(step))
    time.sleep(save_time)
    os.rename(temp, final)
    return final


def write_pid_file(path: str, pid: int) -> None:
    temp = f"{path}.{os.getpid()}.tmp"
    write_file(temp, f"{pid}\n".encode())
    os.replace(temp, path)


def spawn_child() -> int:
    """Starts the stubborn child in this process group (no new session) and returns
    its pid. It is not waited for: it must outlive this process."""
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD_CODE],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    write_pid_file(CHILD_PID_FILE, child.pid)
    return child.pid


def print_env(names: list[str]) -> None:
    # Hashes only: the secret tests compare digests, and a value must never be
    # printed to the log.
    for name in names:
        value = os.environ.get(name)
        if value is None:
            print(f"env {name}: unset", flush=True)
        else:
            digest = hashlib.sha256(value.encode("utf-8", "surrogateescape")).hexdigest()
            print(f"env {name}: set sha256={digest}", flush=True)


def resume_step(directory: str) -> int:
    with open(os.path.join(directory, "state.json"), encoding="utf-8") as file:
        state = json.load(file)
    step = state["step"]
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise SystemExit(f"toy_trainer: {directory}/state.json has no valid step")
    return step


def hang() -> None:
    while True:
        time.sleep(3600)


def progress(step: int, steps: int, loss: float) -> None:
    # `\r`-terminated bar updates like tqdm, and a `\n` line every 10 steps: the tails
    # must handle both line ends.
    width = 20
    filled = width * step // max(steps, 1)
    bar = "#" * filled + "." * (width - filled)
    sys.stdout.write(f"[{bar}] {step}/{steps} loss {loss:.4f}\r")
    if step % 10 == 0:
        sys.stdout.write(f"step {step}/{steps} loss {loss:.4f}\n")
    sys.stdout.flush()


def train(args: argparse.Namespace, metrics: runwarden_job.Metrics) -> int:
    start = 1
    if args.resume_from:
        start = resume_step(args.resume_from) + 1
        print(f"resuming from {args.resume_from} at step {start}", flush=True)
    metrics.begin(args.steps, first_step=start)
    step, loss = start - 1, fake_loss(start - 1)
    for step in range(start, args.steps + 1):
        step_began = time.monotonic()
        time.sleep(args.step_time)
        loss = fake_loss(step)
        metrics.log(step, loss=loss, learning_rate=learning_rate(step, args.steps))
        progress(step, args.steps, loss)
        if args.fail_at is not None and step == args.fail_at:
            print(f"\nfailing at step {step} with exit code {args.exit_code}", flush=True)
            return int(args.exit_code)
        if args.save_every and step % args.save_every == 0:
            with metrics.saving(step, step_seconds=time.monotonic() - step_began):
                save_checkpoint(args.output, step, loss, args.save_time)
        if args.ignore_requests:
            continue
        reason = runwarden_job.snapshot_requested()
        if reason is not None:
            # Not reported as a `save` line: runwarden measures a stop's save itself.
            save_checkpoint(args.output, step, loss, args.save_time)
            runwarden_job.write_proof(step, reason)
            metrics.end(step, reason=reason)
            print(f"\nsnapshot saved at step {step} ({reason})", flush=True)
            if args.hang_after_proof:
                hang()
            return 0
    if step >= start:
        save_checkpoint(args.output, step, loss, args.save_time)
    metrics.end(step)
    print(f"\ntraining done at step {step}", flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if not args.ignore_requests:
        # Before --ignore-sigterm, which then overrides the SIGTERM handler.
        runwarden_job.install_preemption_signals()
    if args.ignore_sigterm:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    print_env(args.print_env)
    if args.spawn_child:
        pid = spawn_child()
        print(f"spawned child {pid}", flush=True)
    with runwarden_job.Metrics() as metrics:
        return train(args, metrics)


if __name__ == "__main__":
    sys.exit(main())
