"""A training loop of one's own, stopped gracefully through ``runwarden_loop.StopPoint``:
plain PyTorch on one process, or DDP (gloo, CPU) under ``torchrun``. A small model
built from its arguments (no download) learns a fixed random linear map.

A faithful resume: the checkpoint holds the model, the optimizer, the scheduler, the
step, and every RNG state (torch's and Python's, per rank); the data order is a
function of the epoch and the position in it (a seeded permutation per epoch, each
rank its share, as ``DistributedSampler.set_epoch`` does), so a resumed run sees the
same batches from the same step on, and its losses are the uninterrupted run's.

    python examples/ddp_loop.py --steps 200
    torchrun --nproc-per-node 2 examples/ddp_loop.py --steps 200
    RUNWARDEN_RESUME_FROM=output/checkpoint-40 python examples/ddp_loop.py --steps 200

Every rank prints ``rank R step S loss L`` for each step and, at its end, ``rank R
stopped at step S`` (or ``finished``).
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time
from typing import Any

import torch
import torch.distributed as dist
from runwarden_job import Metrics
from runwarden_loop import StopPoint, resume_checkpoint
from torch import nn
from torch.nn.parallel import DistributedDataParallel

SAMPLES = 512
BATCH = 16


def data(seed: int, width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The whole dataset, the same on every rank: inputs and their targets."""
    generator = torch.Generator().manual_seed(seed)
    inputs = torch.randn(SAMPLES, width, generator=generator)
    weights = torch.randn(width, 1, generator=generator) / width**0.5
    return inputs, inputs @ weights + 0.01 * torch.randn(SAMPLES, 1, generator=generator)


def batch_indices(step: int, seed: int, rank: int, world: int) -> torch.Tensor:
    """The indices of step ``step``'s batch on ``rank``: the epoch's seeded
    permutation, this rank's share of it, the step's place in that share."""
    per_epoch = SAMPLES // (BATCH * world)
    epoch, position = divmod(step - 1, per_epoch)
    order = torch.randperm(SAMPLES, generator=torch.Generator().manual_seed(seed + epoch))
    mine = order[rank::world]
    return mine[position * BATCH : (position + 1) * BATCH]


def say(text: str) -> None:
    """One line to stdout in one write: the ranks share it, and lines stay whole."""
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


def save(where: str, rank: int, step: int, parts: dict[str, Any]) -> None:
    """Everything a faithful resume needs, this rank's, into the checkpoint `where`."""
    os.makedirs(where, exist_ok=True)
    state = {name: part.state_dict() for name, part in parts.items()}
    state |= {"torch_rng": torch.get_rng_state(), "python_rng": random.getstate(), "step": step}
    torch.save(state, os.path.join(where, f"rank-{rank}.pt"))


def load(where: str, rank: int, parts: dict[str, Any]) -> int:
    """This rank's state from the checkpoint `where`; the step it was saved at."""
    state = torch.load(os.path.join(where, f"rank-{rank}.pt"), weights_only=False)
    for name, part in parts.items():
        part.load_state_dict(state[name])
    torch.set_rng_state(state["torch_rng"])
    random.setstate(state["python_rng"])
    return int(state["step"])


def arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=200, help="last step")
    parser.add_argument("--width", type=int, default=32, help="the model's width")
    parser.add_argument(
        "--step-time", type=float, default=0.05, help="seconds a step lasts at least"
    )
    parser.add_argument("--seed", type=int, default=7)
    return parser.parse_args()


def build(width: int, world: int) -> tuple[nn.Module, dict[str, Any]]:
    """The model (wrapped for DDP on several ranks) and everything a checkpoint holds."""
    model: nn.Module = nn.Sequential(
        nn.Linear(width, width), nn.ReLU(), nn.Dropout(0.1), nn.Linear(width, 1)
    )
    if world > 1:
        model = DistributedDataParallel(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.02, momentum=0.9)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=50, gamma=0.5)
    return model, {"model": model, "optimizer": optimizer, "scheduler": scheduler}


def main() -> int:
    args = arguments()
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world > 1:
        dist.init_process_group("gloo")
    rank = dist.get_rank() if world > 1 else 0
    torch.manual_seed(args.seed + rank)
    random.seed(args.seed + rank)
    model, parts = build(args.width, world)
    optimizer, scheduler = parts["optimizer"], parts["scheduler"]
    inputs, targets = data(args.seed, args.width)

    start = 0
    resume = resume_checkpoint()
    if resume is not None:
        start = load(resume, rank, parts)
        say(f"rank {rank} resuming from {resume} at step {start}")
    say(f"rank {rank} pid {os.getpid()}")

    # Progress and save times for runwarden (`show`, the proof timeout): rank 0's.
    metrics = Metrics() if rank == 0 else None
    if metrics is not None:
        metrics.begin(args.steps, first_step=start + 1)
    ended = "finished"
    with StopPoint() as stop:
        for step in range(start + 1, args.steps + 1):
            began = time.monotonic()
            picked = batch_indices(step, args.seed, rank, world)
            loss = nn.functional.mse_loss(model(inputs[picked]), targets[picked])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            scheduler.step()
            say(f"rank {rank} step {step} loss {loss.item():.10f}")
            if metrics is not None:
                metrics.log(step, loss=loss.item())
            time.sleep(max(0.0, args.step_time - (time.monotonic() - began)))
            if stop.reached(step, last_step=args.steps):
                saving = time.monotonic()
                save(stop.checkpoint(step), rank, step, parts)
                if metrics is not None:
                    metrics.save(step, time.monotonic() - saving)
                stop.prove(step)
                ended = f"stopped at step {step}"
                break
    say(f"rank {rank} {ended}")
    if metrics is not None:
        metrics.end(stop.stop_step or args.steps)
        metrics.close()
    if world > 1:
        # Every rank leaves the group together: one that exits first aborts the others.
        dist.barrier()
        dist.destroy_process_group()
    return 0


def leave(code: int) -> None:
    """Ends the process with `code` once its output is flushed, skipping the interpreter's
    teardown on several ranks: a gloo thread still joinable then makes C++ call
    std::terminate ("terminate called without an active exception", SIGABRT) after
    everything was done and saved, and torchrun reports the run failed (seen in 1 of
    about 10 two-rank runs)."""
    sys.stdout.flush()
    sys.stderr.flush()
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        os._exit(code)
    raise SystemExit(code)


if __name__ == "__main__":
    leave(main())
