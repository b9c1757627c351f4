"""The benches that start no service: bench/local_ops.py, bench/redis_memory.py,
bench/cli_startup.py, bench/follow_tick.py, each once in its tiny form (smoke.py)."""

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
