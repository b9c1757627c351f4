"""What the tests of the job side share with the toy trainer's
(tests/integration/examples/): the job's environment as launch builds it, the protocol's
way of writing a file, and no `RUNWARDEN_*` variable of this process leaking in."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from workers.jobside import runwarden_job as job

from ....conftest import ROOT

JOBSIDE = ROOT / "workers" / "jobside"


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in (job.REQUEST_ENV, job.METRICS_ENV, job.RESUME_ENV):
        monkeypatch.delenv(name, raising=False)


def put(path: Path, content: str) -> None:
    """Writes `content` the way the protocol's writers do: a temp file and a rename."""
    temp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    temp.write_text(content, encoding="utf-8")
    temp.replace(path)


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    data = path.read_bytes()
    assert data.endswith(b"\n")
    return [json.loads(line) for line in data.decode("ascii").split("\n")[:-1]]


def job_env(run_dir: Path, **extra: str) -> dict[str, str]:
    """The job's environment as launch builds it (§2): ours without `RUNWARDEN_*`,
    then the job's own variables."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RUNWARDEN_")}
    env["PYTHONPATH"] = str(JOBSIDE)
    env[job.REQUEST_ENV] = str(run_dir / job.SNAPSHOT_REQUEST)
    env[job.METRICS_ENV] = str(run_dir / job.METRICS_FILE)
    env.update(extra)
    return env
