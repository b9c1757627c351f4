"""Cloud preemption notices become checkpoints, through the whole service: real
redis-server, Celery worker and beat (bench/harness/pipeline.py), the notice watcher started
beside the job on this machine, and the toy trainer. (The Hugging Face Trainer saving
on a GCP notice is the first preemption of test_chain.py.)

The clouds are the fakes of `bench/harness/fakecloud.py` on loopback: they emulate each
cloud's documented metadata behaviour (AWS IMDSv2 spot `instance-action`, GCP's
`preempted` long poll, Azure's Scheduled Events `Preempt`), since the real metadata
services cannot be reached from here. The service is pointed at them through its
settings (`RUNWARDEN_METADATA_*_URL`), as an operator would point it at a proxy.

A notice -> the watcher writes `notice.json` and the `preempted` request -> the job
saves at its next step end -> the run is `stopped` (reason `preempted`) with the
notice in its record, and its stop was asked by `notice:<source>`; the same with
Redis and every worker killed before the notice (the watcher and the job carry on
alone; the service, back, records what happened); SIGTERM and SIGUSR1 from outside
end the same way; runwarden's own cancel still cancels.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from bench.harness.fakecloud import FAKES, FakeCloud
from bench.harness.pipeline import Pipeline, running_pipeline, toy
from bench.harness.users import as_the_worker
from schemas import Preemption, RunRecord, RunState, SnapshotReason, TargetConfig
from schemas.chain import OnPreempt
from schemas.events import LaunchSpec
from schemas.preemption import NO_CLIENT, iso_utc, parse_not_after
from schemas.protocol import NOTICE_FILE, NOTICE_PID_FILE, SNAPSHOT_FILE, SNAPSHOT_REQUEST

from ...conftest import ROOT, process_alive, wait_for

pytestmark = pytest.mark.slow

CLOUDS = ("aws", "gcp", "azure")
SOURCES = {"aws": "aws-spot", "gcp": "gcp-preempted", "azure": "azure-preempt"}
POLL_S = 0.3
PROOF_TIMEOUT_S = 300
"""Longer than Azure's 30 s and AWS's 120 s of notice (the fakes give what the clouds
document): those notices are recorded as shorter than the proof timeout; the stops
here end with a proof within seconds, so it is never waited for."""
ISO_UTC = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d{3})?Z")


@contextlib.contextmanager
def clouds() -> Iterator[dict[str, FakeCloud]]:
    fakes = {name: FAKES[name]() for name in CLOUDS}
    try:
        yield fakes
    finally:
        for fake in fakes.values():
            fake.close()


def cloud_env(fakes: dict[str, FakeCloud], **extra: str) -> dict[str, str]:
    env = {f"RUNWARDEN_METADATA_{n.upper()}_URL": fake.url for n, fake in fakes.items()}
    env["RUNWARDEN_NOTICE_POLL_S"] = str(POLL_S)
    env["RUNWARDEN_PROOF_TIMEOUT_S"] = str(PROOF_TIMEOUT_S)
    env.update(extra)
    return env


@pytest.fixture(scope="module")
def service(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[Pipeline, dict[str, FakeCloud]]]:
    with clouds() as fakes:
        tmp = tmp_path_factory.mktemp("preemption")
        with running_pipeline(tmp, extra_env=cloud_env(fakes)) as pipeline:
            for name in CLOUDS:  # a target whose runs watch that cloud by default
                workdir = pipeline.workdir / f"on-{name}"
                pipeline.api.add_target(
                    TargetConfig(name=f"on-{name}", kind="local", workdir=str(workdir),
                                 preemption=name, **as_the_worker())
                )  # fmt: skip
            try:
                yield pipeline, fakes
            finally:
                pipeline.kill_jobs()


@pytest.fixture
def quiet(service: tuple[Pipeline, dict[str, FakeCloud]]) -> Iterator[None]:
    """Every fake cloud without a notice after the test."""
    yield
    for fake in service[1].values():
        fake.notice_off()


def launch(pipeline: Pipeline, target: str = "local", **fields: Any) -> RunRecord:
    spec = LaunchSpec(
        target=target, command=toy("--steps", "100000", "--step-time", "0.05"), **fields
    )
    return pipeline.api.launch(spec, wait_s=60)


def watching(pipeline: Pipeline, run_id: str, cloud: str, timeout_s: float = 20) -> RunRecord:
    """Waits until the run's record says its watcher watches `cloud`."""
    said = f"{cloud}: watching {cloud} with curl"

    def seen() -> RunRecord | None:
        run = pipeline.api.get_run(run_id)
        return run if run.preemption is not None and run.preemption.said() == said else None

    found = wait_for(seen, timeout_s=timeout_s, interval_s=0.1)
    assert isinstance(found, RunRecord), (pipeline.api.get_run(run_id), pipeline.logs())
    return found


