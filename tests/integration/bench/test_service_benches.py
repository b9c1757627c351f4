"""The benches of the whole service (redis-server, Celery workers and beat:
bench/harness/pipeline.py): bench/pipeline.py and bench/status.py, each once in its
tiny form (smoke.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from .smoke import run_bench

pytestmark = [pytest.mark.slow, pytest.mark.timeout(660)]


def test_pipeline_prints_its_four_figures(tmp_path: Path) -> None:
    """Signed stops (the workers refuse others), a deadline on every wait."""
    out = run_bench("pipeline", tmp_path, r"call -> snapshot.request .* [\d.]+x the floor")
    assert "batched is" in out
    assert "peak RSS" in out
    assert "than one API stop per run" in out


def test_status_prints_the_reading_against_a_ping(tmp_path: Path) -> None:
    run_bench("status", tmp_path, r"read_health .* vs  PING ")
