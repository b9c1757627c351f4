"""The preemption-notice watcher (`notice_watch_script`) run for real: under dash and
busybox `sh`, with curl, GNU wget or busybox wget (a PATH holding only the tools
asked for), against the fake metadata services of `bench/harness/fakecloud.py`, beside a
detached stand-in job in a run directory with a hostile name: notices delivered,
GCP's long poll, Azure's events, and the watcher's end with the job's."""

from __future__ import annotations

import shutil
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench.harness.fakecloud import AwsImds, AzureImds, GcpMetadata, Seen
from bench.harness.notice_env import (
    Env,
    Watched,
    closed_port_url,
    none_naming,
    processes_naming,
    running,
    wait_until,
)
from schemas.protocol import CANCEL_FILE, EXIT_FILE
from tests.notice_checks import (
    CLIENT_NAMES,
    DASH_CURL,
    POLL_S,
    SEEN_S,
    SOME_ENVS,
    SOURCES,
    WATCHABLE,
    WATCHED_PATH,
    answered_as_documented,
    polling,
    settled,
)
from workers.executors.notices import parse_notice, parse_notice_state


@pytest.fixture
def root(tmp_path: Path) -> Iterator[Path]:
    yield tmp_path
    assert not list(tmp_path.rglob("PWNED"))
    assert not Path("/PWNED").exists()


# --- the notice ----------------------------------------------------------------------


@pytest.mark.parametrize(("env", "cloud"), WATCHABLE, ids=lambda v: getattr(v, "id", v))
def test_no_notice_then_a_notice(root: Path, env: Env, cloud: str) -> None:
    watch = Watched(root, env)
    try:
        with running(cloud) as fake:
            proc = watch.start(cloud, {cloud: fake.url}, POLL_S)
            polling(fake, WATCHED_PATH[cloud], 3)
            assert watch.state() == f"watching {cloud} with {CLIENT_NAMES[env.client]}"
            assert proc.poll() is None
            assert not watch.request.exists()
            assert not watch.notice.exists()
            switched = fake.notice_on()
            took = wait_until(watch.request.exists, SEEN_S)
            assert took is not None, f"no snapshot.request within {SEEN_S} s of the notice"
            assert watch.request.read_text() == "preempted"
            notice = parse_notice(watch.notice.read_bytes())
            assert notice.source == SOURCES[cloud]
            assert notice.seen_at is not None
            assert abs(notice.seen_at - time.time()) < 5
            if cloud == "aws":
                assert isinstance(fake, AwsImds)
                assert fake.action is not None
                assert (notice.detail, notice.not_after) == ("terminate", fake.action["time"])
            elif cloud == "gcp":
                assert (notice.detail, notice.not_after) == ("TRUE", None)
            else:
                assert isinstance(fake, AzureImds)
                assert notice.not_after == fake.events[0]["NotBefore"]
                assert notice.detail == "Preempt Scheduled"
            settled(watch, fake)
            assert time.monotonic() - switched < 2 * POLL_S + 3
            state = parse_notice_state((watch.dir / ".runwarden/notice.state").read_bytes())
            assert state.text == f"recorded the {SOURCES[cloud]} notice"
            assert watch.pid_file.read_text() == f"{proc.pid}\n"
            answered_as_documented(fake)
    finally:
        watch.cleanup()


@pytest.mark.parametrize("env", SOME_ENVS, ids=lambda e: e.id)
@pytest.mark.parametrize("cloud", ["gcp", "azure"])
def test_an_existing_request_is_kept_and_the_notice_written(
    root: Path, env: Env, cloud: str
) -> None:
    watch = Watched(root, env)
    try:
        with running(cloud) as fake:
            watch.request.write_text("cost")
            watch.start(cloud, {cloud: fake.url}, POLL_S)
            polling(fake, WATCHED_PATH[cloud])
            fake.notice_on()
            assert wait_until(watch.notice.exists, SEEN_S) is not None
            assert parse_notice(watch.notice.read_bytes()).source == SOURCES[cloud]
            settled(watch, fake)
            assert watch.request.read_text() == "cost"
    finally:
        watch.cleanup()


def test_aws_rebalance_asks_first(root: Path) -> None:
    watch = Watched(root, DASH_CURL)
    try:
        with running("aws") as fake:
            assert isinstance(fake, AwsImds)
            watch.start("aws", {"aws": fake.url}, POLL_S)
            polling(fake, "/latest/meta-data/events/recommendations/rebalance")
            fake.rebalance_on()
            assert wait_until(watch.request.exists, SEEN_S) is not None
            notice = parse_notice(watch.notice.read_bytes())
            assert fake.rebalance is not None
            assert notice.source == "aws-rebalance"
            assert notice.not_after is None
            assert notice.detail == f"rebalance noticeTime={fake.rebalance['noticeTime']}"
            settled(watch, fake)
    finally:
        watch.cleanup()


