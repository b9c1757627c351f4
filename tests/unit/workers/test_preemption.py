"""Preemption notices in the worker's operations, over fakeredis: the launch records
which cloud its run watches (the run's setting, else its target's) and hands the
watcher's settings to the spawn (a fake target, tests/unit/workers/launch_fakes.py);
a follow tick's notice opens the run's stop at once, asked by the notice's source,
and goes into the record with the watcher's state (a real run directory of a local
target, tests/unit/workers/conftest.py). What the job wrote is never trusted."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from bench.harness.users import as_the_worker
from schemas import (
    JobStatus,
    Preemption,
    RunRecord,
    RunState,
    SnapshotReason,
    TargetConfig,
    UnknownTarget,
)
from schemas.events import LaunchSpec
from schemas.preemption import NO_CLIENT
from workers import launch as launching
from workers.context import Context
from workers.executors import FollowUpdate, ProtocolError
from workers.preemption import notice_command, watched
from workers.watch import observe_notices, read_notice

from .conftest import Sent, policy_worker, running_run
from .launch_fakes import T0, FakeExecutor, fake_context

NOW = datetime(2026, 3, 4, 5, 6, 7, tzinfo=UTC)


def with_target(ctx: Context, preemption: Any) -> Context:
    def target_for(target: str) -> TargetConfig:
        if target != "local":
            raise UnknownTarget(target)
        return TargetConfig(
            name="local",
            kind="local",
            workdir="/w",
            upload_roots=("/",),
            preemption=preemption,
            **as_the_worker(),
        )

    ctx.target = target_for  # type: ignore[method-assign]
    return ctx


# --- at launch ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("run", "target", "cloud"),
    [(None, "off", None), (None, "gcp", "gcp"), ("azure", "gcp", "azure"), ("off", "aws", None)],
)
def test_the_launch_records_and_spawns_the_watch(
    run: Any, target: Any, cloud: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in (
        ("RUNWARDEN_METADATA_AWS_URL", "http://127.0.0.1:1"),
        ("RUNWARDEN_METADATA_GCP_URL", "http://127.0.0.1:2"),
        ("RUNWARDEN_METADATA_AZURE_URL", "http://127.0.0.1:3"),
        ("RUNWARDEN_NOTICE_POLL_S", "0.5"),
    ):
        monkeypatch.setenv(name, value)
    ex = FakeExecutor()
    ctx = with_target(fake_context(ex), target)
    spec = LaunchSpec(target="local", command="train", key="k1", preemption=run)
    record = launching.launch(ctx, spec, T0)
    (job,) = ex.spawned
    if cloud is None:
        assert record.preemption is None
        assert job.preemption is None
        return
    assert record.preemption == Preemption(cloud=cloud)
    assert job.preemption == cloud
    assert job.metadata_urls == {
        "aws": "http://127.0.0.1:1",
        "gcp": "http://127.0.0.1:2",
        "azure": "http://127.0.0.1:3",
    }
    assert job.notice_poll_s == 0.5


def test_a_job_that_reads_no_requests_gets_no_watcher() -> None:
    ctx = with_target(fake_context(FakeExecutor()), "aws")
    spec = LaunchSpec(target="local", command="x", snapshots=False, preemption="gcp")
    assert watched(spec, ctx.target("local")) is None
    adopted = RunRecord(
        id="r1", target="local", created=T0, remote_dir="/w/r1", preemption=Preemption()
    )
    assert notice_command(ctx, adopted) == {}


# --- in the follow ------------------------------------------------------------------


def aws_notice(seen: datetime = NOW, left_s: float = 120.0) -> bytes:
    not_after = (seen + timedelta(seconds=left_s)).strftime("%Y-%m-%dT%H:%M:%SZ")
    body = {
        "source": "aws-spot",
        "seen_at": seen.timestamp(),
        "not_after": not_after,
        "detail": "terminate",
    }
    return json.dumps(body).encode() + b"\n"


GCP_NOTICE = b'{"source": "gcp-preempted", "seen_at": 1.0, "not_after": null, "detail": "TRUE"}\n'


def update(**fields: Any) -> FollowUpdate:
    return FollowUpdate(**{"status": JobStatus.RUNNING, "request": None, **fields})


def tick_worker(tmp_path: Path, **settings: Any) -> tuple[Context, Any, Sent, RunRecord]:
    worker, store, sent = policy_worker(tmp_path, **settings)
    run = running_run(store, tmp_path, "r1", preemption=Preemption(cloud="aws"))
    return worker, store, sent, run


def test_the_watcher_s_request_opens_the_stop_asked_by_the_notice(tmp_path: Path) -> None:
    worker, store, sent, run = tick_worker(tmp_path, proof_timeout_s=60)
    observe_notices(worker, run, update(notice=aws_notice(), request="preempted"), NOW)
    stop = store.stops.get("r1")
    assert stop is not None
    assert (stop.reason, stop.asked_by) == (SnapshotReason.PREEMPTED, "notice:aws-spot")
    assert len(sent.named("runwarden.proof_timeout")) == 1
    recorded = store.runs.get("r1").preemption
    assert recorded is not None
    assert recorded.cloud == "aws"
    notice = recorded.notice
    assert notice is not None
    assert (notice.source, notice.detail, notice.seen_at) == ("aws-spot", "terminate", NOW)
    assert (notice.left_s, notice.short, notice.note) == (120, False, None)  # 120 s >= 60 s
    assert store.runs.get("r1").message is None


def test_a_notice_shorter_than_the_proof_timeout_is_told_and_asked_at_once(
    tmp_path: Path,
) -> None:
    worker, store, _, run = tick_worker(tmp_path, proof_timeout_s=1800)
    observe_notices(worker, run, update(notice=aws_notice(), request="preempted"), NOW)
    record = store.runs.get("r1")
    assert record.preemption is not None
    notice = record.preemption.notice
    assert notice is not None
    assert notice.short
    assert notice.note == (
        "the aws-spot notice leaves 120 s, less than the proof timeout (1800 s): the snapshot"
        " was asked at once"
    )
    assert record.message == notice.note
    assert store.stops.get("r1") is not None


def test_the_notice_before_its_request_is_asked_here(tmp_path: Path) -> None:
    worker, store, sent, run = tick_worker(tmp_path)
    observe_notices(worker, run, update(notice=GCP_NOTICE), NOW)
    assert (Path(run.remote_dir) / "snapshot.request").read_text() == "preempted"
    stop = store.stops.get("r1")
    assert stop is not None
    assert (stop.reason, stop.asked_by) == (SnapshotReason.PREEMPTED, "notice:gcp-preempted")
    assert len(sent.named("runwarden.proof_timeout")) == 1


def test_the_watcher_s_request_written_after_the_tick_read_is_the_notice_s(
    tmp_path: Path,
) -> None:
    """The tick read the notice, then the watcher wrote its request before the stop
    was opened here: the stop is still the notice's (seen in the service test)."""
    worker, store, _, run = tick_worker(tmp_path)
    (Path(run.remote_dir) / "snapshot.request").write_text("preempted")
    observe_notices(worker, run, update(notice=GCP_NOTICE), NOW)
    stop = store.stops.get("r1")
    assert stop is not None
    assert (stop.reason, stop.asked_by) == (SnapshotReason.PREEMPTED, "notice:gcp-preempted")