def cli(pipeline: Pipeline, *args: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "producers.cli", *args],
        env={**pipeline.env, "COLUMNS": "200"},
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def check_preempted(pipeline: Pipeline, run: RunRecord, cloud: str | None) -> None:
    """`run` ended stopped with its `preempted` checkpoint; with `cloud`, its record has
    that cloud's notice and its stop was asked by the notice."""
    assert run.state is RunState.STOPPED, (run, pipeline.logs())
    assert run.snapshot is not None
    assert run.snapshot.reason is SnapshotReason.PREEMPTED
    run_dir = Path(run.remote_dir)
    assert (run_dir / run.snapshot.checkpoint).is_dir()
    assert json.loads((run_dir / SNAPSHOT_FILE).read_text())["reason"] == "preempted"
    assert (run_dir / SNAPSHOT_REQUEST).read_text() == "preempted"
    assert (run_dir / "exit_code").read_text().strip() == "0"
    history = pipeline.api.store.stops.history(run.id)
    assert [stop.reason for stop in history] == [SnapshotReason.PREEMPTED], history
    assert run.preemption is not None
    if cloud is None:
        assert run.preemption.notice is None
        return
    notice = run.preemption.notice
    assert notice is not None, run
    assert notice.source == SOURCES[cloud]
    assert history[0].asked_by == f"notice:{SOURCES[cloud]}"
    written = json.loads((run_dir / NOTICE_FILE).read_text())
    assert written["source"] == SOURCES[cloud]
    assert notice.seen_at is not None
    assert abs(notice.seen_at.timestamp() - written["seen_at"]) < 0.01
    # Recorded ISO 8601 UTC, whatever the cloud wrote: AWS's ISO `time`, Azure's HTTP
    # date; GCP gives none: the 30 s it documents, from when it was seen.
    assert notice.not_after is not None
    assert ISO_UTC.fullmatch(notice.not_after), notice.not_after
    if cloud == "gcp":
        assert written["not_after"] is None
        assert notice.not_after_derived
        assert notice.not_after == iso_utc(notice.seen_at + timedelta(seconds=30))
    else:
        assert not notice.not_after_derived
        assert parse_not_after(written["not_after"]) == parse_not_after(notice.not_after)
    # AWS's two minutes, Azure's and GCP's 30 s: less than the stop's proof timeout, the
    # configured 300 s, or what the run's periodic saves taught (shorter) when a save
    # was recorded before the notice came.
    assert notice.left_s is not None
    assert 0 < notice.left_s <= 120
    assert notice.short
    assert notice.note is not None
    budget_s = (history[0].proof_deadline - history[0].asked_at).total_seconds()
    assert notice.left_s < budget_s <= PROOF_TIMEOUT_S
    assert f"less than the proof timeout ({budget_s:g} s)" in notice.note


# --- a notice, with the service up -----------------------------------------------------


@pytest.mark.parametrize(
    ("cloud", "how"),
    [("aws", "run"), ("gcp", "target"), ("azure", "run")],
    ids=["aws-asked-by-the-run", "gcp-the-target-s-default", "azure-asked-by-the-run"],
)
def test_a_notice_becomes_a_checkpoint(
    service: tuple[Pipeline, dict[str, FakeCloud]], quiet: None, cloud: str, how: str
) -> None:
    pipeline, fakes = service
    if how == "run":
        run = launch(pipeline, preemption=cloud)
    else:
        run = launch(pipeline, target=f"on-{cloud}")
    assert run.preemption == Preemption(cloud=cloud)
    watching(pipeline, run.id, cloud)
    pipeline.wait_step(run.id, 3)
    switched = datetime.now(UTC)
    fakes[cloud].notice_on()
    ended = pipeline.wait_state(run.id)
    check_preempted(pipeline, ended, cloud)
    # The stop was opened at once: within the watcher's poll and a follow tick.
    (stop,) = pipeline.api.store.stops.history(run.id)
    assert (stop.asked_at - switched).total_seconds() < 5, stop
    # It taught its save time, counted from the notice (its request's time).
    samples = [s for s in pipeline.api.store.budgets.saves(run.id) if s.kind == "stop"]
    assert samples, (stop, pipeline.logs())
    assert all(0 < s.seconds < 30 for s in samples), samples
    # What people read.
    text = cli(pipeline, "show", run.id)
    lines = {line.split(None, 1)[0]: line for line in text.splitlines() if line.strip()}
    assert lines["preemption"].split(None, 1)[1].startswith(f"{cloud}: "), text
    assert f"notice       {SOURCES[cloud]}" in text
    record = json.loads(cli(pipeline, "show", run.id, "--json"))
    assert record["preemption"]["notice"]["source"] == SOURCES[cloud]
    assert record["preemption"]["cloud"] == cloud
    # The watcher ended with its notice: its process is gone.
    pid = int((Path(run.remote_dir) / NOTICE_PID_FILE).read_text())
    wait_for(lambda: not process_alive(pid), timeout_s=POLL_S + 3)


