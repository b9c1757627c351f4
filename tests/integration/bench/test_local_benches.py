"""The benches that start no service: bench/local_ops.py, bench/redis_memory.py,
bench/cli_startup.py, bench/follow_tick.py, bench/slurm_follow.py (its own Slurm
cluster), each once in its tiny form (smoke.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from .smoke import run_bench

pytestmark = [pytest.mark.slow, pytest.mark.timeout(660)]


def test_local_ops_prints_each_operation_against_the_floor(tmp_path: Path) -> None:
    run_bench("local_ops", tmp_path, r"^shell status\s+[\d.]+ ms\s+[\d.]+$")


def test_redis_memory_prints_its_use_against_the_bound(tmp_path: Path) -> None:
    run_bench("redis_memory", tmp_path, r"^ratio used_memory / bound: [\d.]+$")


def test_cli_startup_prints_the_help_against_python(tmp_path: Path) -> None:
    run_bench("cli_startup", tmp_path, r"runwarden --help\s+[\d.]+ s\s+[\d.]+x the floor")


def test_follow_tick_prints_each_form_against_the_baseline(tmp_path: Path) -> None:
    run_bench("follow_tick", tmp_path, r"^proof unchanged\s+[\d.]+ ms\s+[\d.]+x the baseline$")


def test_slurm_follow_asks_slurm_once_a_tick_however_many_runs(tmp_path: Path) -> None:
    # 3 runs, one Slurm command in the tick (the O(1) a target's follow must be).
    run_bench("slurm_follow", tmp_path, r"^\s+3\s+1\s+[\d.]+ ms\s+[\d.]+ ms [\d.]+x the baseline$")
