"""Runs one bench of bench/ in its tiny form (`--tiny`) as the docs run it, under the
reaper, in a temporary directory of the test: it must complete and print its
figures. Never a timed assertion: the figures are read, not judged (the machine
is shared), so a bench cannot rot unnoticed."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from bench.harness.paths import ROOT

TIMEOUT_S = 600.0
"""The most a tiny run may take on a loaded machine: a hang guard, not a figure."""


def run_bench(name: str, tmp_path: Path, figure: str, *args: str) -> str:
    """The output of `bench/NAME.py --tiny ARGS`, which must end well (exit 0) within
    TIMEOUT_S and print its figure against its baseline: a line matching the regular
    expression `figure`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RUNWARDEN_")}
    env["TMPDIR"] = str(tmp_path)  # its temporary directories under the test's own
    argv = [sys.executable, "-m", "workers.reaper", "--",
            sys.executable, str(ROOT / "bench" / f"{name}.py"), "--tiny", *args]  # fmt: skip
    done = subprocess.run(
        argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=TIMEOUT_S, check=False
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, f"bench/{name}.py --tiny exited {done.returncode}:\n{output}"
    found = re.search(figure, done.stdout, re.MULTILINE)
    assert found, f"bench/{name}.py printed no {figure!r}:\n{output}"
    return done.stdout