def test_the_run_s_off_wins_over_its_target_s_cloud(
    service: tuple[Pipeline, dict[str, FakeCloud]], quiet: None
) -> None:
    pipeline, fakes = service
    run = launch(pipeline, target="on-gcp", preemption="off")
    assert run.preemption is None
    pipeline.wait_step(run.id, 3)
    fakes["gcp"].notice_on()
    time.sleep(2)
    assert pipeline.api.get_run(run.id).state is RunState.RUNNING
    assert not (Path(run.remote_dir) / SNAPSHOT_REQUEST).exists()
    assert not (Path(run.remote_dir) / NOTICE_PID_FILE).exists()
    assert pipeline.api.cancel(run.id).state is RunState.CANCELLED


def test_a_run_lost_after_a_notice_says_so_and_is_not_continued(
    service: tuple[Pipeline, dict[str, FakeCloud]], quiet: None
) -> None:
    pipeline, fakes = service
    plan = OnPreempt(targets=("local",))
    spec = LaunchSpec(target="local", command="sleep 600", preemption="aws", on_preempt=plan)
    run = pipeline.api.launch(spec, wait_s=60)
    watching(pipeline, run.id, "aws")
    fakes["aws"].notice_on()

    def noticed() -> bool:
        watch = pipeline.api.get_run(run.id).preemption
        return watch is not None and watch.notice is not None

    wait_for(noticed, timeout_s=20, interval_s=0.1)
    assert pipeline.api.get_stop(run.id) is not None
    # The job never answers; the machine goes away with it, before any proof.
    assert run.job is not None
    os.killpg(run.job.pid, signal.SIGKILL)
    ended = pipeline.wait_state(run.id)
    assert ended.state is RunState.FAILED, (ended, pipeline.logs())
    assert (ended.snapshot, ended.continuation) == (None, None)
    text = cli(pipeline, "show", run.id)
    lines = dict(line.split(None, 1) for line in text.splitlines() if len(line.split()) > 1)
    assert lines["lost"].startswith("after the aws-spot notice seen "), text
    assert lines["lost"].endswith(
        "the run ended failed before its job proved the preempted snapshot"
    ), text
    assert lines["continued"] == (
        "no: a run lost after a notice has no verified checkpoint of its own; its chain has"
        " no earlier one: launch it again"
    ), text


# --- a notice with Redis and every worker gone -----------------------------------------


