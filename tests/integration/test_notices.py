"""The preemption-notice watcher (`notice_watch_script`) run for real: under dash and
busybox `sh`, with curl, GNU wget, busybox wget or no client (a PATH holding only
the tools asked for), against the fake metadata services of `tests/fakecloud.py`,
beside a detached stand-in job in a run directory with a hostile name."""

from __future__ import annotations

import json
import shutil
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from schemas.protocol import CANCEL_FILE, EXIT_FILE
from tests.fakecloud import AwsImds, AzureImds, FakeCloud, GcpMetadata, Misbehaviour
from tests.notice_env import (
    ENVS,
    Env,
    Watched,
    closed_port_url,
    processes_naming,
    running,
    wait_until,
)
from workers.executors.notices import parse_notice, parse_notice_state

POLL_S = 0.3
CLOUDS = ("aws", "gcp", "azure")
CLIENT_NAMES = {"curl": "curl", "wget": "GNU wget", "busybox-wget": "busybox wget"}
SOURCES = {"aws": "aws-spot", "gcp": "gcp-preempted", "azure": "azure-preempt"}
# busybox wget cannot PUT: AWS is unavailable with it (tested apart).
WATCHABLE = [
    (env, cloud)
    for env in ENVS
    if env.client != "none"
    for cloud in CLOUDS
    if not (env.client == "busybox-wget" and cloud == "aws")
]
DASH_CURL = Env("dash", "curl")
SOME_ENVS = [DASH_CURL, Env("busybox", "curl"), Env("dash", "wget"), Env("busybox", "busybox-wget")]


@pytest.fixture
def root(tmp_path: Path) -> Iterator[Path]:
    yield tmp_path
    assert not list(tmp_path.rglob("PWNED"))
    assert not Path("/PWNED").exists()


def watched(root: Path, env: Env) -> Watched:
    return Watched(root, env)


def settled(watch: Watched, fake: FakeCloud) -> None:
    """The watcher is gone (exit 0) and left no process, scratch or temporary file."""
    assert watch.proc is not None
    watch.proc.wait(timeout=POLL_S + 2)
    assert watch.proc.returncode == 0, watch.proc.stderr.read() if watch.proc.stderr else ""
    # busybox's timeout leaves a watcher process for up to a second after a request.
    assert wait_until(lambda: not processes_naming(fake.port), 2.5) is not None
    assert not list(Path("/tmp").glob(f"rw-notice.{watch.proc.pid}.*"))
    names = [p.name for p in watch.dir.rglob("*")]
    assert not [n for n in names if "rw-tmp" in n or (n.startswith("notice.") and "." in n[7:])]


def polling(fake: FakeCloud, path: str, count: int = 2) -> None:
    """Waits for `count` answered requests to `path` (GCP: for a long poll under way
    there after an answered read)."""

    def enough() -> bool:
        seen = fake.seen(path)
        if fake.name == "gcp":
            return any(s.query.get("wait_for_change") and s.status is None for s in seen)
        return sum(s.status is not None for s in seen) >= count

    found = wait_until(enough, 10)
    assert found is not None, [(s.method, s.path, s.status) for s in fake.seen()]


WATCHED_PATH = {
    "aws": "/latest/meta-data/spot/instance-action",
    "gcp": "/computeMetadata/v1/instance/preempted",
    "azure": "/metadata/scheduledevents",
}


def answered_as_documented(fake: FakeCloud) -> None:
    """Every request the watcher made was one the service accepts."""
    allowed = {"aws": {200, 404}, "gcp": {200}, "azure": {200}}[fake.name]
    wrong = [(s.method, s.path, s.status) for s in fake.seen() if s.status not in (None, *allowed)]
    assert not wrong


# --- the notice ----------------------------------------------------------------------


