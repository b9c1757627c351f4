"""Accelerate around a loop of one's own, stopped gracefully through
``runwarden_loop.StopPoint``: one process, or several under ``accelerate launch`` or
``torchrun`` (CPU, gloo). The model and data are examples/ddp_loop.py's.

Accelerate's own checkpointing keeps what a faithful resume needs:
``save_state`` writes the model, the optimizer, the scheduler and every rank's RNG
states, ``load_state`` reads them back; the step is saved beside them, and the data
order is a function of the step (as in ddp_loop.py).

    python examples/accelerate_loop.py --steps 200
    torchrun --nproc-per-node 2 examples/accelerate_loop.py --steps 200

Every rank prints ``rank R step S loss L`` for each step and, at its end, ``rank R
stopped at step S`` (or ``finished``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch
from accelerate import Accelerator
from runwarden_job import Metrics
from runwarden_loop import StopPoint, resume_checkpoint
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))

from ddp_loop import batch_indices, data, leave, say  # the example beside this one


def build(accelerator: Accelerator, width: int, seed: int) -> tuple[Any, Any, Any]:
    """The model, its optimizer and scheduler, prepared by Accelerate."""
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(width, width), nn.ReLU(), nn.Dropout(0.1), nn.Linear(width, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.02, momentum=0.9)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=50, gamma=0.5)
    model, optimizer, scheduler = accelerator.prepare(model, optimizer, scheduler)
    return model, optimizer, scheduler


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=200, help="last step")
    parser.add_argument("--width", type=int, default=32, help="the model's width")
    parser.add_argument("--step-time", type=float, default=0.05, help="least seconds a step")
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()

    accelerator = Accelerator(cpu=True)
    rank, world = accelerator.process_index, accelerator.num_processes
    model, optimizer, scheduler = build(accelerator, args.width, args.seed + rank)
    inputs, targets = data(args.seed, args.width)

    start = 0
    resume = resume_checkpoint()
    if resume is not None:
        accelerator.load_state(resume)
        start = int(json.loads(Path(resume, "step.json").read_text())["step"])
        say(f"rank {rank} resuming from {resume} at step {start}")
    say(f"rank {rank} pid {os.getpid()}")
    # Progress for runwarden (the main process only): its bars and `check-trainer`.
    metrics = Metrics() if accelerator.is_main_process else None
    if metrics is not None:
        metrics.begin(args.steps, first_step=start + 1)

    ended = "finished"
    with StopPoint() as stop:
        for step in range(start + 1, args.steps + 1):
            began = time.monotonic()
            picked = batch_indices(step, args.seed, rank, world)
            loss = nn.functional.mse_loss(model(inputs[picked]), targets[picked])
            optimizer.zero_grad()
            accelerator.backward(loss)
            optimizer.step()
            scheduler.step()
            say(f"rank {rank} step {step} loss {loss.item():.10f}")
            if metrics is not None:
                metrics.log(step, loss=loss.item())
            time.sleep(max(0.0, args.step_time - (time.monotonic() - began)))
            if stop.reached(step, last_step=args.steps):
                where, saving = stop.checkpoint(step), time.monotonic()
                accelerator.save_state(where)  # every rank's part; waits for them all
                if accelerator.is_main_process:
                    Path(where, "step.json").write_text(json.dumps({"step": step}))
                if metrics is not None:
                    metrics.save(step, time.monotonic() - saving)
                stop.prove(step)
                ended = f"stopped at step {step}"
                break
    say(f"rank {rank} {ended}")
    if metrics is not None:
        metrics.end(stop.stop_step or args.steps)
        metrics.close()
    accelerator.wait_for_everyone()
    accelerator.end_training()
    return 0


if __name__ == "__main__":
    leave(main())
