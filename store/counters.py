"""The metrics' counters and histograms in the run store (`schemas.metrics`): one
hash, `P prom`, that every worker process moves with HINCRBYFLOAT and the metrics
endpoint reads whole at scrape time. Increments are atomic in Redis, so any number of
processes count into one series without losing an update.

Fields are JSON arrays: `["c", name, labels]` a counter's value; `["h", name,
labels, i]` how many observations fell in bucket `i` (not cumulative; `i =
len(buckets)` is `+Inf`); `["s", name, labels]` and `["n", name, labels]` a
histogram's sum and count. `labels` is the list of label values in the order of the
metric's label names.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from schemas.metrics import METRICS, MetricSpec, Sample, bucket_index

from .base import StorePart, text, translated

__all__ = ["Counters", "StoredSeries"]

_SPECS = {spec.name: spec for spec in METRICS}


@dataclass
class StoredSeries:
    """One stored series: a counter's `value`, or a histogram's per-bucket counts
    (not cumulative, `+Inf` last), sum and count."""

    spec: MetricSpec
    labels: tuple[str, ...]
    value: float = 0.0
    buckets: list[float] = field(default_factory=list)
    sum: float = 0.0
    count: float = 0.0


def _field(*parts: Any) -> str:
    return json.dumps(parts, separators=(",", ":"))


class Counters(StorePart):
    """Stored counters and histograms (`RunStore.counters`)."""

    def queue(self, pipe: Any, samples: Sequence[Sample]) -> None:
        """Queues on `pipe` the increments of `samples`, for a transaction of another
        concern that counts what it records (`Ledger.record`)."""
        for sample in samples:
            spec, labels = sample.spec, list(sample.labels)
            if len(labels) != len(spec.labels):
                raise ValueError(f"{spec.name} takes the labels {spec.labels}")
            if spec.kind == "counter":
                pipe.hincrbyfloat(self.keys.prom, _field("c", spec.name, labels), sample.value)
            elif spec.kind == "histogram":
                index = bucket_index(spec, sample.value)
                pipe.hincrbyfloat(self.keys.prom, _field("h", spec.name, labels, index), 1)
                pipe.hincrbyfloat(self.keys.prom, _field("s", spec.name, labels), sample.value)
                pipe.hincrbyfloat(self.keys.prom, _field("n", spec.name, labels), 1)
            else:
                raise ValueError(f"{spec.name} is a {spec.kind}: computed, never stored")

    @translated
    def add(self, samples: Sequence[Sample]) -> None:
        """Counts `samples` (in one round trip, atomically)."""
        if not samples:
            return
        with self._r.pipeline(transaction=True) as pipe:
            self.queue(pipe, samples)
            pipe.execute()

    @translated
    def series(self) -> list[StoredSeries]:
        """Every stored series of a metric this version knows (others, and fields
        that are not this module's, are left out), sorted by name and labels."""
        found: dict[tuple[str, tuple[str, ...]], StoredSeries] = {}
        for raw_field, raw_value in self._r.hgetall(self.keys.prom).items():
            try:
                parts = json.loads(text(raw_field))
                kind, name, labels = parts[0], parts[1], tuple(str(v) for v in parts[2])
                value = float(text(raw_value))
            except (ValueError, TypeError, IndexError, KeyError):
                continue
            spec = _SPECS.get(name)
            if spec is None or len(labels) != len(spec.labels):
                continue
            series = found.setdefault((name, labels), StoredSeries(spec, labels))
            if kind == "c" and spec.kind == "counter":
                series.value = value
            elif spec.kind == "histogram" and kind in ("h", "s", "n"):
                if not series.buckets:
                    series.buckets = [0.0] * (len(spec.buckets) + 1)
                if kind == "s":
                    series.sum = value
                elif kind == "n":
                    series.count = value
                elif len(parts) > 3 and parts[3] in range(len(spec.buckets) + 1):
                    series.buckets[parts[3]] = value
        return [found[key] for key in sorted(found)]
