"""Timing helpers shared by the benchmarks: medians of repeated calls, in seconds."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable


def median_s(call: Callable[[], object], repeat: int = 200, warmup: int = 10) -> float:
    """The median wall time of `call`, in seconds, over `repeat` runs after `warmup`."""
    for _ in range(warmup):
        call()
    samples = []
    for _ in range(repeat):
        started = time.perf_counter()
        call()
        samples.append(time.perf_counter() - started)
    return statistics.median(samples)


def ms(seconds: float) -> str:
    return f"{seconds * 1000:8.3f} ms"
