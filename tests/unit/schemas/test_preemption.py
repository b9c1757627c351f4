"""Preemption notices in the schemas: which cloud a run watches (its own setting, else
its target's), the metadata base URLs (settings, job command), what a run record keeps
of a notice and of the watcher, and how a short notice is told."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from pydantic import ValidationError

from schemas import JobCommand, Preemption, RunNotice, RunRecord, Settings, TargetConfig
from schemas.events import LaunchSpec
from schemas.preemption import (
    DEFAULT_METADATA_URLS,
    DOCUMENTED_LEAD_S,
    NO_CLIENT,
    WatcherState,
    check_metadata_url,
    derived_not_after,
    iso_utc,
    notice_left_s,
    parse_not_after,
    short_notice,
    watched_cloud,
)

T0 = datetime(2026, 3, 4, 5, 6, 7, tzinfo=UTC)
HOSTILE_URLS = [
    "http://h/$(touch PWNED)",
    "http://h'; touch PWNED; '",
    "http://h\nx",
    "http://h :80",
    "https://169.254.169.254",
    "http://user:pw@169.254.169.254",
    "http://169.254.169.254/latest",
    "http://169.254.169.254?x=1",
    "169.254.169.254",
    "",
]


@pytest.mark.parametrize(
    ("run", "target", "watched"),
    [
        (None, "off", None),
        (None, "gcp", "gcp"),
        ("aws", "off", "aws"),
        ("azure", "gcp", "azure"),
        ("off", "aws", None),
        ("auto", "off", "auto"),
    ],
)
def test_the_run_s_own_setting_wins_over_its_target_s(
    run: Any, target: Any, watched: str | None
) -> None:
    assert watched_cloud(run, target) == watched


@pytest.mark.parametrize("url", ["http://169.254.169.254", "http://127.0.0.1:8080/", "http://[::1]:1"])
def test_metadata_urls(url: str) -> None:
    assert check_metadata_url(url) == url.rstrip("/")


@pytest.mark.parametrize("url", HOSTILE_URLS)
def test_a_metadata_url_that_is_not_http_host_port_is_refused(url: str) -> None:
    with pytest.raises(ValueError, match="is not http://host"):
        check_metadata_url(url)


def test_the_settings_default_to_the_documented_services(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name in ("AWS", "GCP", "AZURE"):
        monkeypatch.delenv(f"RUNWARDEN_METADATA_{name}_URL", raising=False)
    monkeypatch.delenv("RUNWARDEN_NOTICE_POLL_S", raising=False)
    settings = Settings()
    assert settings.metadata_urls == {
        "aws": "http://169.254.169.254",
        "gcp": "http://metadata.google.internal",
        "azure": "http://169.254.169.254",
    }
    assert settings.metadata_urls == DEFAULT_METADATA_URLS
    assert settings.notice_poll_s == 1.0


def test_the_settings_read_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RUNWARDEN_METADATA_GCP_URL", "http://127.0.0.1:4242/")
    monkeypatch.setenv("RUNWARDEN_METADATA_AZURE_URL", "http://10.0.0.1")
    monkeypatch.setenv("RUNWARDEN_NOTICE_POLL_S", "0.25")
    settings = Settings()
    assert settings.metadata_gcp_url == "http://127.0.0.1:4242"
    assert settings.metadata_urls["azure"] == "http://10.0.0.1"
    assert settings.notice_poll_s == 0.25


@pytest.mark.parametrize("url", HOSTILE_URLS)
def test_the_settings_refuse_a_hostile_url(monkeypatch: pytest.MonkeyPatch, url: str) -> None:
    monkeypatch.setenv("RUNWARDEN_METADATA_AWS_URL", url)
    with pytest.raises(ValidationError, match="metadata_aws_url"):
        Settings()


@pytest.mark.parametrize("poll", ["0", "-1", "3601", "nan", "inf"])
def test_the_settings_refuse_a_poll_out_of_range(
    monkeypatch: pytest.MonkeyPatch, poll: str
) -> None:
    monkeypatch.setenv("RUNWARDEN_NOTICE_POLL_S", poll)
    with pytest.raises(ValidationError, match="notice_poll_s"):
        Settings()


def test_a_target_watches_nothing_by_default() -> None:
    target = TargetConfig(name="t", kind="local", workdir="/w")
    assert target.preemption == "off"
    assert TargetConfig(name="t", kind="local", workdir="/w", preemption="gcp").preemption == "gcp"
    with pytest.raises(ValidationError, match="preemption"):
        TargetConfig(name="t", kind="local", workdir="/w", preemption="oracle")


def test_a_launch_takes_its_target_s_setting_unless_it_gives_one() -> None:
    assert LaunchSpec(target="t", command="x").preemption is None
    assert LaunchSpec(target="t", command="x", preemption="off").preemption == "off"
    with pytest.raises(ValidationError, match="preemption"):
        LaunchSpec.model_validate({"target": "t", "command": "x", "preemption": "AWS"})


def test_a_job_command_checks_its_watcher() -> None:
    job = JobCommand(
        dir="/w/r", script="x", preemption="aws", metadata_urls={"aws": "http://127.0.0.1:9/"}
    )
    assert job.metadata_urls == {"aws": "http://127.0.0.1:9"}
    assert job.notice_poll_s == 1.0
    assert JobCommand(dir="/w/r", script="x").preemption is None
    with pytest.raises(ValidationError, match="no metadata service is named"):
        JobCommand(dir="/w/r", script="x", metadata_urls={"oracle": "http://h"})
    for url in HOSTILE_URLS:
        with pytest.raises(ValidationError, match="is not http://host"):
            JobCommand(dir="/w/r", script="x", metadata_urls={"gcp": url})
    with pytest.raises(ValidationError, match="preemption"):
        JobCommand(dir="/w/r", script="x", preemption="off")
    with pytest.raises(ValidationError, match="notice_poll_s"):
        JobCommand(dir="/w/r", script="x", notice_poll_s=0)


def test_a_record_without_a_watch_still_reads() -> None:
    old = (
        '{"id": "20260304-050607-a", "target": "t", "created": "2026-03-04T05:06:07Z",'
        ' "remote_dir": "/w/r"}'
    )
    assert RunRecord.model_validate_json(old).preemption is None
    record = RunRecord.model_validate_json(old).model_copy(
        update={"preemption": Preemption(cloud="gcp")}
    )
    again = RunRecord.model_validate_json(record.model_dump_json())
    assert again.preemption == Preemption(cloud="gcp")


# --- the notice's time -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "when"),
    [
        ("2026-03-04T05:08:07Z", T0 + timedelta(minutes=2)),  # AWS `time`
        ("Wed, 04 Mar 2026 05:06:37 GMT", T0 + timedelta(seconds=30)),  # Azure `NotBefore`
        ("2026-03-04T05:06:07", T0),  # no zone: UTC
        ("2026-03-04T06:06:07+01:00", T0),
    ],
)
def test_not_after_as_each_cloud_writes_it(text: str, when: datetime) -> None:
    assert parse_not_after(text) == when


@pytest.mark.parametrize(
    "text", [None, "", "soon", "Wed, 99 Foo", "2026-13-45T99:00:00Z", "9" * 64]
)
def test_a_not_after_that_is_no_time_is_none(text: str | None) -> None:
    assert parse_not_after(text) is None


def notice(**changes: Any) -> RunNotice:
    base: dict[str, Any] = {
        "source": "aws-spot",
        "seen_at": T0,
        "not_after": "2026-03-04T05:08:07Z",
        "detail": "terminate",
        "recorded_at": T0 + timedelta(seconds=1),
    }
    return RunNotice(**{**base, **changes})


def test_a_notice_shorter_than_the_proof_timeout_is_told() -> None:
    told = short_notice(notice(), 1800)
    assert told.left_s == 120
    assert told.short
    assert told.note == (
        "the aws-spot notice leaves 120 s, less than the proof timeout (1800 s): the snapshot"
        " was asked at once"
    )
    roomy = short_notice(notice(), 60)
    assert (roomy.left_s, roomy.short, roomy.note) == (120, False, None)
    assert short_notice(notice(), 120).short is False  # exactly enough is enough


def test_a_notice_seen_late_leaves_nothing() -> None:
    late = short_notice(notice(seen_at=T0 + timedelta(minutes=5)), 30)
    assert late.left_s == -180
    assert late.short
    assert "leaves 0 s" in str(late.note)


def test_without_a_not_after_nothing_is_short() -> None:
    gcp = short_notice(notice(source="gcp-preempted", not_after=None, detail="TRUE"), 1800)
    assert (gcp.left_s, gcp.short, gcp.note) == (None, False, None)
    garbage = short_notice(notice(not_after="whenever"), 1800)
    assert (garbage.left_s, garbage.short) == (None, False)


def test_a_recorded_not_after_is_iso_utc() -> None:
    assert notice(not_after="Wed, 04 Mar 2026 05:06:37 GMT").not_after == "2026-03-04T05:06:37Z"
    assert notice(not_after="2026-03-04T06:06:07.5+01:00").not_after == "2026-03-04T05:06:07.500Z"
    assert notice(not_after="soon").not_after is None
    stored = notice(not_after="2026-03-04T05:08:07Z").model_dump_json()
    raw = stored.replace("2026-03-04T05:08:07Z", "Wed, 04 Mar 2026 05:08:07 GMT")
    assert RunNotice.model_validate_json(raw).not_after == "2026-03-04T05:08:07Z"
    assert iso_utc(T0) == "2026-03-04T05:06:07Z"
    assert derived_not_after("gcp-preempted", T0) == "2026-03-04T05:06:37Z"
    assert derived_not_after("gcp-maintenance", T0) == "2026-03-04T05:07:07Z"
    assert derived_not_after("aws-rebalance", T0) is None
    assert set(DOCUMENTED_LEAD_S) == {"gcp-preempted", "gcp-maintenance"}


def test_without_the_target_s_clock_the_record_time_counts() -> None:
    azure = notice(
        source="azure-preempt",
        seen_at=None,
        not_after="Wed, 04 Mar 2026 05:06:37 GMT",
        recorded_at=T0,
    )
    assert notice_left_s(azure) == 30


def test_a_notice_keeps_only_what_a_watcher_writes() -> None:
    with pytest.raises(ValidationError, match="source"):
        notice(source="oracle-preempt")
    with pytest.raises(ValidationError, match="not_after"):
        notice(not_after="x" * 65)


# --- what people read ------------------------------------------------------------------


def test_no_http_client_is_said_plainly() -> None:
    state = WatcherState(kind="unavailable", text="neither curl nor wget is installed")
    assert state.said() == NO_CLIENT
    assert NO_CLIENT == "preemption notices cannot be watched: no curl or wget on the target"
    assert Preemption(cloud="aws", watcher=state).said() == f"aws: {NO_CLIENT}"


def test_the_watcher_s_states_for_people() -> None:
    watching = WatcherState(kind="watching", text="gcp with curl")
    assert watching.said() == "watching gcp with curl"
    assert watching.said(ended=True) == "watched gcp with curl until the run ended"
    done = WatcherState(kind="done", text="recorded the gcp-preempted notice")
    assert done.said() == "the watcher ended: recorded the gcp-preempted notice"
    other = WatcherState(kind="unavailable", text="no metadata service answered")
    assert other.said() == "preemption notices cannot be watched: no metadata service answered"
    assert Preemption(cloud="auto").said() == "auto: no word from the watcher yet"
    assert Preemption(watcher=watching).said() == "started elsewhere: watching gcp with curl"


def test_a_notice_for_people() -> None:
    assert notice().said() == (
        "aws-spot (terminate), seen 2026-03-04 05:06:07 UTC, not after 2026-03-04T05:08:07Z"
    )
    told = short_notice(notice(), 1800)
    assert told.said().endswith("; " + str(told.note))
    gcp = notice(source="gcp-preempted", seen_at=None, not_after=None, detail=None)
    assert gcp.said() == "gcp-preempted, seen 2026-03-04 05:06:08 UTC"
