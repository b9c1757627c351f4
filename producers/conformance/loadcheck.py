"""Loads a checkpoint directory the way its framework would, to tell a complete
checkpoint from a cut one. Run by `runwarden check-trainer` as a script, with the
interpreter of the job being checked (which has the job's torch), never imported:

    python loadcheck.py CHECKPOINT_DIR

Prints one JSON object: `{"framework": F, "files": N, "error": E}`. F is what the
files say (`hugging-face`: a `trainer_state.json`; `lightning`: a `.ckpt` holding a
Lightning checkpoint; `safetensors`; `torch`), or null when no file has a format this
knows; N the files loaded; E null, or the first file that did not load and why.
Loaded: `*.safetensors` (safetensors), `*.ckpt`, `*.pt`, `*.pth`, `*.bin` (`torch.load`,
on the CPU), `*.json` (JSON). Other files are left alone. Exit 0 whatever it found;
the caller bounds its time.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
from typing import Any

TORCH_SUFFIXES = (".ckpt", ".pt", ".pth", ".bin")
KNOWN_SUFFIXES = (".json", ".safetensors", *TORCH_SUFFIXES)


def _load(path: str) -> str | None:
    """Loads one file; its framework's name, None for a plain JSON file."""
    if path.endswith(".json"):
        with open(path, encoding="utf-8") as file:
            json.load(file)
        return None
    if path.endswith(".safetensors"):
        importlib.import_module("safetensors.torch").load_file(path, device="cpu")
        return "safetensors"
    torch = importlib.import_module("torch")
    # The job's own checkpoint, on its own machine, in a process of its own: what it
    # pickled (optimizer and RNG states, hyperparameters) must load as the job would.
    value: Any = torch.load(path, map_location="cpu", weights_only=False)
    if isinstance(value, dict) and "pytorch-lightning_version" in value:
        return "lightning"
    return "torch"


def main(directory: str) -> dict[str, Any]:
    framework: str | None = None
    files = 0
    for current, dirs, names in os.walk(directory):
        dirs.sort()
        for name in sorted(names):
            path = os.path.join(current, name)
            if os.path.islink(path) or not name.endswith(
                (".json", ".safetensors", *TORCH_SUFFIXES)
            ):
                continue
            if name == "trainer_state.json":
                framework = "hugging-face"
            try:
                kind = _load(path)
            except Exception as error:  # noqa: BLE001 - any failure is the answer
                rel = os.path.relpath(path, directory)
                why = f"{rel}: {type(error).__name__}: {error}"[:500]
                return {"framework": framework or "unknown", "files": files, "error": why}
            files += 1
            if kind is not None and framework in (None, "torch", "safetensors"):
                framework = kind if framework is None or kind == "lightning" else framework
    return {"framework": framework, "files": files, "error": None}


if __name__ == "__main__":
    if len(sys.argv) != 2 or not os.path.isdir(sys.argv[1]):
        print("usage: loadcheck.py CHECKPOINT_DIR", file=sys.stderr)
        sys.exit(2)
    print(json.dumps(main(sys.argv[1])))
