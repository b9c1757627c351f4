"""A PyTorch Lightning fit, stopped gracefully through ``runwarden_lightning``'s
callback: one process, or DDP (gloo, CPU) over several under ``torchrun``
(``strategy="ddp"``: Lightning sees torchrun's environment and starts no process of
its own, so every rank is torchrun's child and gets its signals directly). A small
model built from its arguments (no download) learns a fixed random linear map.

A faithful resume mid-epoch, from ``ckpt_path=resume_checkpoint()``: Lightning
restores the model, the optimizer, the scheduler and the loops' progress, and calls
``load_state_dict`` of a train dataloader that has one. This one's order is a
function of the epoch and the position in it (a permutation seeded by the epoch,
each rank its share, as ``DistributedSampler.set_epoch`` does), and its state is
that position: the resumed run sees the same batches from the same step on. The
RNG states of every rank (dropout) travel in the checkpoint too (``on_save_checkpoint``
gathers them), so the losses are the uninterrupted run's.

    python examples/lightning_loop.py --steps 40
    torchrun --nproc-per-node 2 examples/lightning_loop.py --steps 40
    RUNWARDEN_RESUME_FROM=output/checkpoint-12 python examples/lightning_loop.py --steps 40

Every rank prints ``rank R step S loss L`` for each step and, at its end, ``rank R
stopped at step S`` (or ``finished``).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import warnings
from collections.abc import Iterator
from typing import Any

import lightning.pytorch as pl
import torch
import torch.distributed as dist
from runwarden_lightning import RunwardenCallback, resume_checkpoint
from torch import nn
from torch.utils.data import DataLoader, Sampler, TensorDataset

SAMPLES = 512
BATCH = 16


def say(text: str) -> None:
    """One line to stdout in one write: the ranks share it, and lines stay whole."""
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


def data(seed: int, width: int) -> TensorDataset:
    """The whole dataset, the same on every rank: inputs and their targets."""
    generator = torch.Generator().manual_seed(seed)
    inputs = torch.randn(SAMPLES, width, generator=generator)
    weights = torch.randn(width, 1, generator=generator) / width**0.5
    targets = inputs @ weights + 0.01 * torch.randn(SAMPLES, 1, generator=generator)
    return TensorDataset(inputs, targets)


class EpochSampler(Sampler[int]):
    """This rank's share of a permutation seeded by the epoch (Lightning calls
    ``set_epoch``), from ``skip`` samples in (a resume mid-epoch; then 0 again)."""

    def __init__(self, seed: int, rank: int, world: int) -> None:
        self.seed, self.rank, self.world = seed, rank, world
        self.epoch = 0
        self.skip = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return SAMPLES // self.world

    def __iter__(self) -> Iterator[int]:
        order = torch.randperm(
            SAMPLES, generator=torch.Generator().manual_seed(self.seed + self.epoch)
        )
        skip, self.skip = self.skip, 0
        yield from order[self.rank :: self.world][skip:].tolist()


class ResumableLoader(DataLoader[Any]):
    """A DataLoader whose state (``state_dict``, saved by Lightning in its checkpoints)
    is its position: the epoch and the batches handed out in it. Loaded, the next
    iteration of that epoch starts after them."""

    def __init__(self, dataset: TensorDataset, sampler: EpochSampler) -> None:
        # Its own generator: making an iterator draws a seed, never from the global RNG
        # that the model's dropout uses (or a resume would shift its masks).
        super().__init__(dataset, batch_size=BATCH, sampler=sampler, generator=torch.Generator())
        self.epoch_sampler = sampler
        self.position = 0
        self._resume: tuple[int, int] | None = None

    def __iter__(self) -> Iterator[Any]:  # type: ignore[override]
        # A generator: it runs at the first batch, after Lightning set the epoch.
        sampler, resume, self._resume = self.epoch_sampler, self._resume, None
        self.position = resume[1] if resume is not None and resume[0] == sampler.epoch else 0
        sampler.skip = self.position * BATCH
        for batch in super().__iter__():
            self.position += 1
            yield batch

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch_sampler.epoch, "position": self.position}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self._resume = (int(state["epoch"]), int(state["position"]))


class Regression(pl.LightningModule):
    """The model from its width; its RNG states (every rank's) in its checkpoints."""

    def __init__(self, width: int, step_time: float) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(width, width), nn.ReLU(), nn.Dropout(0.1), nn.Linear(width, 1)
        )
        self.step_time = step_time
        self._rng: list[torch.Tensor] | None = None

    def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> torch.Tensor:
        began = time.monotonic()
        inputs, targets = batch
        loss = nn.functional.mse_loss(self.net(inputs), targets)
        # The step this batch ends (no gradient accumulation here).
        say(f"rank {self.global_rank} step {self.trainer.global_step + 1} loss {loss.item():.10f}")
        time.sleep(max(0.0, self.step_time - (time.monotonic() - began)))
        return loss

    def configure_optimizers(self) -> Any:
        optimizer = torch.optim.SGD(self.parameters(), lr=0.02, momentum=0.9)
        scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=50, gamma=0.5)
        return {
            "optimizer": optimizer,
            "lr_scheduler": {"scheduler": scheduler, "interval": "step"},
        }

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        # Every rank runs this (save_checkpoint is collective); rank 0 writes the file.
        mine = torch.get_rng_state()
        states: list[Any] = [mine]
        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            states = [None] * dist.get_world_size()
            dist.all_gather_object(states, mine)
        checkpoint["rng_states"] = states

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        self._rng = checkpoint.get("rng_states")

    def on_train_start(self) -> None:
        # After the dataloader's setup: nothing draws from the global RNG until the step.
        if self._rng is not None:
            torch.set_rng_state(self._rng[self.global_rank])
            self._rng = None


def arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=40, help="last step")
    parser.add_argument("--width", type=int, default=32, help="the model's width")
    parser.add_argument(
        "--step-time", type=float, default=0.05, help="seconds a step lasts at least"
    )
    parser.add_argument("--seed", type=int, default=7)
    return parser.parse_args()


def main() -> int:
    args = arguments()
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    torch.manual_seed(args.seed + rank)
    warnings.filterwarnings("ignore", ".*does not have many workers.*")
    model = Regression(args.width, args.step_time)
    loader = ResumableLoader(data(args.seed, args.width), EpochSampler(args.seed, rank, world))
    runwarden = RunwardenCallback()
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=world,
        strategy="ddp" if world > 1 else "auto",
        max_steps=args.steps,
        callbacks=[runwarden],
        use_distributed_sampler=False,  # the loader shares the data out itself
        enable_checkpointing=False,  # the only checkpoints are runwarden's snapshots
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
    )
    resume = resume_checkpoint()
    if resume is not None:
        say(f"rank {rank} resuming from {resume}")
    say(f"rank {rank} pid {os.getpid()}")
    trainer.fit(model, train_dataloaders=loader, ckpt_path=resume)
    stopped = runwarden.stop_step
    say(f"rank {rank} " + (f"stopped at step {stopped}" if stopped else "finished"))
    if world > 1:
        # Every rank leaves the group together: one that exits first aborts the others.
        dist.barrier()
    return 0


def leave(code: int) -> None:
    """Ends the process with `code` once its output is flushed, skipping the interpreter's
    teardown on several ranks: a gloo thread still joinable then makes C++ call
    std::terminate ("terminate called without an active exception", SIGABRT) after
    everything was done and saved, and torchrun reports the run failed (as with
    examples/ddp_loop.py)."""
    sys.stdout.flush()
    sys.stderr.flush()
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        os._exit(code)
    raise SystemExit(code)


if __name__ == "__main__":
    leave(main())