def gcp_notice(source: str, seen: datetime = NOW) -> bytes:
    body = {"source": source, "seen_at": seen.timestamp(), "not_after": None, "detail": "x"}
    return json.dumps(body).encode() + b"\n"


@pytest.mark.parametrize(
    ("source", "lead_s"), [("gcp-preempted", 30), ("gcp-maintenance", 60)]
)
def test_a_gcp_notice_gets_the_not_after_gcp_documents(
    tmp_path: Path, source: str, lead_s: float
) -> None:
    worker, store, _, run = tick_worker(tmp_path, proof_timeout_s=1800)
    seen = NOW - timedelta(seconds=2.25)
    observe_notices(worker, run, update(notice=gcp_notice(source, seen)), NOW)
    record = store.runs.get("r1")
    assert record.preemption is not None
    notice = record.preemption.notice
    assert notice is not None
    wanted = (seen + timedelta(seconds=lead_s)).strftime("%Y-%m-%dT%H:%M:%S.750Z")
    assert (notice.not_after, notice.not_after_derived) == (wanted, True)
    assert (notice.left_s, notice.short) == (lead_s, True)  # less than 1800 s
    assert f"derived: the {lead_s} s its cloud documents" in notice.said()
    assert record.message == notice.note


def test_azure_s_http_date_is_recorded_as_iso(tmp_path: Path) -> None:
    worker, store, _, run = tick_worker(tmp_path, proof_timeout_s=10)
    body = {
        "source": "azure-preempt",
        "seen_at": NOW.timestamp(),
        "not_after": "Wed, 04 Mar 2026 05:06:37 GMT",
        "detail": "Preempt Scheduled",
    }
    observe_notices(worker, run, update(notice=json.dumps(body).encode()), NOW)
    notice = store.runs.get("r1").preemption.notice  # type: ignore[union-attr]
    assert notice is not None
    assert (notice.not_after, notice.not_after_derived) == ("2026-03-04T05:06:37Z", False)
    assert (notice.left_s, notice.short) == (30, False)  # 30 s >= 10 s
    assert read_notice(aws_notice(), NOW).not_after == "2026-03-04T05:08:07Z"  # type: ignore[union-attr]
    rebalance = {"source": "aws-rebalance", "seen_at": 1.0, "not_after": None, "detail": None}
    assert read_notice(json.dumps(rebalance).encode(), NOW).not_after is None  # type: ignore[union-attr]