@pytest.mark.parametrize("env", [DASH_CURL, Env("busybox", "wget")], ids=lambda e: e.id)
def test_an_expired_aws_token_is_renewed(root: Path, env: Env) -> None:
    watch = Watched(root, env)
    try:
        with running("aws") as fake:
            assert isinstance(fake, AwsImds)
            watch.start("aws", {"aws": fake.url}, POLL_S)
            polling(fake, WATCHED_PATH["aws"], 2)
            puts = len(fake.seen("/latest/api/token"))
            fake.expire_tokens()
            assert wait_until(lambda: len(fake.seen("/latest/api/token")) > puts, 5) is not None
            polling(fake, WATCHED_PATH["aws"], len(fake.seen(WATCHED_PATH["aws"])) + 2)
            refused = [s for s in fake.seen() if s.status == 401]
            assert refused  # it met the expiry, then renewed
            latest = fake.seen(WATCHED_PATH["aws"])[-1]
            assert latest.status == 404
            assert latest.header("X-aws-ec2-metadata-token") in fake.tokens
            for put in fake.seen("/latest/api/token"):
                assert put.method == "PUT"
                assert put.header("X-aws-ec2-metadata-token-ttl-seconds") == "21600"
            fake.notice_on()
            assert wait_until(watch.request.exists, SEEN_S) is not None
            settled(watch, fake)
    finally:
        watch.cleanup()


# --- GCP long poll -------------------------------------------------------------------


@pytest.mark.parametrize("env", SOME_ENVS, ids=lambda e: e.id)
@pytest.mark.parametrize(
    ("key", "value", "source"),
    [
        ("preempted", "TRUE", "gcp-preempted"),
        ("maintenance-event", "TERMINATE_ON_HOST_MAINTENANCE", "gcp-maintenance"),
    ],
)
def test_the_gcp_long_poll_delivers_at_once(
    root: Path, env: Env, key: str, value: str, source: str
) -> None:
    watch = Watched(root, env)
    path = f"/computeMetadata/v1/instance/{key}"
    try:
        with running("gcp") as gcp:
            assert isinstance(gcp, GcpMetadata)
            # A poll period four times the delivery asked: only the long poll can deliver
            # in time (the script ends a poll period after its notice).
            watch.start("gcp", {"gcp": gcp.url}, 2.0)

            def hanging() -> list[Seen]:
                return [
                    s for s in gcp.seen(path) if s.query.get("wait_for_change") and s.status is None
                ]

            assert wait_until(hanging, 10) is not None
            (poll,) = hanging()
            gcp.set_value(key, value)
            took = wait_until(watch.request.exists, 3)
            assert took is not None
            assert took < 0.5, took
            # The long poll it held delivered (not a new poll); its status is noted once
            # the answer is sent, which may be after the script acted on it.
            assert wait_until(lambda: poll.status == 200, 2) is not None, poll
            assert parse_notice(watch.notice.read_bytes()).detail == value
            assert parse_notice(watch.notice.read_bytes()).source == source
            polls = [s for s in gcp.seen(path) if s.query.get("wait_for_change")]
            for poll in polls:
                assert poll.query["wait_for_change"] == ["true"]
                assert 0 < int(poll.query["timeout_sec"][0]) <= 30
                assert poll.query["last_etag"] == [
                    GcpMetadata.etag("FALSE" if key == "preempted" else "NONE")
                ]
                assert poll.header("Metadata-Flavor") == "Google"
            watch.proc.wait(timeout=7)  # type: ignore[union-attr]
            assert none_naming(gcp.port, 2.5)
    finally:
        watch.cleanup()


def test_a_live_migration_asks_nothing(root: Path) -> None:
    watch = Watched(root, DASH_CURL)
    try:
        with running("gcp") as gcp:
            assert isinstance(gcp, GcpMetadata)
            proc = watch.start("gcp", {"gcp": gcp.url}, POLL_S)
            polling(gcp, "/computeMetadata/v1/instance/maintenance-event")
            gcp.set_value("maintenance-event", "MIGRATE_ON_HOST_MAINTENANCE")
            time.sleep(1.0)
            gcp.set_value("maintenance-event", "NONE")
            time.sleep(1.0)
            assert proc.poll() is None
            assert not watch.request.exists()
            assert not watch.notice.exists()
            n = len(gcp.seen("/computeMetadata/v1/instance/maintenance-event"))
            assert n >= 3  # it followed each change
    finally:
        watch.cleanup()


