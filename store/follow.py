"""The follow in the run store: which runs each target follows, how far the follower
read each run's files (byte offsets), the log and metrics streams it appended (each
bounded in entries and bytes, `store.streams`), the run's progress folded from its
metrics (`schemas.progress`), and the periodic saves its metrics report
(`store.budgets`)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, NamedTuple

from pydantic import ValidationError

from schemas import Progress, StoreError, validate_run_id
from schemas.budget import save_samples
from schemas.progress import finite, progress_fields

from .base import StoreBase, StorePart, text, translated
from .budgets import queue_saves
from .runs import Runs
from .streams import ENTRY_OVERHEAD_BYTES, cut_line

__all__ = ["Follow", "LogEntry", "MetricsEntry", "Offsets", "StreamBytes"]


class LogEntry(NamedTuple):
    """One line of a run's log stream."""

    id: str
    """Stream entry id (`<n>-1`, n the bytes the stream had taken in before it:
    `store.streams`); pass it as `after_id` to read on."""
    line: str


class MetricsEntry(NamedTuple):
    """One metrics record of a run's metrics stream."""

    id: str
    record: dict[str, Any]


class StreamBytes(NamedTuple):
    """The bytes a run's log and metrics streams hold, as the store counts them (each
    entry's value plus `streams.ENTRY_OVERHEAD_BYTES`)."""

    log: int
    metrics: int


class Offsets(NamedTuple):
    """How far the follower has read a run's files on its target, in bytes."""

    log: int
    metrics: int


def _check_offsets(offsets: Offsets) -> Offsets:
    for value in offsets:
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"an offset is a non-negative integer, not {value!r}")
    return Offsets(*offsets)


def _metrics_json(record: Mapping[str, Any]) -> str:
    if not isinstance(record, Mapping):
        raise TypeError(f"a metrics record is a JSON object, not {type(record).__name__}")
    return json.dumps(finite(record), allow_nan=False, separators=(",", ":"))


def _entries(reply: Any) -> list[tuple[str, dict[str, str]]]:
    """Stream entries from an XRANGE reply, or from an XREAD reply for one stream."""
    if isinstance(reply, dict):  # RESP3 XREAD
        reply = next(iter(reply.values()), [[]])[0] if reply else []
    elif (
        reply
        and isinstance(reply[0], list | tuple)
        and len(reply[0]) == 2
        and isinstance(reply[0][1], list)
    ):  # RESP2 XREAD: [[stream, entries]]
        reply = reply[0][1]
    return [
        (text(entry_id), {text(k): text(v) for k, v in (fields or {}).items()})
        for entry_id, fields in reply or []
    ]


def _held(total: Any, first: Any) -> int:
    """Bytes from the stream's oldest entry (XRANGE reply, COUNT 1) to its end, from
    the counter `total` (the start of the next entry)."""
    if not first:
        return 0
    start = int(text(first[0][0]).split("-", 1)[0])
    return max(0, int(total or 0) - start)