def test_a_job_that_ended_is_not_asked(tmp_path: Path) -> None:
    worker, store, _, run = tick_worker(tmp_path)
    observe_notices(worker, run, update(notice=GCP_NOTICE, status=JobStatus.exited(0)), NOW)
    assert not (Path(run.remote_dir) / "snapshot.request").exists()
    assert store.stops.get("r1") is None
    assert store.runs.get("r1").preemption.notice is not None  # type: ignore[union-attr]


def test_another_request_keeps_its_reason_and_asker(tmp_path: Path) -> None:
    worker, store, _, run = tick_worker(tmp_path)
    observe_notices(worker, run, update(notice=GCP_NOTICE, request="deadline"), NOW)
    assert store.stops.get("r1") is None  # the follow opens it as any request's
    assert store.runs.get("r1").preemption.notice is not None  # type: ignore[union-attr]


def test_a_stop_already_open_stays_and_its_proof_timeout_counts(tmp_path: Path) -> None:
    worker, store, _, run = tick_worker(tmp_path, proof_timeout_s=1800)
    store.stops.open("r1", SnapshotReason.COST, "policy:cost", NOW, 100.0)
    observe_notices(worker, run, update(notice=aws_notice(), request="cost"), NOW)
    stop = store.stops.get("r1")
    assert stop is not None
    assert (stop.reason, stop.asked_by) == (SnapshotReason.COST, "policy:cost")
    notice = store.runs.get("r1").preemption.notice  # type: ignore[union-attr]
    assert notice is not None
    assert not notice.short  # 120 s left, the open stop's proof timeout is 100 s


def test_the_first_notice_stays(tmp_path: Path) -> None:
    worker, store, _, run = tick_worker(tmp_path)
    observe_notices(worker, run, update(notice=GCP_NOTICE, request="preempted"), NOW)
    later = store.runs.get("r1")
    observe_notices(worker, later, update(notice=aws_notice(), request="preempted"), NOW)
    notice = store.runs.get("r1").preemption.notice  # type: ignore[union-attr]
    assert notice is not None
    assert notice.source == "gcp-preempted"


def test_the_watcher_s_state_is_recorded_when_it_changes(tmp_path: Path) -> None:
    worker, store, _, run = tick_worker(tmp_path)
    observe_notices(worker, run, update(notice_state=b"watching aws with curl\n"), NOW)
    first = store.runs.get("r1")
    assert first.preemption is not None
    assert first.preemption.said() == "aws: watching aws with curl"
    observe_notices(worker, first, update(notice_state=b"watching aws with curl\n"), NOW)
    assert store.runs.get("r1") == first  # nothing written
    hostile = b"unavailable: \x1b]8;;http://x\x07neither curl nor wget is installed\r\n"
    observe_notices(worker, first, update(notice_state=hostile), NOW)
    watch = store.runs.get("r1").preemption
    assert watch is not None
    assert watch.watcher is not None
    assert watch.watcher.text == "neither curl nor wget is installed"
    assert watch.said() == f"aws: {NO_CLIENT}"
    assert store.stops.get("r1") is None


@pytest.mark.parametrize(
    "garbage",
    [
        b"{",
        b'{"source": "aws-spot"}',
        b'{"source": "evil", "seen_at": 1, "not_after": null, "detail": null}',
        b"x" * 5000,
        b"\xff\xfe",
    ],
)
def test_a_garbage_notice_is_ignored(tmp_path: Path, garbage: bytes) -> None:
    worker, store, _, run = tick_worker(tmp_path)
    before = store.runs.get("r1")
    observe_notices(worker, run, update(notice=garbage, notice_state=b"what?\n"), NOW)
    assert store.runs.get("r1") == before
    assert store.stops.get("r1") is None


def test_a_notice_s_strange_clock_is_unknown() -> None:
    huge = (
        b'{"source": "aws-spot", "seen_at": 1e300, "not_after": "\\u001b[31mx",'
        b' "detail": "\\u001b[31mt"}'
    )
    notice = read_notice(huge, NOW)
    assert notice is not None
    assert notice.seen_at is None
    assert notice.not_after is None  # no time
    assert notice.detail == "t"  # escapes gone
    with pytest.raises(ProtocolError):
        read_notice(b"[]", NOW)
    assert read_notice(None, NOW) is None


def test_a_run_that_ended_keeps_its_outcome_message(tmp_path: Path) -> None:
    worker, store, _, run = tick_worker(tmp_path, proof_timeout_s=1800)
    store.runs.transition("r1", RunState.STOPPED, message="stopped with a snapshot at step 3")
    observe_notices(worker, run, update(notice=aws_notice(), request="preempted"), NOW)
    record = store.runs.get("r1")
    assert record.message == "stopped with a snapshot at step 3"
    assert record.preemption is not None
    assert record.preemption.notice is not None
    assert record.preemption.notice.short
