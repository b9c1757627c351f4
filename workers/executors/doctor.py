"""The doctor of a target: runs the probe (`scripts.doctor`) and samples the target's
clock through an executor's transport, and judges the findings (`doctor_checks`) into
`schemas.doctor.DoctorCheck`s: what is there, and what does not work without it.
"""

from __future__ import annotations

import secrets as _secrets
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from schemas.doctor import ClockSkew, DoctorCheck, clock_skew, tightest

from .doctor_checks import DoctorOptions, assess, make_check
from .errors import CommandError, ProtocolError
from .scripts.doctor import (
    CLOCK_SCRIPT,
    DOCTOR_TIMEOUT_S,
    doctor_script,
    parse_clock,
    parse_doctor,
)
from .transport import Transport, error_line

__all__ = [
    "CLOCK_SAMPLES",
    "CLOCK_TIMEOUT_S",
    "DoctorFindings",
    "DoctorOptions",
    "run_doctor",
]

CLOCK_SAMPLES: Final = 3
"""Clock readings taken; the tightest counts (the first may include a connection)."""
CLOCK_TIMEOUT_S: Final = 10.0
"""Deadline of one clock reading, in seconds."""


@dataclass(frozen=True)
class DoctorFindings:
    """The checks of a target, in a fixed order, and its clock against this one."""

    checks: tuple[DoctorCheck, ...]
    clock: ClockSkew | None


def run_doctor(
    transport: Transport,
    workdir: str,
    options: DoctorOptions,
    clock: Callable[[], float],
) -> DoctorFindings:
    """Runs the probe and the clock readings through `transport` (as the job's user:
    the transport's) and judges them with `options`. A probe that the target's shell
    cannot run to its end (or that passes its deadline, [`DOCTOR_TIMEOUT_S`]) gives
    one `probe` check (missing) in place of the probe's checks; a clock that cannot
    be read gives a `clock` warning.

    Raises:
        ExecError: when the target cannot be reached (or, run as another user, the
            change of user is refused).
    """
    token = _secrets.token_hex(16)
    script = doctor_script(
        workdir,
        token,
        job_writes_workdir=options.job_writes_workdir,
        random=_secrets.token_hex(6),
    )
    checks: list[DoctorCheck]
    try:
        result = transport.run(
            script.text, action="doctor", timeout_s=DOCTOR_TIMEOUT_S, args=script.args
        )
        if result.exit_code != 0:
            raise ProtocolError(error_line(result.stderr, result.exit_code))
        checks = assess(parse_doctor(result.stdout, token), options)
    except (CommandError, ProtocolError) as error:
        # The probe failed where the target answered (a shell that cannot run it, a
        # probe past its deadline): the clock is still read. A refused change of user
        # fails the clock readings the same way, and is raised from there.
        checks = [
            make_check(
                "probe",
                "missing",
                str(error),
                "every script runwarden runs here: the probe is plain POSIX sh, as they are",
            )
        ]
    skew, problem = _sample_clock(transport, clock)
    checks.append(_clock_check(skew, problem, options.skew_warn_s))
    return DoctorFindings(tuple(checks), skew)


def _sample_clock(
    transport: Transport, clock: Callable[[], float]
) -> tuple[ClockSkew | None, str]:
    samples: list[ClockSkew] = []
    problem = ""
    for _ in range(CLOCK_SAMPLES):
        before = clock()
        result = transport.run(CLOCK_SCRIPT.text, action="clock", timeout_s=CLOCK_TIMEOUT_S)
        after = clock()
        try:
            if result.exit_code != 0:
                raise ProtocolError(f"date failed: {error_line(result.stderr, result.exit_code)}")
            target, resolution = parse_clock(result.stdout)
            samples.append(clock_skew(before, target, resolution, after))
        except (ProtocolError, ValueError) as error:
            problem = str(error)
    return tightest(samples), problem


def _clock_check(skew: ClockSkew | None, problem: str, warn_s: float) -> DoctorCheck:
    breaks = (
        "times written on the target (snapshot.json, notice.json, metrics.jsonl) are "
        "read against the worker's clock, which runs the proof and end deadlines and "
        "max_hours: keep the target's clock in time (NTP)"
    )
    if skew is None:
        return make_check("clock", "warn", f"could not be read: {problem}", breaks)
    side = "ahead of" if skew.skew_s >= 0 else "behind"
    found = (
        f"{abs(skew.skew_s):.3f} s ± {skew.uncertainty_s:.3f} s {side} the worker"
        f" (warned above {warn_s:g} s)"
    )
    if skew.worst_s <= warn_s:
        return make_check("clock", "ok", found, breaks)
    return make_check("clock", "warn", found, breaks)