@pytest.mark.parametrize(("env", "cloud"), WATCHABLE, ids=lambda v: getattr(v, "id", v))
def test_no_notice_then_a_notice(root: Path, env: Env, cloud: str) -> None:
    watch = watched(root, env)
    try:
        with running(cloud) as fake:
            proc = watch.start(cloud, {cloud: fake.url}, POLL_S)
            polling(fake, WATCHED_PATH[cloud], 3)
            assert watch.state() == f"watching {cloud} with {CLIENT_NAMES[env.client]}"
            assert proc.poll() is None
            assert not watch.request.exists()
            assert not watch.notice.exists()
            switched = fake.notice_on()
            took = wait_until(watch.request.exists, POLL_S + 1)
            assert took is not None
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
    watch = watched(root, env)
    try:
        with running(cloud) as fake:
            watch.request.write_text("cost")
            watch.start(cloud, {cloud: fake.url}, POLL_S)
            polling(fake, WATCHED_PATH[cloud])
            fake.notice_on()
            assert wait_until(watch.notice.exists, POLL_S + 1) is not None
            assert parse_notice(watch.notice.read_bytes()).source == SOURCES[cloud]
            settled(watch, fake)
            assert watch.request.read_text() == "cost"
    finally:
        watch.cleanup()


def test_aws_rebalance_asks_first(root: Path) -> None:
    watch = watched(root, DASH_CURL)
    try:
        with running("aws") as fake:
            assert isinstance(fake, AwsImds)
            watch.start("aws", {"aws": fake.url}, POLL_S)
            polling(fake, "/latest/meta-data/events/recommendations/rebalance")
            fake.rebalance_on()
            assert wait_until(watch.request.exists, POLL_S + 1) is not None
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
    watch = watched(root, env)
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
            assert wait_until(watch.request.exists, POLL_S + 1) is not None
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
    watch = watched(root, env)
    path = f"/computeMetadata/v1/instance/{key}"
    try:
        with running("gcp") as gcp:
            assert isinstance(gcp, GcpMetadata)
            # A long poll period: only the long poll can deliver within a second.
            watch.start("gcp", {"gcp": gcp.url}, 5.0)

            def hanging() -> bool:
                return any(
                    s.query.get("wait_for_change") and s.status is None for s in gcp.seen(path)
                )

            assert wait_until(hanging, 10) is not None
            gcp.set_value(key, value)
            took = wait_until(watch.request.exists, 3)
            assert took is not None
            assert took < 0.5, took
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
            assert wait_until(lambda: not processes_naming(gcp.port), 2.5) is not None
    finally:
        watch.cleanup()


def test_a_live_migration_asks_nothing(root: Path) -> None:
    watch = watched(root, DASH_CURL)
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
    watch = watched(root, env)
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
    watch = watched(root, Env("busybox", "busybox-wget"))
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
            assert wait_until(watch.request.exists, POLL_S + 1) is not None
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
    watch = watched(root, env)
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
            assert wait_until(lambda: not processes_naming(fake.port), 2.5) is not None
            fake.notice_on()
            time.sleep(1.0)
            assert not watch.request.exists()
            assert not watch.notice.exists()
            assert not list(Path("/tmp").glob(f"rw-notice.{proc.pid}.*"))
            if marker != "directory":
                assert watch.state() == "done: the job ended"
    finally:
        watch.cleanup()


def test_sigterm_ends_it_and_its_requests(root: Path) -> None:
    watch = watched(root, DASH_CURL)
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
            assert not list(Path("/tmp").glob(f"rw-notice.{proc.pid}.*"))
            assert wait_until(lambda: not processes_naming(gcp.port), 2.5) is not None
    finally:
        watch.cleanup()


@pytest.mark.parametrize("content", [None, "", "0\n", "1\n", "abc\n", "-5\n", "99999999999\n"])
def test_a_bad_job_pid_ends_it_at_once(root: Path, content: str | None) -> None:
    watch = watched(root, DASH_CURL)
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


# --- choosing: auto, no client, no answer ---------------------------------------------


