"""The pure parts of the preemption-notice watcher (`workers/executors/notices.py`):
its arguments, the files it writes as the service parses them, and the two shell
functions that turn hostile server text into JSON (`rw_field`, `rw_js`), run under
dash and busybox `sh`."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from workers.executors import InvalidArgument, ProtocolError
from workers.executors.notices import (
    NOTICE_FILE_LIMIT,
    NOTICE_GCP_WAIT_S,
    NOTICE_HTTP_MAX_S,
    NOTICE_PROBE_S,
    NOTICE_REASON,
    NOTICE_SOURCES,
    Notice,
    NoticeState,
    notice_watch_script,
    parse_notice,
    parse_notice_state,
)
from workers.executors.scripts.common import sh

SHELLS = {"dash": ("dash",), "busybox": ("busybox", "sh")}


def _function(name: str) -> str:
    match = re.search(rf"^{name}\(\) \{{\n.*?^\}}\n", sh("notice_watch"), re.S | re.M)
    assert match is not None, name
    return match[0]


def run_function(shell: str, body: str, *args: bytes) -> bytes:
    """Runs `body` (functions of the watcher, then a call) under `shell`, in the C
    locale as the watcher sets it."""
    return subprocess.run(
        [*SHELLS[shell], "-c", "LC_ALL=C; export LC_ALL\n" + body, "sh", *args],
        capture_output=True,
        check=True,
        timeout=10,
    ).stdout


# --- arguments ----------------------------------------------------------------------


@pytest.mark.parametrize("provider", ["", "AWS", "oracle", "aws ", "auto;rm"])
def test_an_unknown_provider_is_refused(provider: str) -> None:
    with pytest.raises(InvalidArgument, match="provider"):
        notice_watch_script("/w/r", provider, {}, 1.0)  # type: ignore[arg-type]


@pytest.mark.parametrize("poll_s", [0.0, -1.0, float("nan"), float("inf"), 3600.5])
def test_bad_poll_periods_are_refused(poll_s: float) -> None:
    with pytest.raises(InvalidArgument, match="poll_s"):
        notice_watch_script("/w/r", "aws", {}, poll_s)


@pytest.mark.parametrize(
    "url",
    [
        "https://169.254.169.254",
        "http://169.254.169.254/latest",
        "http://host name",
        "http://h'$(touch PWNED)'",
        "http://h\n",
        "ftp://h",
        "http://",
        "http://h:123456",
        "169.254.169.254",
    ],
)
def test_bad_base_urls_are_refused(url: str) -> None:
    with pytest.raises(InvalidArgument, match="base URL"):
        notice_watch_script("/w/r", "gcp", {"gcp": url}, 1.0)


def test_an_unknown_cloud_in_the_base_urls_is_refused() -> None:
    with pytest.raises(InvalidArgument, match="oracle"):
        notice_watch_script("/w/r", "auto", {"oracle": "http://h"}, 1.0)


def test_values_reach_the_script_as_arguments_and_rounded() -> None:
    script = notice_watch_script(
        "/w/r 'x' $(y)", "azure", {"azure": "http://[::1]:8080/", "aws": "http://a:1"}, 0.001
    )
    assert script.text == sh("group", "clock", "notice_watch")
    assert script.args[:6] == (
        "/w/r 'x' $(y)",
        "azure",
        "http://a:1",
        "http://metadata.google.internal",  # the default kept
        "http://[::1]:8080",  # the trailing slash dropped
        "100",  # at least 0.1 s
    )
    assert re.fullmatch(r"[0-9a-f]{12}", script.args[6])
    assert notice_watch_script("/w/r", "aws", {}, 2.5).args[5] == "2500"


def test_two_scripts_use_different_scratch_tokens() -> None:
    first, second = (notice_watch_script("/w/r", "aws", {}, 1.0) for _ in range(2))
    assert first.args[-1] != second.args[-1]


def test_the_script_says_the_reason_and_limits_of_this_module() -> None:
    text = sh("notice_watch")
    assert f"printf '%s' {NOTICE_REASON} >" in text
    for line in (
        f"rw_max_s={NOTICE_HTTP_MAX_S} ",
        f"rw_probe_s={NOTICE_PROBE_S} ",
        f"rw_wait_s={NOTICE_GCP_WAIT_S} ",
        f"rw_wait_max_s={NOTICE_GCP_WAIT_S + 5} ",
        "rw_field_max=64 ",  # what parse_notice accepts
    ):
        assert f"\n{line}" in text, line


@pytest.mark.parametrize("shell", list(SHELLS))
def test_the_script_parses_under_each_shell(shell: str) -> None:
    script = notice_watch_script("/w/r", "auto", {}, 1.0)
    subprocess.run([*SHELLS[shell], "-n", "-c", script.text], check=True, timeout=10)


# --- notice.json and notice.state ---------------------------------------------------


def test_a_notice_parses() -> None:
    data = (
        b'{"source": "aws-spot", "seen_at": 1700000000.123, '
        b'"not_after": "2017-09-18T08:22:00Z", "detail": "terminate"}\n'
    )
    assert parse_notice(data) == Notice(
        "aws-spot", 1700000000.123, "2017-09-18T08:22:00Z", "terminate"
    )
    plain = b'{"source": "gcp-preempted", "seen_at": null, "not_after": null, "detail": null}'
    assert parse_notice(plain) == Notice("gcp-preempted", None, None, None)


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"{",
        b"[]",
        b"\xff\xfe",
        b'{"source": "aws-spot"}',
        b'{"source": "oracle", "seen_at": 1, "not_after": null, "detail": null}',
        b'{"source": "aws-spot", "seen_at": "1", "not_after": null, "detail": null}',
        b'{"source": "aws-spot", "seen_at": true, "not_after": null, "detail": null}',
        b'{"source": "aws-spot", "seen_at": 1, "not_after": 5, "detail": null}',
        b'{"source": "aws-spot", "seen_at": 1, "not_after": null, "detail": "%s"}' % (b"x" * 65),
        b'{"source": "aws-spot", "seen_at": 1, "not_after": null, "detail": null, "x": 1}',
        b" " * (NOTICE_FILE_LIMIT + 1),
    ],
)
def test_a_bad_notice_is_a_protocol_error(data: bytes) -> None:
    with pytest.raises(ProtocolError):
        parse_notice(data)


def test_the_sources_are_the_documented_five() -> None:
    assert set(NOTICE_SOURCES) == {
        "aws-spot",
        "aws-rebalance",
        "gcp-preempted",
        "gcp-maintenance",
        "azure-preempt",
    }


@pytest.mark.parametrize(
    ("line", "state"),
    [
        (b"watching aws with curl\n", NoticeState("watching", "aws with curl")),
        (
            b"unavailable: neither curl nor wget is installed\n",
            NoticeState("unavailable", "neither curl nor wget is installed"),
        ),
        (b"done: the job ended\nmore", NoticeState("done", "the job ended")),
    ],
)
def test_states_parse(line: bytes, state: NoticeState) -> None:
    assert parse_notice_state(line) == state


@pytest.mark.parametrize("line", [b"", b"Watching aws", b"\xff", b"done"])
def test_a_bad_state_is_a_protocol_error(line: bytes) -> None:
    with pytest.raises(ProtocolError):
        parse_notice_state(line)


# --- server text into JSON, in the shells -------------------------------------------


def js(shell: str, value: bytes, limit: int = 64) -> bytes:
    return run_function(shell, _function("rw_js") + 'rw_js "$1" "$2"', value, str(limit).encode())


def expected_js(value: bytes, limit: int = 64) -> str | None:
    kept = bytes(b for b in value if 0x20 <= b <= 0x7E)[:limit].decode()
    return kept or None


@pytest.mark.parametrize("shell", list(SHELLS))
@pytest.mark.parametrize(
    "value",
    [
        b"terminate",
        b"",
        b'a"b\\c',
        b"$(touch PWNED) `touch PWNED` 'q'",
        b"\\",
        b'"',
        b"line\nbreak\ttab\r\x07bell\x1b[31m",
        "h\u00e9llo \u2603".encode(),
        b"\xff\xfe\x80 bytes",
        b"x" * 500,
        b'\\"' * 40,
    ],
)
def test_rw_js_gives_valid_bounded_json(shell: str, value: bytes) -> None:
    out = js(shell, value)
    assert json.loads(out) == expected_js(value)
    assert len(out) <= 2 * 64 + 2


@settings(max_examples=40, deadline=None)
@given(st.binary(max_size=200).filter(lambda b: b"\0" not in b))
def test_rw_js_property(value: bytes) -> None:
    for shell in SHELLS:
        assert json.loads(js(shell, value, 20)) == expected_js(value, 20)


@pytest.mark.parametrize("shell", list(SHELLS))
@pytest.mark.parametrize(
    ("body", "name", "value"),
    [
        (b'{"action": "terminate", "time": "2017-09-18T08:22:00Z"}', "action", b"terminate"),
        (
            b'{"action": "terminate", "time": "2017-09-18T08:22:00Z"}',
            "time",
            b"2017-09-18T08:22:00Z",
        ),
        (b'{\n  "noticeTime" :\n "2020-10-27T08:22:00Z"\n}', "noticeTime", b"2020-10-27T08:22:00Z"),
        (b'{"action":"stop"}', "action", b"stop"),
        (b'{"other": "x"}', "action", b""),
        (b"not json at all", "action", b""),
        (b'{"action": "$(touch PWNED)"}', "action", b"$(touch PWNED)"),
        (b'{"action": "' + b"a" * 2000 + b'"}', "action", b"a" * 512),
    ],
)
def test_rw_field_takes_one_string_member(
    tmp_path: Path, shell: str, body: bytes, name: str, value: bytes
) -> None:
    script = _function("rw_field") + 'printf "%s" "$2" > "$3"; rw_b=$3; rw_field "$1"'
    path = f"{tmp_path}/body"
    assert run_function(shell, script, name.encode(), body, path.encode()) == value
