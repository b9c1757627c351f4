"""The chaos campaign (bench/chaos.py, faults injected) and the notice latency per
cloud (bench/preemption.py), each once in its tiny form (smoke.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from .smoke import run_bench

pytestmark = [pytest.mark.slow, pytest.mark.timeout(660)]


def test_chaos_prints_its_runs_and_violations(tmp_path: Path) -> None:
    run_bench("chaos", tmp_path, r"== chaos campaign, seed \d+: \d+ runs")


def test_preemption_prints_each_cloud_against_the_poll(tmp_path: Path) -> None:
    run_bench("preemption", tmp_path, r"^aws\s+[\d.]+ ms .*")