@pytest.mark.parametrize("env", [DASH_CURL, Env("busybox", "busybox-wget")], ids=lambda e: e.id)
@pytest.mark.parametrize("cloud", CLOUDS)
def test_auto_picks_the_cloud_that_answers(root: Path, env: Env, cloud: str) -> None:
    watch = watched(root, env)
    try:
        with running(cloud) as fake:
            closed = closed_port_url()
            urls = {c: fake.url if c == cloud else closed for c in CLOUDS}
            proc = watch.start("auto", urls, POLL_S)
            if env.client == "busybox-wget" and cloud == "aws":
                proc.wait(timeout=10)
                assert proc.returncode == 4
                assert watch.state() == (
                    "unavailable: no metadata service answered (not asked: aws needs an HTTP"
                    " PUT for its IMDSv2 token, which busybox wget cannot send)"
                )
                return
            polling(fake, WATCHED_PATH[cloud])
            assert watch.state() == f"watching {cloud} with {CLIENT_NAMES[env.client]} (auto)"
            fake.notice_on()
            assert wait_until(watch.request.exists, POLL_S + 1) is not None
            assert parse_notice(watch.notice.read_bytes()).source == SOURCES[cloud]
            settled(watch, fake)
    finally:
        watch.cleanup()


@pytest.mark.parametrize("cloud", CLOUDS)
def test_auto_is_not_fooled_by_another_clouds_service(root: Path, cloud: str) -> None:
    # All three addresses lead to one service (as 169.254.169.254 does on a real
    # cloud): only the cloud it is answers as itself.
    watch = watched(root, DASH_CURL)
    try:
        with running(cloud) as fake:
            watch.start("auto", dict.fromkeys(CLOUDS, fake.url), POLL_S)
            polling(fake, WATCHED_PATH[cloud])
            assert watch.state() == f"watching {cloud} with curl (auto)"
    finally:
        watch.cleanup()


@pytest.mark.parametrize("shell", ["dash", "busybox"])
def test_no_answer_to_auto_is_unavailable(root: Path, shell: str) -> None:
    watch = watched(root, Env(shell, "curl"))
    try:
        started = time.monotonic()
        proc = watch.start("auto", dict.fromkeys(CLOUDS, closed_port_url()), POLL_S)
        proc.wait(timeout=10)
        assert proc.returncode == 4
        assert time.monotonic() - started < 5
        assert watch.state() == "unavailable: no metadata service answered"
    finally:
        watch.cleanup()


@pytest.mark.parametrize("shell", ["dash", "busybox"])
@pytest.mark.parametrize("provider", ["aws", "gcp", "azure", "auto"])
def test_no_client_is_unavailable(root: Path, shell: str, provider: str) -> None:
    watch = watched(root, Env(shell, "none"))
    try:
        proc = watch.start(provider, {}, POLL_S)
        proc.wait(timeout=5)
        assert proc.returncode == 4
        assert watch.state() == "unavailable: neither curl nor wget is installed"
    finally:
        watch.cleanup()


@pytest.mark.parametrize("shell", ["dash", "busybox"])
def test_aws_with_busybox_wget_is_unavailable(root: Path, shell: str) -> None:
    watch = watched(root, Env(shell, "busybox-wget"))
    try:
        with running("aws") as fake:
            proc = watch.start("aws", {"aws": fake.url}, POLL_S)
            proc.wait(timeout=5)
            assert proc.returncode == 4
            assert watch.state() == (
                "unavailable: aws needs an HTTP PUT for its IMDSv2 token, which busybox wget"
                " cannot send; install curl or GNU wget"
            )
            assert fake.seen() == []
    finally:
        watch.cleanup()


def test_wget_without_timeout_is_unavailable(root: Path) -> None:
    watch = watched(root, Env("dash", "wget"))
    try:
        (watch.bin / "timeout").unlink()
        proc = watch.start("gcp", {}, POLL_S)
        proc.wait(timeout=5)
        assert proc.returncode == 4
        assert watch.state().startswith("unavailable: wget is installed but timeout is not")
    finally:
        watch.cleanup()