@pytest.mark.parametrize("cloud", CLOUDS)
def test_a_notice_with_redis_and_every_worker_dead(tmp_path: Path, cloud: str) -> None:
    with clouds() as fakes, running_pipeline(tmp_path, extra_env=cloud_env(fakes)) as pipeline:
        try:
            run = launch(pipeline, preemption=cloud)
            watching(pipeline, run.id, cloud)
            pipeline.wait_step(run.id, 3)
            run_dir = Path(run.remote_dir)
            pid = int((run_dir / NOTICE_PID_FILE).read_text())
            # SIGKILL for every worker (and its pool), beat and Redis: nothing of the
            # service is left.
            pipeline.kill_worker("w1")
            assert pipeline.beat is not None
            os.killpg(pipeline.beat.pid, signal.SIGKILL)
            pipeline.beat.wait()
            pipeline.beat = None
            pipeline.redis.kill()
            assert process_alive(pid)
            assert not (run_dir / SNAPSHOT_REQUEST).exists()
            fakes[cloud].notice_on()
            # The watcher asks, the job proves and ends, the watcher ends: alone.
            wait_for((run_dir / "exit_code").exists, timeout_s=30)
            assert (run_dir / SNAPSHOT_REQUEST).read_text() == "preempted"
            assert json.loads((run_dir / SNAPSHOT_FILE).read_text())["reason"] == "preempted"
            wait_for(lambda: not process_alive(pid), timeout_s=POLL_S + 3)
            # The service comes back and records what happened while it was away.
            pipeline.redis.start()
            pipeline.start_worker()
            pipeline.start_beat()
            pipeline.wait_ready()
            ended = pipeline.wait_state(run.id, timeout_s=60)
            check_preempted(pipeline, ended, cloud)
            assert ended.preemption is not None
            assert ended.preemption.watcher is not None
            assert ended.preemption.watcher.kind == "done"
        finally:
            pipeline.kill_jobs()


# --- signals from outside, and runwarden's own cancel ----------------------------------


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGUSR1], ids=["TERM", "USR1"])
def test_a_signal_from_outside_gives_the_same_outcome(
    service: tuple[Pipeline, dict[str, FakeCloud]], quiet: None, signum: int
) -> None:
    pipeline, _ = service
    run = launch(pipeline, preemption="aws")
    watching(pipeline, run.id, "aws")
    pipeline.wait_step(run.id, 3)
    assert run.job is not None
    os.killpg(run.job.pid, signum)  # the whole group, as a scheduler signals it
    ended = pipeline.wait_state(run.id)
    check_preempted(pipeline, ended, None)
    pid = int((Path(run.remote_dir) / NOTICE_PID_FILE).read_text())
    wait_for(lambda: not process_alive(pid), timeout_s=POLL_S + 3)  # it ended with the job


def test_runwarden_s_cancel_still_cancels(
    service: tuple[Pipeline, dict[str, FakeCloud]], quiet: None
) -> None:
    pipeline, _ = service
    run = launch(pipeline, preemption="gcp")
    watching(pipeline, run.id, "gcp")
    pipeline.wait_step(run.id, 3)
    pid = int((Path(run.remote_dir) / NOTICE_PID_FILE).read_text())
    record = pipeline.api.cancel(run.id)
    assert record.state is RunState.CANCELLED, record
    assert record.snapshot is None
    assert not (Path(run.remote_dir) / SNAPSHOT_REQUEST).exists()
    assert not (Path(run.remote_dir) / NOTICE_FILE).exists()
    wait_for(lambda: not process_alive(pid), timeout_s=POLL_S + 3)
    assert pipeline.api.store.stops.history(run.id) == []


# --- a target without curl or wget -----------------------------------------------------


def path_without(root: Path, *missing: str) -> str:
    """A PATH of one directory of links to every program of this machine but
    `missing`."""
    bin_dir = root / "bin"
    bin_dir.mkdir()
    for folder in ("/usr/local/bin", "/usr/bin", "/bin"):
        for program in Path(folder).iterdir():
            if program.name not in missing and not (bin_dir / program.name).exists():
                (bin_dir / program.name).symlink_to(program)
    return str(bin_dir)


def test_a_target_without_curl_or_wget_is_said_plainly(tmp_path: Path) -> None:
    # The local target's jobs (and their watcher) get the worker's PATH.
    path = path_without(tmp_path, "curl", "wget")
    (tmp_path / "p").mkdir()
    with clouds() as fakes, running_pipeline(
        tmp_path / "p", extra_env=cloud_env(fakes, PATH=path)
    ) as pipeline:
        try:
            run = launch(pipeline, preemption="aws")

            def unavailable() -> bool:
                watch = pipeline.api.get_run(run.id).preemption
                return watch is not None and watch.watcher is not None

            wait_for(unavailable, timeout_s=20, interval_s=0.1)
            watch = pipeline.api.get_run(run.id).preemption
            assert watch is not None
            assert watch.said() == f"aws: {NO_CLIENT}"
            assert f"preemption   aws: {NO_CLIENT}" in cli(pipeline, "show", run.id)
            pipeline.wait_step(run.id, 2)  # the job runs on, unwatched
            assert fakes["aws"].seen() == []
            assert pipeline.api.cancel(run.id).state is RunState.CANCELLED
        finally:
            pipeline.kill_jobs()
