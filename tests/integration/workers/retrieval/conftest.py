"""What the retrieval tests share: a run directory with hostile names (`run`, on each
executor of the `target` fixture) and the look of an artifact store."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from schemas import Snapshot, SnapshotReason

from ....conftest import Target
from ..executors.test_contract import HOSTILE_NAMES

RUN = "run-1"
"""The run id every retrieval here is made for."""
SNAPSHOT = Snapshot(checkpoint="output/checkpoint-6", step=6, reason=SnapshotReason.REQUESTED)


def make_run(run: Path) -> None:
    """A run directory: log, proof, metrics, two checkpoints (hostile names, a hard
    link, a symlink, nested dirs), final outputs."""
    for step in (3, 6):
        ckpt = run / "output" / f"checkpoint-{step}"
        (ckpt / "nested dir" / "deeper").mkdir(parents=True)
        for i, name in enumerate(HOSTILE_NAMES):
            (ckpt / name).write_bytes(f"{step} {i} {name}".encode())
        (ckpt / "nested dir" / "deeper" / "weights.bin").write_bytes(os.urandom(300_000))
        (ckpt / "optimizer.pt").write_bytes(os.urandom(50_000))
        os.link(ckpt / "optimizer.pt", ckpt / "optimizer.hardlink")
        (ckpt / "link").symlink_to("optimizer.pt")
        (ckpt / "empty").write_bytes(b"")
    (run / "output" / "model.safetensors").write_bytes(os.urandom(100_000))
    (run / "output" / "sub $(touch PWNED)" / "checkpoint-9").mkdir(parents=True)
    (run / "output" / "sub $(touch PWNED)" / "checkpoint-9" / "x").write_text("excluded")
    (run / "output" / "sub $(touch PWNED)" / "kept 'q'\n").write_text("kept")
    (run / "job.log").write_text("step 1\nstep 2\n")
    (run / "snapshot.json").write_text(
        json.dumps({"checkpoint": "output/checkpoint-6", "step": 6, "reason": "requested"})
    )
    (run / "metrics.jsonl").write_text('{"event": "begin"}\n')


def listing(root: Path) -> list[str]:
    """Relative paths of every regular file and link under `root`, sorted."""
    found = []
    for dirpath, _dirs, names in os.walk(root):
        for name in names:
            found.append((Path(dirpath) / name).relative_to(root).as_posix())
    return sorted(found)


def leftovers(store: Path) -> list[str]:
    return sorted(n for n in os.listdir(store) if n.startswith(".incoming-"))


@pytest.fixture
def run(target: Target) -> Path:
    path = target.workdir / "run $(x) 'q'"
    make_run(path)
    return path
