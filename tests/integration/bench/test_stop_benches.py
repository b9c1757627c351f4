"""The benches of stops and the follow through the whole service:
bench/stop_timing.py and bench/follow_lag.py, each once in its tiny form
(smoke.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from .smoke import run_bench

pytestmark = [pytest.mark.slow, pytest.mark.timeout(660)]


def test_stop_timing_prints_each_kind_against_its_due_time(tmp_path: Path) -> None:
    run_bench("stop_timing", tmp_path, r"^target \(p95 <= follow period \+ 2 s\): ")


def test_follow_lag_prints_the_lag_against_the_follow_period(tmp_path: Path) -> None:
    run_bench("follow_lag", tmp_path, r"recorded log behind the job: median \S+ s")
