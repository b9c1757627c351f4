"""`workers.executors.doctor_checks` and `.doctor`: what each finding of the probe
means (`assess`), and the doctor's run through a transport that answers as a target
would (`run_doctor`: the probe failing, the clock skewed or unreadable). The probe on
real shells and targets: tests/integration/workers/executors/test_doctor.py."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import IO

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from schemas.doctor import DoctorCheck
from workers.executors import CommandError, Completed
from workers.executors.doctor import CLOCK_SAMPLES, DoctorOptions, run_doctor
from workers.executors.doctor_checks import assess
from workers.executors.scripts.doctor import CLOCK_SCRIPT

GOOD: Mapping[str, str] = {
    "sh_exe": "/usr/bin/dash",
    "sh_version": "",
    "sh_posix": "yes",
    "setsid": "/usr/bin/setsid",
    "tar": "/usr/bin/tar",
    "tar_version": "tar (GNU tar) 1.34",
    "tar_create": "yes",
    "tar_extract": "yes",
    "sha256sum": "/usr/bin/sha256sum",
    "sha256sum_works": "yes",
    "sha256sum_z": "yes",
    "dd_nonblock": "yes",
    "timeout": "/usr/bin/timeout",
    "timeout_works": "yes",
    "sleep_fraction": "yes",
    "utilities_missing": "",
    "utilities_broken": "",
    "proc_stat": "yes",
    "proc_environ": "yes",
    "curl": "/usr/bin/curl",
    "wget": "",
    "python": "/usr/bin/python3",
    "python_version": "3.11.2",
    "workdir": "yes",
    "writable": "yes",
    "df": "/dev/vda 1000000 400000 600000 40% /",
    "scratch": "yes",
    "mv_t": "yes",
}
NAMES = ["sh", "setsid", "tar", "sha256sum", "mv-t", "utilities", "dd", "timeout", "sleep",
         "proc", "http-client", "python", "workdir", "disk"]  # fmt: skip


def checks(changes: Mapping[str, str | None], **options: object) -> dict[str, DoctorCheck]:
    """The checks of GOOD with `changes` (None removes a finding)."""
    findings = {**GOOD, **{k: v for k, v in changes.items() if v is not None}}
    for key in [k for k, v in changes.items() if v is None]:
        findings.pop(key, None)
    result = assess(findings, DoctorOptions(**options))  # type: ignore[arg-type]
    assert [c.name for c in result] == NAMES
    return {c.name: c for c in result}


def statuses(found: dict[str, DoctorCheck]) -> dict[str, str]:
    return {name: check.status for name, check in found.items() if check.status != "ok"}


def test_a_complete_target_is_all_ok() -> None:
    found = checks({})
    assert statuses(found) == {}
    assert found["sh"].found == "dash (/usr/bin/dash)"
    assert found["tar"].found == "GNU tar 1.34 (/usr/bin/tar)"
    assert found["disk"].found == "586 MiB free of 977 MiB (40 % used)"


def test_nothing_found_is_missing_or_warned_never_a_crash() -> None:
    found = {c.name: c for c in assess({}, DoctorOptions())}
    assert {n for n, c in found.items() if c.status == "missing"} == {
        "sh", "setsid", "tar", "sha256sum", "workdir"
    }  # fmt: skip
    assert found["mv-t"].found.startswith("untried")
    assert found["utilities"].found == "not reported by the probe"
    assert {n for n, c in found.items() if c.status == "ok"} == set()


@settings(max_examples=300, deadline=None)
@given(
    st.dictionaries(
        st.sampled_from([*GOOD, "workdir_parent", "wget_version", "x"]),
        st.one_of(st.sampled_from(["yes", "no", ""]), st.text(max_size=300)),
    ),
    st.booleans(),
    st.booleans(),
    st.floats(0.001, 1.0),
)
def test_any_findings_give_every_check(
    findings: dict[str, str], native: bool, writes: bool, fraction: float
) -> None:
    options = DoctorOptions(
        native_files=native, job_writes_workdir=writes, disk_used_fraction=fraction
    )
    result = assess(findings, options)
    assert [c.name for c in result] == NAMES
    assert all(len(c.found) <= 500 and len(c.breaks) <= 500 for c in result)


def test_a_shell_that_is_not_posix_is_missing() -> None:
    found = checks({"sh_posix": "no", "sh_exe": "/bin/sh.old"})
    assert statuses(found) == {"sh": "missing"}
    assert "sh.old" in found["sh"].found


@pytest.mark.parametrize(
    ("exe", "version", "shown"),
    [
        ("/usr/bin/busybox", "", "busybox ash (/usr/bin/busybox)"),
        ("/usr/bin/bash", "5.2.15(1)-release", "bash 5.2.15(1)-release (/usr/bin/bash)"),
        ("", "", "unknown (no /proc, or no readlink)"),
    ],
)
def test_the_shell_is_named(exe: str, version: str, shown: str) -> None:
    assert checks({"sh_exe": exe, "sh_version": version})["sh"].found == shown


def test_without_setsid_no_job_starts() -> None:
    found = checks({"setsid": ""})
    assert statuses(found) == {"setsid": "missing"}
    assert "launch" in found["setsid"].breaks


def test_busybox_tar_cannot_archive_for_retrievals() -> None:
    found = checks({"tar_version": "tar (busybox) 1.35.0", "tar_create": "no"})
    assert statuses(found) == {"tar": "missing"}
    assert found["tar"].found.startswith("busybox tar")
    assert "retrievals" in found["tar"].breaks
    assert "uploads" not in found["tar"].breaks


def test_a_tar_that_cannot_unpack_breaks_uploads() -> None:
    found = checks({"tar_extract": "no"})
    assert statuses(found) == {"tar": "missing"}
    assert "uploads" in found["tar"].breaks


def test_unpacking_untried_is_said() -> None:
    found = checks({"tar_extract": None, "scratch": "no", "mv_t": None})
    assert found["tar"].status == "ok"
    assert "untried" in found["tar"].found
    assert found["mv-t"].status == "warn"


def test_a_native_executor_needs_neither_tar_nor_sha256sum_nor_mv_t() -> None:
    gone = {"tar": "", "sha256sum": "", "sha256sum_works": "no", "mv_t": "no"}
    assert statuses(checks(gone)) == {"tar": "missing", "sha256sum": "missing", "mv-t": "missing"}
    found = checks(gone, native_files=True)
    assert statuses(found) == {}
    assert "not used" in found["tar"].found
    assert "not used" in found["mv-t"].found


def test_sha256sum_without_z_is_slower() -> None:
    found = checks({"sha256sum_z": "no"})
    assert statuses(found) == {"sha256sum": "warn"}


def test_a_sha256sum_that_hashes_wrong_is_missing() -> None:
    assert statuses(checks({"sha256sum_works": "no"})) == {"sha256sum": "missing"}


def test_mv_without_t_breaks_stops() -> None:
    found = checks({"mv_t": "no"})
    assert statuses(found) == {"mv-t": "missing"}
    assert "snapshot.request" in found["mv-t"].breaks


def test_missing_utilities_are_named() -> None:
    found = checks({"utilities_missing": "find xargs", "utilities_broken": "head-c"})
    assert statuses(found) == {"utilities": "missing"}
    assert found["utilities"].found == "absent: find xargs; not working: head-c"


def test_grep_without_z_alone_is_a_warning() -> None:
    assert statuses(checks({"utilities_broken": "grep-z"})) == {"utilities": "warn"}


def test_reads_without_gnu_dd_fall_back_to_timeout() -> None:
    found = checks({"dd_nonblock": "no"})
    assert statuses(found) == {"dd": "warn"}
    assert "5 s" in found["dd"].breaks


def test_reads_without_dd_nor_timeout_can_block() -> None:
    found = checks({"dd_nonblock": "no", "timeout": "", "timeout_works": "no"})
    assert statuses(found) == {"dd": "warn", "timeout": "warn"}
    assert "blocks" in found["dd"].breaks


def test_timeout_absent_but_not_needed_is_ok() -> None:
    found = checks({"timeout": "", "timeout_works": "no"})
    assert statuses(found) == {}
    assert "not needed" in found["timeout"].found


def test_whole_second_sleeps_slow_cancel_down() -> None:
    found = checks({"sleep_fraction": "no"})
    assert statuses(found) == {"sleep": "warn"}
    assert "10x" in found["sleep"].breaks


@pytest.mark.parametrize(
    ("changes", "needle"),
    [
        ({"proc_stat": "no", "proc_environ": "no"}, "reused pid"),
        ({"proc_environ": "no"}, "survives the cancel"),
    ],
)
def test_without_proc(changes: dict[str, str], needle: str) -> None:
    found = checks(changes)
    assert statuses(found) == {"proc": "warn"}
    assert needle in found["proc"].breaks


@pytest.mark.parametrize(
    ("changes", "status", "needle"),
    [
        ({}, "ok", "curl"),
        ({"curl": "", "wget": "/usr/bin/wget", "wget_version": "GNU Wget 1.21.3"}, "ok", "GNU"),
        ({"curl": "", "wget": "/bin/wget", "wget_version": ""}, "warn", "AWS"),
        ({"curl": "", "wget": ""}, "warn", "cannot run"),
        (
            {"curl": "", "wget": "/w", "wget_version": "GNU Wget", "timeout": "",
             "timeout_works": "no"},
            "warn",
            "timeout",
        ),
    ],
)  # fmt: skip
def test_the_notice_watchers_client(changes: dict[str, str], status: str, needle: str) -> None:
    check = checks(changes)["http-client"]
    assert check.status == status
    assert needle in check.found + check.breaks


@pytest.mark.parametrize(
    ("version", "status", "too_old"),
    [
        ("3.13.0", "ok", []),
        ("3.10.12", "ok", []),
        ("3.9.18", "warn", ["runwarden_hf", "runwarden_preempt"]),
        ("3.8.10", "warn", ["runwarden_hf", "runwarden_preempt"]),
        ("3.7.3", "warn", ["runwarden_job", "runwarden_hf", "runwarden_preempt"]),
        ("2.7.18", "warn", ["runwarden_job", "runwarden_hf", "runwarden_preempt"]),
    ],
)
def test_python_versions(version: str, status: str, too_old: list[str]) -> None:
    check = checks({"python_version": version})["python"]
    assert check.status == status
    for name in ("runwarden_job", "runwarden_hf", "runwarden_preempt"):
        assert (name in check.breaks) == (name in too_old) or status == "ok"


@pytest.mark.parametrize(
    "changes", [{"python": ""}, {"python_version": ""}, {"python_version": "3.x; rm -rf /"}]
)
def test_no_python_or_no_version_is_a_warning(changes: dict[str, str]) -> None:
    assert statuses(checks(changes)) == {"python": "warn"}


@pytest.mark.parametrize(
    ("changes", "status", "needle"),
    [
        ({"writable": "no"}, "missing", "not writable"),
        (
            {"workdir": "no", "workdir_parent": "/data"},
            "ok",
            "first claim makes it in /data",
        ),
        (
            {"workdir": "no", "workdir_parent": "/proc", "writable": "no"},
            "missing",
            "cannot make it in /proc",
        ),
    ],
)  # fmt: skip
def test_the_workdir(changes: dict[str, str | None], status: str, needle: str) -> None:
    check = checks(changes)["workdir"]
    assert check.status == status
    assert needle in check.found


def test_a_workdir_the_worker_makes_runs_in_need_not_be_the_jobs() -> None:
    check = checks({"writable": None}, job_writes_workdir=False)["workdir"]
    assert check.status == "ok"
    assert "root" in check.found


def test_a_nearly_full_disk_warns_as_the_disk_policy_would_act() -> None:
    check = checks({"df": "/dev/sda1 1000 950 50 95% /data"})["disk"]
    assert check.status == "warn"
    assert "95 % used" in check.breaks
    assert checks({"df": "/dev/sda1 1000 950 50 95% /"}, disk_used_fraction=1.0)[
        "disk"
    ].status == "ok"


@pytest.mark.parametrize("df", ["", "df: /w: No such file", "a b c d e f", "1 2 3"])
def test_df_garbage_is_a_warning(df: str) -> None:
    assert statuses(checks({"df": df})) == {"disk": "warn"}


# --- run_doctor through a transport answering as a target would --------------------


class Answering:
    """A transport answering the probe with `probe` and each clock reading with the
    next of `clock_answers` (its script is checked: never anything else)."""

    def __init__(self, probe: Callable[[str], Completed], clock_answers: list[Completed]) -> None:
        self.probe = probe
        self.clock_answers: Iterator[Completed] = iter(clock_answers)
        self.actions: list[str] = []

    def run(
        self,
        script: str,
        *,
        action: str,
        stdin: bytes = b"",
        timeout_s: float | None = 0,
        args: Sequence[str] = (),
    ) -> Completed:
        self.actions.append(action)
        if action == "clock":
            assert script == CLOCK_SCRIPT.text
            assert not args
            return next(self.clock_answers)
        return self.probe(args[0])  # the probe's token

    def run_to_end(
        self,
        script: str,
        *,
        action: str,
        pgid: int | None = None,
        timeout_s: float | None = None,
    ) -> Completed:
        raise AssertionError("not used")

    def send(self, script: str, *, action: str, source: Callable[[IO[bytes]], None]) -> Completed:
        raise AssertionError("not used")

    def receive(self, script: str, *, action: str, sink: Callable[[IO[bytes]], None]) -> Completed:
        raise AssertionError("not used")

    def reap(self, pgid: int) -> None:
        pass

    def close(self) -> None:
        pass


def probe_answer(findings: Mapping[str, str]) -> Callable[[str], Completed]:
    def answer(token: str) -> Completed:
        body = "".join(f"{token} {k} {v}\n" for k, v in findings.items()) + f"{token} end .\n"
        return Completed(0, body.encode(), b"")

    return answer


def ticking(*times: float) -> Callable[[], float]:
    values = iter(times)
    return lambda: next(values)


def test_the_tightest_clock_reading_counts() -> None:
    answers = [Completed(0, f"{t}\n".encode(), b"") for t in (
        "1000000030000000000", "1000000030100000000", "1000000030050000000")]  # fmt: skip
    # The worker's reads around each: 2 s, then 0.2 s, then 1 s wide.
    clock = ticking(1e9, 1e9 + 2, 1e9, 1e9 + 0.2, 1e9, 1e9 + 1)
    found = run_doctor(Answering(probe_answer(GOOD), answers), "/w", DoctorOptions(), clock)
    assert found.clock is not None
    assert found.clock.skew_s == pytest.approx(30.0, abs=1e-6)
    assert found.clock.uncertainty_s == pytest.approx(0.1, abs=1e-6)
    check = found.checks[-1]
    assert (check.name, check.status) == ("clock", "warn")
    assert check.found.startswith("30.000 s ± 0.100 s ahead of the worker")


def test_a_clock_within_the_threshold_is_ok() -> None:
    answers = [Completed(0, b"1000000000\n", b"")] * CLOCK_SAMPLES
    clock = ticking(*[1e9 - 0.2, 1e9 + 0.3] * CLOCK_SAMPLES)
    found = run_doctor(Answering(probe_answer(GOOD), answers), "/w", DoctorOptions(), clock)
    assert found.clock is not None
    assert found.clock.uncertainty_s == pytest.approx(0.75)  # a whole second's reading
    assert [(c.name, c.status) for c in found.checks if c.status != "ok"] == []


def test_a_clock_behind_by_more_than_the_threshold_warns() -> None:
    answers = [Completed(0, b"999999990\n", b"")] * CLOCK_SAMPLES
    clock = ticking(*[1e9, 1e9 + 0.01] * CLOCK_SAMPLES)
    found = run_doctor(Answering(probe_answer(GOOD), answers), "/w", DoctorOptions(), clock)
    check = found.checks[-1]
    assert check.status == "warn"
    assert "behind the worker" in check.found


def test_a_clock_that_cannot_be_read_is_a_warning() -> None:
    answers = [Completed(0, b"Thu Nov 30\n", b""), Completed(3, b"", b"date: not found")] * 2
    clock = ticking(*[1e9, 1e9 + 0.01] * CLOCK_SAMPLES)
    found = run_doctor(Answering(probe_answer(GOOD), answers), "/w", DoctorOptions(), clock)
    assert found.clock is None
    check = found.checks[-1]
    assert (check.name, check.status) == ("clock", "warn")
    assert "could not be read" in check.found


@pytest.mark.parametrize(
    "answer",
    [
        Completed(2, b"", b"sh: 1: Syntax error: \"(\" unexpected"),
        Completed(0, b"half an answer\n", b""),
    ],
)
def test_a_probe_the_shell_cannot_run_is_one_missing_check(answer: Completed) -> None:
    answers = [Completed(0, b"1000000000\n", b"")] * CLOCK_SAMPLES
    clock = ticking(*[1e9, 1e9 + 0.01] * CLOCK_SAMPLES)
    found = run_doctor(Answering(lambda _: answer, answers), "/w", DoctorOptions(), clock)
    assert [(c.name, c.status) for c in found.checks] == [("probe", "missing"), ("clock", "ok")]
    if answer.exit_code:
        assert "Syntax error" in found.checks[0].found


def test_a_probe_past_its_deadline_is_one_missing_check() -> None:
    def hangs(_: str) -> Completed:
        raise CommandError("doctor", "timed out after 60.0 s")

    answers = [Completed(0, b"1000000000\n", b"")] * CLOCK_SAMPLES
    clock = ticking(*[1e9, 1e9 + 0.01] * CLOCK_SAMPLES)
    found = run_doctor(Answering(hangs, answers), "/w", DoctorOptions(), clock)
    assert [(c.name, c.status) for c in found.checks] == [("probe", "missing"), ("clock", "ok")]
    assert "timed out" in found.checks[0].found


def test_a_target_that_refuses_every_script_raises() -> None:
    def refused(_: str) -> Completed:
        raise CommandError("run as rwjob", "sudo: a password is required")

    class Refusing(Answering):
        def run(
            self,
            script: str,
            *,
            action: str,
            stdin: bytes = b"",
            timeout_s: float | None = 0,
            args: Sequence[str] = (),
        ) -> Completed:
            return refused(script)

    with pytest.raises(CommandError, match="password"):
        run_doctor(Refusing(refused, []), "/w", DoctorOptions(), ticking(1e9, 1e9))
