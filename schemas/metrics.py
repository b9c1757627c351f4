"""The Prometheus metrics of runwarden: their names, kinds, labels and buckets, and
which counters and histograms each ledger event moves (docs/architecture.md,
"Metrics").

Workers are separate prefork processes, so no process holds the numbers: the
counters and histograms live in the run store (`store.counters`), moved by the
event seam in the same transaction that appends the event to the ledger (and by the
follow tick for its duration); the gauges (stops in flight, runs by state, pending
webhook deliveries) are computed from the store when the endpoint is scraped
(`producers.metrics`). A counter here is named without `_total`: the exposition adds
it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Final, Literal

from .ledger import (
    CancelDecided,
    LedgerEvent,
    PolicyDecision,
    ProofSeen,
    RetrievalDone,
    RetrievalFailed,
    RunEnded,
)

__all__ = [
    "CANCELS",
    "DEADLINE_LATENESS",
    "EVENTS",
    "FOLLOW_TICK",
    "METRICS",
    "POLICY_DECISIONS",
    "PROOF_LATENCY",
    "RETRIEVALS",
    "RETRIEVED_BYTES",
    "RUNS",
    "RUNS_ENDED",
    "SCRIPT_TIMEOUTS",
    "STOPS_IN_FLIGHT",
    "WEBHOOK_DELIVERIES",
    "WEBHOOK_PENDING",
    "MetricSpec",
    "Sample",
    "bucket_index",
    "event_samples",
]

MetricKind = Literal["counter", "histogram", "gauge"]


@dataclass(frozen=True)
class MetricSpec:
    """One metric: its name (a counter's without `_total`), help, kind, label names
    and, for a histogram, its upper bounds in increasing order (`+Inf` implied)."""

    name: str
    help: str
    kind: MetricKind
    labels: tuple[str, ...] = ()
    buckets: tuple[float, ...] = field(default=())


@dataclass(frozen=True)
class Sample:
    """A move of a stored metric: a counter incremented by `value`, or a histogram
    observing `value`. `labels` pairs follow `spec.labels`."""

    spec: MetricSpec
    labels: tuple[str, ...]
    value: float


_SECONDS: Final = (0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0)

EVENTS: Final = MetricSpec(
    "runwarden_ledger_events", "Events appended to the stop ledger, by kind.", "counter", ("kind",)
)
CANCELS: Final = MetricSpec(
    "runwarden_cancels",
    "Cancels decided, by cause (proof_timeout, end_timeout, manual); retries not counted.",
    "counter",
    ("cause",),
)
PROOF_LATENCY: Final = MetricSpec(
    "runwarden_proof_latency_seconds",
    "From a stop's request to its proof: the proof's own time, bounded by the request and "
    "the moment it was first seen (by a follow tick, at the proof deadline or the run's end).",
    "histogram",
    buckets=_SECONDS,
)
DEADLINE_LATENESS: Final = MetricSpec(
    "runwarden_deadline_lateness_seconds",
    "How long after a deadline was due it was acted on, by deadline (proof, end).",
    "histogram",
    ("deadline",),
    (0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 300.0),
)
FOLLOW_TICK: Final = MetricSpec(
    "runwarden_follow_tick_seconds",
    "Duration of one follow tick of a target (one batched read and its recording).",
    "histogram",
    ("target",),
    (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0),
)
RETRIEVALS: Final = MetricSpec(
    "runwarden_retrievals",
    "Retrieval attempts, by outcome (done, failed: tried again later, gave_up).",
    "counter",
    ("outcome",),
)
RETRIEVED_BYTES: Final = MetricSpec(
    "runwarden_retrieved_bytes", "Bytes of artifacts retrieved and verified.", "counter"
)
RUNS_ENDED: Final = MetricSpec(
    "runwarden_runs_ended", "Runs whose end was recorded, by final state.", "counter", ("state",)
)
POLICY_DECISIONS: Final = MetricSpec(
    "runwarden_policy_decisions", "Snapshots asked by a policy, by policy.", "counter", ("policy",)
)
WEBHOOK_DELIVERIES: Final = MetricSpec(
    "runwarden_webhook_deliveries",
    "Webhook delivery attempts, by webhook and outcome (delivered, retried, gave_up).",
    "counter",
    ("webhook", "outcome"),
)
STOPS_IN_FLIGHT: Final = MetricSpec(
    "runwarden_stops_in_flight", "Open stops, by phase (read at scrape time).", "gauge", ("phase",)
)
RUNS: Final = MetricSpec(
    "runwarden_runs", "Runs in the store, by state (read at scrape time).", "gauge", ("state",)
)
WEBHOOK_PENDING: Final = MetricSpec(
    "runwarden_webhook_pending",
    "Webhook deliveries waiting, counted per webhook and run (read at scrape time).",
    "gauge",
)

SCRIPT_TIMEOUTS: Final = MetricSpec(
    "runwarden_script_timeouts",
    "Scripts ended at their deadline (a local one killed, a remote one's channel closed), "
    "by target and action (status, follow, cancel, ...).",
    "counter",
    ("target", "action"),
)
METRICS: Final = (
    EVENTS,
    CANCELS,
    PROOF_LATENCY,
    DEADLINE_LATENESS,
    FOLLOW_TICK,
    RETRIEVALS,
    RETRIEVED_BYTES,
    RUNS_ENDED,
    POLICY_DECISIONS,
    WEBHOOK_DELIVERIES,
    SCRIPT_TIMEOUTS,
)
"""The metrics kept in the store (the gauges are computed at scrape time)."""


def bucket_index(spec: MetricSpec, value: float) -> int:
    """The index of the first bucket of `spec` whose upper bound is at least `value`;
    `len(spec.buckets)` for `+Inf`."""
    for index, bound in enumerate(spec.buckets):
        if value <= bound:
            return index
    return len(spec.buckets)


def event_samples(event: LedgerEvent) -> list[Sample]:
    """What `event` moves: its kind's count, and per kind: the proof latency and the
    proof deadline's lateness (`proof_seen`), the cancels by cause and the lateness
    of the deadline that passed (`cancel_decided`), the retrievals and their bytes,
    the runs ended by state, the policies' decisions. Lateness is never negative (a
    deadline acted on a little early counts as on time)."""
    samples = [Sample(EVENTS, (event.kind,), 1.0)]
    if isinstance(event, ProofSeen):
        if event.asked_at is not None:
            latency = max(0.0, (event.at - event.asked_at).total_seconds())
            samples.append(Sample(PROOF_LATENCY, (), latency))
        if event.due is not None:
            seen = event.seen_at or event.at
            late = max(0.0, (seen - event.due).total_seconds())
            samples.append(Sample(DEADLINE_LATENESS, ("proof",), late))
    elif isinstance(event, CancelDecided):
        if event.cause != "retry":
            samples.append(Sample(CANCELS, (event.cause,), 1.0))
        if event.due is not None and event.cause in ("proof_timeout", "end_timeout"):
            late = max(0.0, (event.at - event.due).total_seconds())
            deadline = "proof" if event.cause == "proof_timeout" else "end"
            samples.append(Sample(DEADLINE_LATENESS, (deadline,), late))
    elif isinstance(event, RetrievalDone):
        samples.append(Sample(RETRIEVALS, ("done",), 1.0))
        samples.append(Sample(RETRIEVED_BYTES, (), float(event.bytes)))
    elif isinstance(event, RetrievalFailed):
        samples.append(Sample(RETRIEVALS, ("gave_up" if event.gave_up else "failed",), 1.0))
    elif isinstance(event, RunEnded):
        samples.append(Sample(RUNS_ENDED, (str(event.state),), 1.0))
    elif isinstance(event, PolicyDecision):
        samples.append(Sample(POLICY_DECISIONS, (str(event.policy),), 1.0))
    return samples
