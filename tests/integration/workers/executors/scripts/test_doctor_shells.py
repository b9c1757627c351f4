"""`scripts.doctor`: the parsers of the probe and of the clock on crafted, hostile and
odd output (bounded, never crashing), and the script's refusals of bad arguments.
(The script run by real shells: tests/integration/workers/executors/scripts/test_doctor.py.)"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from workers.executors import InvalidArgument, ProtocolError
from workers.executors.scripts.doctor import (
    DOCTOR_OUTPUT_LIMIT,
    DOCTOR_VALUE_LIMIT,
    doctor_script,
    parse_clock,
    parse_doctor,
)

TOKEN = "0123456789abcdef0123456789abcdef"
T = TOKEN.encode()
END = T + b" end .\n"


def line(key: str, value: bytes | str) -> bytes:
    raw = value if isinstance(value, bytes) else value.encode()
    return T + b" " + key.encode() + b" " + raw + b"\n"


# --- parse_doctor ------------------------------------------------------------------


def test_findings_by_key() -> None:
    output = line("setsid", "/usr/bin/setsid") + line("sh_version", "") + END
    assert parse_doctor(output, TOKEN) == {"setsid": "/usr/bin/setsid", "sh_version": ""}


def test_a_value_keeps_its_spaces_inside() -> None:
    output = line("df", "/dev/vda 1000 900 100 90% /mnt/a dir") + END
    assert parse_doctor(output, TOKEN) == {"df": "/dev/vda 1000 900 100 90% /mnt/a dir"}


def test_lines_without_the_token_are_ignored() -> None:
    output = (
        b"a tool wrote this\n"
        + b"setsid /forged\n"
        + b"x" + line("setsid", "/forged/too")  # not at a line's start
        + b"0123456789abcdef setsid /short/token\n"
        + line("setsid", "/usr/bin/setsid")
        + END
    )
    assert parse_doctor(output, TOKEN) == {"setsid": "/usr/bin/setsid"}


def test_the_first_value_of_a_key_counts() -> None:
    output = line("tar", "/usr/bin/tar") + line("tar", "/evil/tar") + END
    assert parse_doctor(output, TOKEN)["tar"] == "/usr/bin/tar"


@pytest.mark.parametrize(
    "key", ["Setsid", "set-sid", "a/b", "1tar", "", "k" * 33, "sé", "$(x)"]
)
def test_keys_that_are_not_lower_case_names_are_ignored(key: str) -> None:
    output = T + b" " + key.encode() + b" v\n" + END
    assert parse_doctor(output, TOKEN) == {}


def test_records_after_the_end_are_ignored() -> None:
    output = line("tar", "/usr/bin/tar") + END + line("setsid", "/late")
    assert parse_doctor(output, TOKEN) == {"tar": "/usr/bin/tar"}


def test_control_characters_and_escapes_are_dropped() -> None:
    output = line("tar_version", b"\x1b[31mGNU\x07 tar\r 1.34\x00\x7f\x9b") + END
    value = parse_doctor(output, TOKEN)["tar_version"]
    assert value.isprintable()
    assert "\x1b" not in value
    assert "GNU" in value
    assert "tar" in value


def test_bad_utf8_is_replaced() -> None:
    value = parse_doctor(line("wget_version", b"\xff\xfeWget \xc3") + END, TOKEN)["wget_version"]
    assert "Wget" in value
    assert "\ufffd" in value


def test_a_long_value_is_cut() -> None:
    output = line("python", "p" * 10_000) + END
    assert parse_doctor(output, TOKEN)["python"] == "p" * DOCTOR_VALUE_LIMIT


def test_cut_short_is_a_protocol_error() -> None:
    with pytest.raises(ProtocolError, match="cut short"):
        parse_doctor(line("setsid", "/usr/bin/setsid"), TOKEN)


@pytest.mark.parametrize("output", [b"", b"\n\n", b"sh: 1: Syntax error: ( unexpected\n"])
def test_no_answer_is_a_protocol_error(output: bytes) -> None:
    with pytest.raises(ProtocolError):
        parse_doctor(output, TOKEN)


def test_only_the_first_bytes_are_read() -> None:
    flood = b"z" * DOCTOR_OUTPUT_LIMIT + b"\n"
    with pytest.raises(ProtocolError, match="cut short"):
        parse_doctor(flood + END, TOKEN)
    assert parse_doctor(END + flood, TOKEN) == {}


def test_an_end_record_with_anything_after_it_ends() -> None:
    assert parse_doctor(T + b" end\n", TOKEN) == {}
    assert parse_doctor(T + b" end whatever\r\n", TOKEN) == {}


def test_crlf_line_ends() -> None:
    output = (line("setsid", "/usr/bin/setsid") + END).replace(b"\n", b"\r\n")
    assert parse_doctor(output, TOKEN) == {"setsid": "/usr/bin/setsid"}
    assert parse_doctor(T + b" end\r\n", TOKEN) == {}


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=4096), st.booleans())
def test_any_output_parses_or_is_a_protocol_error(noise: bytes, ended: bool) -> None:
    output = noise + (b"\n" + END if ended else b"")
    try:
        found = parse_doctor(output, TOKEN)
    except ProtocolError:
        assert not (ended and len(output) <= DOCTOR_OUTPUT_LIMIT)
        return
    for key, value in found.items():
        assert key.isascii()
        assert len(value) <= DOCTOR_VALUE_LIMIT
        assert value.isprintable()


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.from_regex(r"[a-z][a-z0-9_]{0,31}", fullmatch=True),
                          st.binary(max_size=400)), max_size=20))  # fmt: skip
def test_records_of_any_content_stay_bounded(records: list[tuple[str, bytes]]) -> None:
    output = b"".join(line(k, v.replace(b"\n", b" ")) for k, v in records) + END
    found = parse_doctor(output, TOKEN)
    keys = [k for k, _ in records]
    before_end = keys[: keys.index("end")] if "end" in keys else keys
    assert set(found) == set(before_end)
    assert all(len(v) <= DOCTOR_VALUE_LIMIT and v.isprintable() for v in found.values())


# --- parse_clock -------------------------------------------------------------------


def test_clock_in_nanoseconds() -> None:
    seconds, resolution = parse_clock(b"1796072414361531298\n")
    assert seconds == pytest.approx(1796072414.361531298, abs=1e-6)
    assert resolution == 1e-9


def test_clock_in_whole_seconds() -> None:
    assert parse_clock(b"1796072414\n") == (1796072414.0, 1.0)


@pytest.mark.parametrize(
    "output",
    [
        b"",
        b"\n",
        b"1796072414%N\n",  # a date without %N that echoes it
        b"-1796072414\n",
        b"1796072414.5\n",
        b"17960724143615312981234\n",  # too many digits
        b"1796072414361\n",  # neither seconds nor nanoseconds
        "١٧٩٦٠٧٢٤١٤".encode(),  # digits, not ASCII ones
        b"Thu Nov 30 12:00:00 UTC 2026\n",
        b"\xff\xfe",
    ],
)
def test_clock_garbage_is_a_protocol_error(output: bytes) -> None:
    with pytest.raises(ProtocolError, match="clock"):
        parse_clock(output)


def test_clock_reads_a_bounded_prefix() -> None:
    with pytest.raises(ProtocolError):
        parse_clock(b"1" * 10_000_000)


# --- doctor_script -----------------------------------------------------------------


@pytest.mark.parametrize("token", ["", "a b", "a;b", "tök", "$(x)"])
def test_a_token_that_is_not_alphanumeric_is_refused(token: str) -> None:
    with pytest.raises(InvalidArgument):
        doctor_script("/w", token, job_writes_workdir=True, random="0" * 12)


def test_a_relative_workdir_is_refused() -> None:
    with pytest.raises(InvalidArgument, match="absolute"):
        doctor_script("w", TOKEN, job_writes_workdir=True, random="0" * 12)


@pytest.mark.parametrize("random", ["", "0" * 11, "g" * 12, "0" * 12 + "/", "../../../x0"])
def test_a_scratch_name_that_is_not_hex_is_refused(random: str) -> None:
    with pytest.raises(InvalidArgument):
        doctor_script("/w", TOKEN, job_writes_workdir=True, random=random)


def test_a_workdir_with_a_nul_is_refused() -> None:
    with pytest.raises(InvalidArgument, match="NUL"):
        doctor_script("/w\0x", TOKEN, job_writes_workdir=True, random="0" * 12)