class Follow(StorePart):
    """The follow (`RunStore.follow`): followed runs, offsets, log and metrics
    streams, progress."""

    def __init__(self, shared: StoreBase, runs: Runs) -> None:
        super().__init__(shared)
        self._runs = runs

    # --- followed runs ----------------------------------------------------------------

    @translated
    def add(self, run_id: str) -> None:
        """Adds run `run_id` to the followed runs of its target (idempotent).
        Raises `NotFound` when there is no such run."""
        self.queue_add(None, run_id, self._runs.get(run_id).target)

    def queue_add(self, pipe: Any, run_id: str, target: str) -> None:
        """Queues on `pipe` (runs at once with None) what [`add`] does, for a run of
        `target`: for the transaction that starts the run."""
        keys = [self.keys.followed(target), self.keys.followed_targets]
        self._script("follow", keys=keys, args=[run_id, target], client=pipe)

    @translated
    def remove(self, run_id: str, target: str | None = None) -> bool:
        """Stops following run `run_id` (of `target`, else of the target its record
        names); whether it was followed. Its offsets are kept (following it again
        continues where it stopped). Given its target, the record is not read: a run
        whose record is gone or unreadable can be dropped too. Raises `NotFound` when
        there is no such run and no target is given."""
        where = target if target is not None else self._runs.get(run_id).target
        return bool(self.queue_remove(None, run_id, where))

    def queue_remove(self, pipe: Any, run_id: str, target: str) -> Any:
        """Queues on `pipe` (runs at once with None, and returns its reply) what
        [`remove`] does, for a run of `target`: for the transaction that ends the run."""
        keys = [self.keys.followed(target), self.keys.followed_targets]
        return self._script("unfollow", keys=keys, args=[run_id, target], client=pipe)

    @translated
    def runs(self, target: str) -> list[str]:
        """Ids of the followed runs of `target`, sorted."""
        return sorted(text(i) for i in self._r.smembers(self.keys.followed(target)))

    @translated
    def targets(self) -> list[str]:
        """Targets with at least one followed run, sorted."""
        return sorted(text(t) for t in self._r.smembers(self.keys.followed_targets))

    @translated
    def has_target(self, target: str) -> bool:
        """Whether `target` has at least one followed run (one SISMEMBER)."""
        return bool(self._r.sismember(self.keys.followed_targets, target))

    # --- offsets ----------------------------------------------------------------------

    @translated
    def offsets(self, run_id: str) -> Offsets:
        """How far the follower has read `job.log` and `metrics.jsonl` of run `run_id`,
        in bytes; (0, 0) before the first read."""
        log_raw, metrics_raw = self._r.hmget(self.keys.offsets(run_id), ["log", "metrics"])
        return Offsets(int(log_raw or 0), int(metrics_raw or 0))

    @translated
    def offsets_many(self, run_ids: Sequence[str]) -> list[Offsets]:
        """[`offsets`] of each of `run_ids`, in order, in one round trip."""
        pipe = self._r.pipeline(transaction=False)
        for run_id in run_ids:
            pipe.hmget(self.keys.offsets(run_id), ["log", "metrics"])
        return [Offsets(int(log or 0), int(metrics or 0)) for log, metrics in pipe.execute()]

    @translated
    def set_offsets(self, run_id: str, log: int, metrics: int) -> None:
        """Records how far the follower has read (bytes, non-negative). Prefer
        [`Follow.record_tail`], which appends and advances at once."""
        offsets = _check_offsets(Offsets(log, metrics))
        self._r.hset(
            self.keys.offsets(run_id),
            mapping={"log": offsets.log, "metrics": offsets.metrics},
        )

    @translated
    def record_tail(
        self,
        run_id: str,
        *,
        lines: Sequence[str],
        records: Sequence[Mapping[str, Any]],
        from_offsets: Offsets,
        to_offsets: Offsets,
    ) -> bool:
        """Appends what the follower read and advances its offsets, all in one
        transaction, only if the stored offsets are still `from_offsets`. False (and
        nothing changed) when they are not: another follower already recorded that
        part, so lines are never appended twice. The streams are bounded as
        [`Follow.append_log`] and [`Follow.append_metrics`] say; the offsets always advance to
        `to_offsets`, whatever the bounds left out. Once the run has ended (its
        offsets expire), what this writes expires with them.

        Raises:
            ValueError, TypeError: a record is not plain JSON, or an offset is negative.
            Conflict: still losing to other writers after the bounded attempts.
        """
        key = self.keys.offsets(run_id)
        expected, target = _check_offsets(from_offsets), _check_offsets(to_offsets)
        encoded = [_metrics_json(r) for r in records]

        def step(pipe: Any) -> bool:
            log_raw, metrics_raw = pipe.hmget(key, ["log", "metrics"])
            if Offsets(int(log_raw or 0), int(metrics_raw or 0)) != expected:
                pipe.unwatch()
                return False
            ttl_ms = int(pipe.pttl(key))
            pipe.multi()
            self._queue_tail(pipe, run_id, lines, records, encoded)
            pipe.hset(key, mapping={"log": target.log, "metrics": target.metrics})
            if ttl_ms > 0:
                # The run ended meanwhile (steps.end_run set the expiry): what this writes
                # late must not outlive the rest.
                for data_key in self.keys.follow_data(run_id):
                    pipe.pexpire(data_key, ttl_ms)
            return True

        written, _ = self._compare_and_set(
            [key], step, f"the offsets of run {run_id!r} keep changing; try again", run_id
        )
        return written

    def queue_retention(self, pipe: Any, run_id: str) -> None:
        """Queues on `pipe` the expiry of the run's follow data (`Keys.follow_data`)
        after the retention, for the transaction that ends the run. The offsets hash
        is made to exist (zeros) so that it carries the expiry a late
        [`Follow.record_tail`] copies."""
        offsets = self.keys.offsets(run_id)
        pipe.hsetnx(offsets, "log", 0)
        pipe.hsetnx(offsets, "metrics", 0)
        for key in self.keys.follow_data(run_id):
            pipe.pexpire(key, self._retention_ms)

    # --- streams ----------------------------------------------------------------------

    @translated
    def append_log(self, run_id: str, lines: Sequence[str]) -> str | None:
        """Appends `lines` (one stream entry each, in order) to the run's log stream;
        returns the last entry id, None for no lines. Each line is cut to the line
        cap (`store.streams.cut_line`: at a character boundary, marked); the stream
        keeps at most the log cap of entries and the log byte budget, the oldest
        dropped first, exactly, in the same step. Text that cannot be encoded as
        UTF-8 (lone surrogates) is replaced by `?`."""
        return self._append(run_id, lines, [], [])

    @translated
    def append_metrics(self, run_id: str, records: Sequence[Mapping[str, Any]]) -> str | None:
        """Appends metrics `records` (in order) to the run's metrics stream, bounded
        like the log stream (the metrics cap and byte budget), and updates its
        [`Progress`] in the same transaction; returns the last entry id, None when
        none was appended. A record whose JSON is longer than the line cap is left
        out of the stream (its progress still counts). NaN and infinities are stored
        as null (strict JSON, as the job side writes them).

        Raises:
            ValueError, TypeError: a record is not plain JSON (nothing appended).
        """
        return self._append(run_id, [], records, [_metrics_json(r) for r in records])

    def _append(
        self,
        run_id: str,
        lines: Sequence[str],
        records: Sequence[Mapping[str, Any]],
        encoded: Sequence[str],
    ) -> str | None:
        validate_run_id(run_id)
        if not lines and not records:
            return None
        with self._r.pipeline(transaction=True) as pipe:
            self._queue_tail(pipe, run_id, lines, records, encoded)
            replies = pipe.execute()
        ids = [r for r in replies if isinstance(r, bytes | str)]
        return text(ids[-1]) if ids else None

    def _queue_tail(
        self,
        pipe: Any,
        run_id: str,
        lines: Sequence[str],
        records: Sequence[Mapping[str, Any]],
        encoded: Sequence[str],
    ) -> None:
        counter = self.keys.stream_bytes(run_id)
        values = [cut_line(line, self._line_bytes) for line in lines]
        log_args = ["log", "l", self._log_bytes, self._log_cap]
        self._queue_stream(pipe, self.keys.log(run_id), counter, log_args, values)
        kept = [data for data in map(str.encode, encoded) if len(data) <= self._line_bytes]
        metrics_args = ["metrics", "m", self._metrics_bytes, self._metrics_cap]
        self._queue_stream(pipe, self.keys.metrics(run_id), counter, metrics_args, kept)
        fields = progress_fields(records)
        if fields:
            pipe.hset(
                self.keys.progress(run_id),
                mapping={name: json.dumps(value) for name, value in fields.items()},
            )
        # The job's periodic saves teach its stops' budgets, counted once with the lines.
        queue_saves(pipe, self.keys.saves(run_id), save_samples(records, datetime.now(UTC)))

    def _queue_stream(
        self, pipe: Any, key: str, counter: str, bounds: list[Any], values: list[bytes]
    ) -> None:
        """Queues the append of `values` to the stream `key` and its trimming to
        `bounds` (counter field, entry field, byte budget, entry cap), one script."""
        if values:
            args = [*bounds, ENTRY_OVERHEAD_BYTES, *values]
            self._script("append_stream", keys=[key, counter], args=args, client=pipe)

    @translated
    def stream_bytes(self, run_id: str) -> StreamBytes:
        """The bytes run `run_id`'s log and metrics streams hold now (each at most its
        byte budget), in one round trip."""
        counter = self.keys.stream_bytes(run_id)
        with self._r.pipeline(transaction=True) as pipe:
            pipe.hmget(counter, ["log", "metrics"])
            pipe.xrange(self.keys.log(run_id), "-", "+", count=1)
            pipe.xrange(self.keys.metrics(run_id), "-", "+", count=1)
            (log_total, metrics_total), log_first, metrics_first = pipe.execute()
        return StreamBytes(_held(log_total, log_first), _held(metrics_total, metrics_first))

    @translated
    def read_log(
        self,
        run_id: str,
        after_id: str = "0-0",
        count: int = 1000,
        block_ms: int | None = None,
    ) -> list[LogEntry]:
        """Up to `count` log lines after entry `after_id`, oldest first. With
        `block_ms`, waits up to that long for a line when there is none yet (the
        client's `socket_timeout` must be longer). Lines trimmed by the bounds are
        gone."""
        entries = self._read(self.keys.log(run_id), after_id, count, block_ms)
        return [LogEntry(i, fields.get("l", "")) for i, fields in entries]

    @translated
    def read_log_newest(self, run_id: str, count: int = 1000) -> list[LogEntry]:
        """The newest `count` log lines held (fewer when the stream holds fewer),
        oldest first, in one round trip; read on with [`Follow.read_log`] from the last
        one's id."""
        if count < 1:
            raise ValueError("count must be at least 1")
        reply = self._r.xrevrange(self.keys.log(run_id), "+", "-", count=count)
        entries = _entries(reply)
        entries.reverse()
        return [LogEntry(i, fields.get("l", "")) for i, fields in entries]

    @translated
    def read_metrics(
        self,
        run_id: str,
        after_id: str = "0-0",
        count: int = 1000,
        block_ms: int | None = None,
    ) -> list[MetricsEntry]:
        """Up to `count` metrics records after entry `after_id`, oldest first; as
        [`Follow.read_log`]."""
        out: list[MetricsEntry] = []
        for entry_id, fields in self._read(self.keys.metrics(run_id), after_id, count, block_ms):
            try:
                record = json.loads(fields.get("m", ""))
            except ValueError as error:
                raise StoreError(
                    f"run store: metrics entry {entry_id} of run {run_id!r} is not JSON"
                ) from error
            out.append(MetricsEntry(entry_id, record))
        return out

    def _read(
        self, key: str, after_id: str, count: int, block_ms: int | None
    ) -> list[tuple[str, dict[str, str]]]:
        if count < 1:
            raise ValueError("count must be at least 1")
        if block_ms is not None:
            return _entries(self._r.xread({key: after_id}, count=count, block=block_ms))
        return _entries(self._r.xrange(key, f"({after_id}", "+", count=count))

    @translated
    def last_metrics(self, run_id: str) -> Progress | None:
        """The run's progress from every metrics record appended so far (kept apart
        from the capped stream, so `max_steps` of the `begin` line survives the
        trimming); None before the first record."""
        raw = self._r.hgetall(self.keys.progress(run_id))
        if not raw:
            return None
        try:
            data = {text(k): json.loads(v) for k, v in raw.items()}
            return Progress.model_validate(data)
        except (ValueError, ValidationError) as error:
            raise StoreError(f"run store: the progress of run {run_id!r} is unreadable") from error
