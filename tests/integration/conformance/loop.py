"""A stdlib training loop for `runwarden check-trainer`'s tests: honest, or broken in
one of the ways users' scripts break (`--broken`):

- `proof-before-save`: writes the proof, then the checkpoint's state;
- `only-rank-0`: rank 0 stops alone; the other ranks train on (run with 2 ranks);
- `ignores-request`: never looks at the request;
- `restarts-steps`: a resumed run counts its steps from 1 again;
- `late-by-5`: stops 5 steps after the step it first saw the request at.

Steps take `--step-time` seconds; rank 0 logs each one (`runwarden_job.Metrics`). The
checkpoint is `state.json` ({"step"}) in `output/checkpoint-<step>`. Ranks are
torchrun's (`$RANK`), without torch: each rank reads the request itself.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import runwarden_job

BROKEN = ("proof-before-save", "only-rank-0", "ignores-request", "restarts-steps", "late-by-5")


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=100_000)
    parser.add_argument("--step-time", type=float, default=0.1)
    parser.add_argument("--broken", choices=BROKEN)
    args = parser.parse_args()
    rank = int(os.environ.get("RANK", "0"))
    start = 1
    resume = os.environ.get(runwarden_job.RESUME_ENV)
    if resume and args.broken != "restarts-steps":
        with open(os.path.join(resume, "state.json"), encoding="utf-8") as file:
            start = json.load(file)["step"] + 1
    metrics = runwarden_job.Metrics() if rank == 0 else None
    if metrics is not None:
        metrics.begin(args.steps, first_step=start)
    seen = 0  # late-by-5: the step the request was first seen at
    for step in range(start, args.steps + 1):
        time.sleep(args.step_time)
        if metrics is not None:
            metrics.log(step, loss=1.0 / step)
        if args.broken == "ignores-request" or (args.broken == "only-rank-0" and rank != 0):
            continue
        reason = runwarden_job.snapshot_requested() if step < args.steps else None
        if reason is None:
            continue
        if args.broken == "late-by-5":
            seen = seen or step
            if step < seen + 5:
                continue
        runwarden_job.report_stop(step, reason)
        if rank != 0:
            return 0
        checkpoint = os.path.join(runwarden_job.run_dir(), runwarden_job.checkpoint_path(step))
        os.makedirs(checkpoint, exist_ok=True)
        if args.broken == "proof-before-save":
            runwarden_job.write_proof(step, reason)
            time.sleep(0.05)  # the save comes after: its file is newer than the proof
        with open(os.path.join(checkpoint, "state.json"), "w", encoding="utf-8") as file:
            json.dump({"step": step}, file)
        if args.broken != "proof-before-save":
            runwarden_job.write_proof(step, reason)
        return 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
