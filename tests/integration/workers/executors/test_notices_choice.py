"""The preemption-notice watcher run for real (as in `test_notices.py`): how it
chooses (auto, no client, no answer, no scratch directory) and what hostile answers
(huge, garbage, slow, shell text in fields, tokens and ETags) cannot do."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench.harness.fakecloud import AwsImds, AzureImds, GcpMetadata, Misbehaviour
from bench.harness.notice_env import (
    Env,
    Watched,
    closed_port_url,
    none_naming,
    running,
    wait_until,
)
from schemas.protocol import EXIT_FILE
from tests.notice_checks import (
    CLIENT_NAMES,
    CLOUDS,
    DASH_CURL,
    POLL_S,
    SEEN_S,
    SOME_ENVS,
    SOURCES,
    WATCHED_PATH,
    polling,
    settled,
)
from workers.executors.notices import parse_notice


@pytest.fixture
def root(tmp_path: Path) -> Iterator[Path]:
    yield tmp_path
    assert not list(tmp_path.rglob("PWNED"))
    assert not Path("/PWNED").exists()


# --- choosing: auto, no client, no answer ---------------------------------------------


@pytest.mark.parametrize("env", [DASH_CURL, Env("busybox", "busybox-wget")], ids=lambda e: e.id)
@pytest.mark.parametrize("cloud", CLOUDS)
def test_auto_picks_the_cloud_that_answers(root: Path, env: Env, cloud: str) -> None:
    watch = Watched(root, env)
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
            assert wait_until(watch.request.exists, SEEN_S) is not None
            assert parse_notice(watch.notice.read_bytes()).source == SOURCES[cloud]
            settled(watch, fake)
    finally:
        watch.cleanup()


@pytest.mark.parametrize("cloud", CLOUDS)
def test_auto_is_not_fooled_by_another_clouds_service(root: Path, cloud: str) -> None:
    # All three addresses lead to one service (as 169.254.169.254 does on a real
    # cloud): only the cloud it is answers as itself.
    watch = Watched(root, DASH_CURL)
    try:
        with running(cloud) as fake:
            watch.start("auto", dict.fromkeys(CLOUDS, fake.url), POLL_S)
            polling(fake, WATCHED_PATH[cloud])
            assert watch.state() == f"watching {cloud} with curl (auto)"
    finally:
        watch.cleanup()


@pytest.mark.parametrize("shell", ["dash", "busybox"])
def test_no_answer_to_auto_is_unavailable(root: Path, shell: str) -> None:
    watch = Watched(root, Env(shell, "curl"))
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
    watch = Watched(root, Env(shell, "none"))
    try:
        proc = watch.start(provider, {}, POLL_S)
        proc.wait(timeout=5)
        assert proc.returncode == 4
        assert watch.state() == "unavailable: neither curl nor wget is installed"
    finally:
        watch.cleanup()


@pytest.mark.parametrize("shell", ["dash", "busybox"])
def test_aws_with_busybox_wget_is_unavailable(root: Path, shell: str) -> None:
    watch = Watched(root, Env(shell, "busybox-wget"))
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
    watch = Watched(root, Env("dash", "wget"))
    try:
        (watch.bin / "timeout").unlink()
        proc = watch.start("gcp", {}, POLL_S)
        proc.wait(timeout=5)
        assert proc.returncode == 4
        assert watch.state().startswith("unavailable: wget is installed but timeout is not")
    finally:
        watch.cleanup()


def test_a_named_cloud_that_does_not_answer_is_still_watched(root: Path) -> None:
    watch = Watched(root, DASH_CURL)
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
    watch = Watched(root, env)
    try:
        with running("azure") as azure:
            assert isinstance(azure, AzureImds)
            watch.start("azure", {"azure": azure.url}, POLL_S)
            polling(azure, "/metadata/scheduledevents")
            azure.add_event("Preempt", NotBefore=EVIL * 10, EventStatus=EVIL)
            assert wait_until(watch.request.exists, SEEN_S) is not None
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
    watch = Watched(root, Env("busybox", "curl"))
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
            assert wait_until(watch.request.exists, SEEN_S) is not None
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
    watch = Watched(root, env)
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
            scratch = [f for d in watch.scratch(proc) for f in d.iterdir()]
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
    watch = Watched(root, env)
    try:
        with running("aws") as aws:
            aws.misbehaviour = Misbehaviour(body=b"x" * 1000, drip_s=0.2)
            proc = watch.start("aws", {"aws": aws.url}, POLL_S)
            time.sleep(3.0)
            assert proc.poll() is None
            assert watch.state() == f"watching aws with {CLIENT_NAMES[env.client]} (no answer yet)"
            (watch.dir / EXIT_FILE).write_text("0\n")
            proc.wait(timeout=POLL_S + 2)
            assert none_naming(aws.port, 2.5)
            assert not watch.request.exists()
    finally:
        watch.cleanup()


def test_garbage_from_azure_is_no_notice(root: Path) -> None:
    watch = Watched(root, DASH_CURL)
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
    watch = Watched(root, DASH_CURL)
    try:
        with running("gcp") as gcp:
            first = watch.start("gcp", {"gcp": gcp.url}, POLL_S)
            second = watch.start("gcp", {"gcp": gcp.url}, POLL_S)  # another one beside it
            polling(gcp, "/computeMetadata/v1/instance/preempted", 4)
            assert len(watch.scratch(first)) == 1
            assert len(watch.scratch(second)) == 1
            gcp.notice_on()
            assert wait_until(watch.request.exists, SEEN_S) is not None
            first.wait(timeout=POLL_S + 2)
            second.wait(timeout=POLL_S + 2)
            assert (first.returncode, second.returncode) == (0, 0)
            assert json.loads(watch.notice.read_text())["source"] == "gcp-preempted"
            assert none_naming(gcp.port, 3)
            assert sorted(p.name for p in (watch.dir / ".runwarden").iterdir()) == [
                "notice.pid",
                "notice.state",
            ]
    finally:
        watch.cleanup()


def test_no_scratch_directory_is_unavailable(root: Path) -> None:
    watch = Watched(root, DASH_CURL)
    try:
        proc = watch.start("gcp", {}, POLL_S, {"TMPDIR": str(root / "missing")})
        proc.wait(timeout=5)
        assert proc.returncode == 5
        assert watch.state() == (
            "unavailable: cannot create its scratch directory in $TMPDIR or /tmp"
        )
    finally:
        watch.cleanup()
