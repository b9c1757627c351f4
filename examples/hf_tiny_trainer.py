"""A tiny real Hugging Face training: a 1-layer GPT-2 on random tokens, on the CPU.

Needs the `hf` extra (`pip install -e '.[hf]'`). Nothing is downloaded: the model is
built from a config and the data is generated here. It imports `runwarden_hf`
(which imports `runwarden_job`), found
through `PYTHONPATH` (launch ships it into the run directory); to run this by hand,
use `PYTHONPATH=workers/jobside python examples/hf_tiny_trainer.py`.

Run it with the run directory as the current directory: checkpoints go to `output/`.
The `RunwardenCallback` stops training on a snapshot request with a checkpoint
`output/checkpoint-<step>` and its proof; `$RUNWARDEN_RESUME_FROM` resumes from a
checkpoint (the global step continues from it). Steps take tens of milliseconds;
`--step-delay` makes them longer, so a test can stop a run in the middle. It also
runs under `torchrun --nproc_per_node N` (DDP over gloo on the CPU): every rank stops
at the same step.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

# Before transformers is imported: never reach the network.
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch
from runwarden_hf import RunwardenCallback, resume_checkpoint
from transformers import (
    GPT2Config,
    GPT2LMHeadModel,
    Trainer,
    TrainerCallback,
    TrainerControl,
    TrainerState,
    TrainingArguments,
    set_seed,
)

VOCAB_SIZE = 128
SEQUENCE_LENGTH = 32
SAMPLES = 256


class RandomTokens(torch.utils.data.Dataset[dict[str, torch.Tensor]]):
    """`samples` sequences of random tokens, the same for a given seed (a resumed run
    sees the same data)."""

    def __init__(self, samples: int, length: int, seed: int) -> None:
        generator = torch.Generator().manual_seed(seed)
        self.tokens = torch.randint(0, VOCAB_SIZE, (samples, length), generator=generator)

    def __len__(self) -> int:
        return int(self.tokens.shape[0])

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        row = self.tokens[index]
        return {"input_ids": row, "labels": row.clone()}


class StepDelay(TrainerCallback):
    """Sleeps `seconds` at every step end: slows a run down for the tests."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def on_step_end(
        self,
        args: TrainingArguments,
        state: TrainerState,
        control: TrainerControl,
        **kwargs: object,
    ) -> None:
        time.sleep(self.seconds)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200, help="last step (default 200)")
    parser.add_argument(
        "--save-every",
        type=int,
        default=0,
        help="save a checkpoint every N steps and at the last one "
        "(default 0: save only on a snapshot request)",
    )
    parser.add_argument(
        "--step-delay", type=float, default=0.0, help="extra seconds per step (default 0)"
    )
    parser.add_argument("--batch-size", type=int, default=4, help="per device (default 4)")
    parser.add_argument("--seed", type=int, default=0, help="data and training seed")
    args = parser.parse_args(argv)
    if args.steps < 1 or args.save_every < 0 or args.step_delay < 0 or args.batch_size < 1:
        parser.error("--steps and --batch-size must be positive, the others not negative")
    return args


def build_model() -> GPT2LMHeadModel:
    config = GPT2Config(
        n_layer=1,
        n_head=2,
        n_embd=32,
        vocab_size=VOCAB_SIZE,
        n_positions=64,
        bos_token_id=VOCAB_SIZE - 1,
        eos_token_id=VOCAB_SIZE - 1,
    )
    model = GPT2LMHeadModel(config)
    model.loss_type = "ForCausalLM"  # what it is; unset, transformers warns
    return model


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    set_seed(args.seed)
    training_args = TrainingArguments(
        output_dir="output",
        max_steps=args.steps,
        per_device_train_batch_size=args.batch_size,
        learning_rate=1e-3,
        logging_steps=1,
        save_strategy="steps" if args.save_every else "no",
        save_steps=args.save_every or 500,
        report_to=[],
        use_cpu=True,
        seed=args.seed,
        disable_tqdm=True,
        dataloader_num_workers=0,
        ddp_find_unused_parameters=False,  # under torchrun: every parameter is used
    )
    callbacks: list[TrainerCallback] = [RunwardenCallback()]
    if args.step_delay:
        callbacks.append(StepDelay(args.step_delay))
    trainer = Trainer(
        model=build_model(),
        args=training_args,
        train_dataset=RandomTokens(SAMPLES, SEQUENCE_LENGTH, args.seed),
        callbacks=callbacks,
    )
    resume = resume_checkpoint()
    if resume is not None:
        print(f"resuming from {resume}", flush=True)
    trainer.train(resume_from_checkpoint=resume)
    print(f"training ended at step {trainer.state.global_step}", flush=True)
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        # Under torchrun: every rank first reaches the end, then leaves without the
        # interpreter's teardown. A process that exits with its gloo group alive may
        # abort in the group's threads ("terminate called without an active
        # exception"), and destroying the group hung a rank now and then, with or
        # without a barrier before it (a full run today).
        torch.distributed.barrier()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