@pytest.mark.parametrize("env", [DASH_CURL, Env("busybox", "busybox-wget")], ids=lambda e: e.id)
def test_an_erroring_gcp_server_is_not_asked_in_a_busy_loop(root: Path, env: Env) -> None:
    watch = Watched(root, env)
    try:
        with running("gcp") as gcp:
            assert isinstance(gcp, GcpMetadata)
            gcp.unavailable = True  # 503 to everything
            proc = watch.start("gcp", {"gcp": gcp.url}, 0.5)
            time.sleep(0.5)
            before = len(gcp.seen())
            time.sleep(3.0)
            during = len(gcp.seen()) - before
            assert during <= 2 * (3.0 / 0.5 + 2), during  # two keys, one try a period each
            assert proc.poll() is None
            gcp.unavailable = False
            gcp.notice_on()
            assert wait_until(watch.request.exists, 0.5 + 2) is not None
            settled(watch, gcp)
    finally:
        watch.cleanup()


# --- Azure ---------------------------------------------------------------------------


def test_azure_ignores_other_events_and_finds_the_preempt_one(root: Path) -> None:
    watch = Watched(root, Env("busybox", "busybox-wget"))
    try:
        with running("azure") as azure:
            assert isinstance(azure, AzureImds)
            proc = watch.start("azure", {"azure": azure.url}, POLL_S)
            polling(azure, "/metadata/scheduledevents")
            azure.add_event("Reboot", Description='{"EventType": "Preempt"} {')
            azure.add_event("Freeze", EventSource="User")
            azure.add_event("Terminate")
            time.sleep(4 * POLL_S)
            assert proc.poll() is None
            assert not watch.request.exists()
            azure.add_event("Preempt", NotBefore="Mon, 19 Sep 2016 18:29:47 GMT")
            assert wait_until(watch.request.exists, SEEN_S) is not None
            notice = parse_notice(watch.notice.read_bytes())
            assert (notice.source, notice.not_after) == (
                "azure-preempt",
                "Mon, 19 Sep 2016 18:29:47 GMT",
            )
            for seen in azure.seen("/metadata/scheduledevents"):
                assert seen.query["api-version"] == ["2020-07-01"]
                assert seen.header("Metadata") == "true"
            settled(watch, azure)
    finally:
        watch.cleanup()


# --- the job's end -------------------------------------------------------------------


@pytest.mark.parametrize("marker", [EXIT_FILE, CANCEL_FILE, "group", "directory"])
@pytest.mark.parametrize(
    ("env", "cloud"),
    [
        (DASH_CURL, "gcp"),
        (DASH_CURL, "aws"),
        (Env("busybox", "busybox-wget"), "gcp"),
        (Env("dash", "wget"), "azure"),
    ],
    ids=lambda v: getattr(v, "id", v),
)
def test_it_exits_with_the_job_and_writes_nothing(
    root: Path, env: Env, cloud: str, marker: str
) -> None:
    watch = Watched(root, env)
    try:
        with running(cloud) as fake:
            proc = watch.start(cloud, {cloud: fake.url}, POLL_S)
            polling(fake, WATCHED_PATH[cloud])
            ended = time.monotonic()
            if marker == "group":
                watch.end_job()
            elif marker == "directory":
                shutil.rmtree(watch.dir)
            else:
                (watch.dir / marker).write_text("0\n")
            proc.wait(timeout=POLL_S + 2)
            assert time.monotonic() - ended < POLL_S + 1.5
            assert proc.returncode == 0
            # Its loops and their requests (a GCP long poll in flight) went too.
            assert none_naming(fake.port, 2.5)
            fake.notice_on()
            time.sleep(1.0)
            assert not watch.request.exists()
            assert not watch.notice.exists()
            assert not watch.scratch(proc)
            if marker != "directory":
                assert watch.state() == "done: the job ended"
    finally:
        watch.cleanup()


def test_sigterm_ends_it_and_its_requests(root: Path) -> None:
    watch = Watched(root, DASH_CURL)
    try:
        with running("gcp") as gcp:
            proc = watch.start("gcp", {"gcp": gcp.url}, POLL_S)
            polling(gcp, "/computeMetadata/v1/instance/preempted")
            time.sleep(0.5)  # long polls under way
            assert len(processes_naming(gcp.port)) > 1
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=POLL_S + 2)
            assert proc.returncode == 0
            assert watch.state() == "done: stopped by a signal"
            assert not watch.scratch(proc)
            assert none_naming(gcp.port, 2.5)
    finally:
        watch.cleanup()


@pytest.mark.parametrize("content", [None, "", "0\n", "1\n", "abc\n", "-5\n", "99999999999\n"])
def test_a_bad_job_pid_ends_it_at_once(root: Path, content: str | None) -> None:
    watch = Watched(root, DASH_CURL)
    try:
        pid_file = watch.dir / "job.pid"
        if content is None:
            pid_file.unlink()
        else:
            pid_file.write_text(content)
        proc = watch.start("gcp", {"gcp": closed_port_url()}, POLL_S)
        proc.wait(timeout=5)
        assert proc.returncode == 3
        assert not (watch.dir / ".runwarden").exists()
    finally:
        watch.cleanup()
