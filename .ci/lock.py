"""Writes requirements-dev.lock: the exact version of every package `.[dev]` installs,
as pip resolves it now from the package index (and this machine's wheels), without
installing anything.

    make lock     # = .venv/bin/python .ci/lock.py > requirements-dev.lock

`make venv` installs `.[dev]` within these versions (`pip install -c`). No hashes:
torch comes from this machine's CPU wheel (`torch==2.13.0+cpu`), which no index hash
would match; it is pinned without its local label, as pyproject.toml pins it, so pip
takes that file and never a CUDA build.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def resolved() -> dict[str, str]:
    """Package name (normalized) -> version, for everything `.[dev]` needs."""
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        subprocess.run(
            [sys.executable, "-m", "pip", "install", "-q", "--dry-run", "--ignore-installed",
             "--report", str(report), f"{ROOT}[dev]"],
            check=True, timeout=1800,
        )  # fmt: skip
        items = json.loads(report.read_text())["install"]
    pins = {}
    for item in items:
        name = item["metadata"]["name"].lower().replace("_", "-")
        if name != "runwarden":
            pins[name] = item["metadata"]["version"].split("+")[0]
    return pins


def main() -> None:
    pins = resolved()
    print("# Exact versions of the test environment: `make venv` installs `.[dev]` within")
    print("# them (pip -c). Made by `make lock` (.ci/lock.py) from pyproject.toml.")
    for name in sorted(pins):
        print(f"{name}=={pins[name]}")


if __name__ == "__main__":
    main()