def test_a_named_cloud_that_does_not_answer_is_still_watched(root: Path) -> None:
    watch = watched(root, DASH_CURL)
    try:
        proc = watch.start("gcp", {"gcp": closed_port_url()}, POLL_S)
        assert wait_until(watch.state, 10) is not None
        assert watch.state() == "watching gcp with curl (no answer yet)"
        time.sleep(1.0)
        assert proc.poll() is None
        (watch.dir / EXIT_FILE).write_text("0\n")
        proc.wait(timeout=POLL_S + 2)
        assert proc.returncode == 0
    finally:
        watch.cleanup()


# --- hostile answers -----------------------------------------------------------------

EVIL = "te\"rm'$(touch PWNED)`touch PWNED`\\\u0007\n;|&<>"


@pytest.mark.parametrize("env", SOME_ENVS, ids=lambda e: e.id)
def test_hostile_fields_are_written_as_safe_json(root: Path, env: Env) -> None:
    watch = watched(root, env)
    try:
        with running("azure") as azure:
            assert isinstance(azure, AzureImds)
            watch.start("azure", {"azure": azure.url}, POLL_S)
            polling(azure, "/metadata/scheduledevents")
            azure.add_event("Preempt", NotBefore=EVIL * 10, EventStatus=EVIL)
            assert wait_until(watch.request.exists, POLL_S + 1) is not None
            raw = watch.notice.read_bytes()
            notice = parse_notice(raw)
            assert len(raw) < 400
            # JSON-escaped on the wire (\" inside a JSON string), kept printable.
            assert notice.not_after is not None
            assert notice.not_after.startswith("te")
            assert len(notice.not_after) <= 64
            assert all(" " <= c <= "~" for c in notice.not_after)
            settled(watch, azure)
    finally:
        watch.cleanup()


def test_hostile_aws_action_and_token(root: Path) -> None:
    watch = watched(root, Env("busybox", "curl"))
    try:
        with running("aws") as aws:
            assert isinstance(aws, AwsImds)
            # A token that would inject a header, then one with shell text: refused.
            aws.misbehaviour = Misbehaviour(body=b"tok\r\nX-Evil: 1", path="/latest/api/token")
            proc = watch.start("aws", {"aws": aws.url}, POLL_S)
            time.sleep(1.0)
            aws.misbehaviour = Misbehaviour(body=b"$(touch PWNED)", path="/latest/api/token")
            time.sleep(1.0)
            assert [s.method for s in aws.seen()] == ["PUT"] * len(aws.seen())
            assert proc.poll() is None
            aws.misbehaviour = None
            polling(aws, WATCHED_PATH["aws"])
            aws.next_action = EVIL
            aws.notice_on()
            assert wait_until(watch.request.exists, POLL_S + 1) is not None
            notice = parse_notice(watch.notice.read_bytes())
            # The action ends at its first '"', escaped in the body as \".
            assert notice.detail == "te\\"
            settled(watch, aws)
    finally:
        watch.cleanup()


@pytest.mark.parametrize(
    "env", [DASH_CURL, Env("dash", "wget"), Env("busybox", "busybox-wget")], ids=lambda e: e.id
)
def test_huge_and_garbage_answers_do_no_harm(root: Path, env: Env) -> None:
    watch = watched(root, env)
    try:
        with running("gcp") as gcp:
            assert isinstance(gcp, GcpMetadata)
            # 64 MiB that starts like the notice: not "TRUE", so not a notice.
            gcp.misbehaviour = Misbehaviour(
                body=b"TRUE" + b"A" * (1 << 20),
                repeat=64,
                headers={"ETag": "ab$(touch PWNED)cd", "Metadata-Flavor": "Google"},
            )
            proc = watch.start("gcp", {"gcp": gcp.url}, POLL_S)
            time.sleep(2.0)
            assert proc.poll() is None
            assert not watch.request.exists()
            scratch = list(Path("/tmp").glob(f"rw-notice.{proc.pid}.*/*"))
            assert scratch
            assert all(p.stat().st_size <= 65536 for p in scratch)
            gcp.misbehaviour = Misbehaviour(body=b'{"garbage": [1, 2', status=200)
            time.sleep(1.0)
            assert proc.poll() is None
            assert not watch.request.exists()
            gcp.misbehaviour = None
            gcp.notice_on()
            assert wait_until(watch.request.exists, POLL_S + 2) is not None
            settled(watch, gcp)
    finally:
        watch.cleanup()


