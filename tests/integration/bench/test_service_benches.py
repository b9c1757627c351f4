"""The benches of the whole service (redis-server, Celery workers and beat:
bench/harness/pipeline.py): bench/pipeline.py and bench/status.py, each once in its
tiny form (smoke.py)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from .smoke import run_bench

pytestmark = [pytest.mark.slow, pytest.mark.timeout(660)]


def test_pipeline_prints_its_figures(tmp_path: Path) -> None:
    """Signed stops (the workers refuse others), a deadline on every wait."""
    out = run_bench("pipeline", tmp_path, r"call -> snapshot.request .* [\d.]+x the floor")
    assert "batched is" in out
    assert re.search(r"one target's batch \(3 runs\): \d+ ms median", out)
    assert re.search(r"every target's tick done in [\d.]+ s", out)
    assert re.search(r"PSS idle \d+ MiB, loaded \d+ MiB", out)
    assert "countdown tasks held by the worker: 0" in out  # deadlines beyond the horizon
    assert "than one API stop per run" in out


def test_status_prints_the_reading_against_a_ping(tmp_path: Path) -> None:
    run_bench("status", tmp_path, r"read_health .* vs  PING ")


def test_redis_keys_prints_the_keys_a_periodic_task_leaves(tmp_path: Path) -> None:
    run_bench("redis_keys", tmp_path, r"keys per periodic task; a day at the default periods")