@pytest.mark.parametrize("env", [DASH_CURL, Env("busybox", "wget")], ids=lambda e: e.id)
def test_a_slow_server_is_cut_and_the_job_end_still_seen(root: Path, env: Env) -> None:
    watch = watched(root, env)
    try:
        with running("aws") as aws:
            aws.misbehaviour = Misbehaviour(body=b"x" * 1000, drip_s=0.2)
            proc = watch.start("aws", {"aws": aws.url}, POLL_S)
            time.sleep(3.0)
            assert proc.poll() is None
            assert watch.state() == f"watching aws with {CLIENT_NAMES[env.client]} (no answer yet)"
            (watch.dir / EXIT_FILE).write_text("0\n")
            proc.wait(timeout=POLL_S + 2)
            assert wait_until(lambda: not processes_naming(aws.port), 2.5) is not None
            assert not watch.request.exists()
    finally:
        watch.cleanup()


def test_garbage_from_azure_is_no_notice(root: Path) -> None:
    watch = watched(root, DASH_CURL)
    try:
        with running("azure") as azure:
            azure.misbehaviour = Misbehaviour(
                body=b'<html>{"EventType": "Reboot"} "Preempt" </html>', path="/metadata/scheduled"
            )
            proc = watch.start("azure", {"azure": azure.url}, POLL_S)
            time.sleep(1.5)
            assert proc.poll() is None
            assert not watch.request.exists()
            assert len(azure.seen("/metadata/scheduledevents")) >= 3
    finally:
        watch.cleanup()


def test_the_scratch_directory_is_private_to_one_watcher(root: Path) -> None:
    watch = watched(root, DASH_CURL)
    try:
        with running("gcp") as gcp:
            first = watch.start("gcp", {"gcp": gcp.url}, POLL_S)
            second = watch.start("gcp", {"gcp": gcp.url}, POLL_S)  # another one beside it
            polling(gcp, "/computeMetadata/v1/instance/preempted", 4)
            assert len(list(Path("/tmp").glob(f"rw-notice.{first.pid}.*"))) == 1
            assert len(list(Path("/tmp").glob(f"rw-notice.{second.pid}.*"))) == 1
            gcp.notice_on()
            assert wait_until(watch.request.exists, POLL_S + 1) is not None
            first.wait(timeout=POLL_S + 2)
            second.wait(timeout=POLL_S + 2)
            assert (first.returncode, second.returncode) == (0, 0)
            assert json.loads(watch.notice.read_text())["source"] == "gcp-preempted"
            assert wait_until(lambda: not processes_naming(gcp.port), 3) is not None
            assert sorted(p.name for p in (watch.dir / ".runwarden").iterdir()) == [
                "notice.pid",
                "notice.state",
            ]
    finally:
        watch.cleanup()


def test_no_scratch_directory_is_unavailable(root: Path) -> None:
    watch = watched(root, DASH_CURL)
    try:
        proc = watch.start("gcp", {}, POLL_S, {"TMPDIR": str(root / "missing")})
        proc.wait(timeout=5)
        assert proc.returncode == 5
        assert watch.state() == (
            "unavailable: cannot create its scratch directory in $TMPDIR or /tmp"
        )
    finally:
        watch.cleanup()
