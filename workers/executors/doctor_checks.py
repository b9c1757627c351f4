"""What each finding of the doctor's probe (`scripts.doctor`) means: one check per
thing the scripts of `scripts/` (and the notice watcher, `notices.py`) call, saying
what was found and what does not work without it (`schemas.doctor.DoctorCheck`).

An executor that does some file operations natively (the local executor's upload,
download, manifest, reads and small writes) does not need the tools of those
operations; its checks say so instead of asking for them.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

from schemas.doctor import CLOCK_SKEW_WARN_S, CheckStatus, DoctorCheck
from schemas.policy import DISK_USED_LIMIT, DiskSample, disk_verdict
from schemas.text import format_bytes

__all__ = ["JOBSIDE_PYTHON", "DoctorOptions", "assess", "make_check"]

JOBSIDE_PYTHON: Final = {
    "runwarden_job": (3, 8),
    "runwarden_hf": (3, 10),
    "runwarden_lightning": (3, 10),
    "runwarden_loop": (3, 10),
    "runwarden_preempt": (3, 10),
    "runwarden_metrics": (3, 8),
}
"""The oldest Python each job-side file runs on (`workers/jobside/`), from what it uses at
run time: `runwarden_job` (requests, proofs) and `runwarden_metrics` (its `Metrics`,
loaded when `runwarden_job` is) import `typing.Final` (3.8); `runwarden_preempt`
(preemption signals, which `runwarden_job` loads on `install_preemption_signals`)
imports `typing.TypeAlias` and evaluates `X | None` at import (3.10); `runwarden_loop`
(`StopPoint`) installs those signals when made, and `runwarden_hf` and
`runwarden_lightning` (which load `runwarden_loop`) when training begins (3.10).
`tests/unit/workers/executors/test_doctor_jobside.py` keeps this true."""

_DF_LINE: Final = re.compile(r"(?:^|\s)(\d+)\s+(\d+)\s+(\d+)\s+(?:\d+%|-)(?:\s|$)")
_VERSION: Final = re.compile(r"(\d+)\.(\d+)\.(\d+)")
_KIB: Final = 1024


@dataclass(frozen=True)
class DoctorOptions:
    """How an executor's doctor judges what it finds."""

    native_files: bool = False
    """The executor uploads, downloads, hashes, reads and writes small files itself
    (the local executor): `tar`, `sha256sum` and `mv -T` are not used."""
    job_writes_workdir: bool = True
    """The job's user makes run directories in the workdir (every executor but one
    whose worker, as root, makes them and gives them to the job's user)."""
    disk_used_fraction: float = DISK_USED_LIMIT
    """The disk policy's limit (`Settings.disk_used_fraction`)."""
    skew_warn_s: float = CLOCK_SKEW_WARN_S


def make_check(name: str, status: CheckStatus, found: str, breaks: str) -> DoctorCheck:
    """A check, its texts cut to what a report holds (500 characters)."""
    return DoctorCheck(name=name, status=status, found=found[:500], breaks=breaks[:500])


def _yes(findings: Mapping[str, str], key: str) -> bool:
    return findings.get(key) == "yes"


def assess(findings: Mapping[str, str], options: DoctorOptions) -> list[DoctorCheck]:
    """The checks of a probe's `findings` (see `scripts.doctor.doctor_script` for the
    keys), in a fixed order: `sh`, `setsid`, `tar`, `sha256sum`, `mv-t`, `utilities`,
    `dd`, `timeout`, `sleep`, `proc`, `http-client`, `python`, `workdir`, `disk`. A
    finding that is absent reads as `no` (nothing found)."""
    return [
        _shell(findings),
        _setsid(findings),
        _tar(findings, options),
        _sha256sum(findings, options),
        _mv_t(findings, options),
        _utilities(findings),
        _dd(findings),
        _timeout(findings),
        _sleep(findings),
        _proc(findings),
        _http(findings),
        _python(findings),
        _workdir(findings, options),
        _disk(findings, options),
    ]


def _shell(f: Mapping[str, str]) -> DoctorCheck:
    exe = f.get("sh_exe", "")
    name = exe.rsplit("/", 1)[-1] or "unknown (no /proc, or no readlink)"
    if name == "busybox":
        name = "busybox ash"
    version = f.get("sh_version", "")
    found = f"{name} {version}".strip() + (f" ({exe})" if exe else "")
    breaks = "every script runwarden runs here: they are POSIX sh"
    if _yes(f, "sh_posix"):
        return make_check("sh", "ok", found, breaks)
    return make_check(
        "sh", "missing", f"{found}: lacks POSIX expansions, arithmetic or functions", breaks
    )


def _setsid(f: Mapping[str, str]) -> DoctorCheck:
    breaks = "launch: every job starts in a session of its own through setsid (util-linux)"
    path = f.get("setsid", "")
    if path:
        return make_check("setsid", "ok", path, breaks)
    return make_check("setsid", "missing", "absent", breaks)


_NATIVE: Final = " (not used here: files are copied natively)"


def _tar_kind(version: str) -> str:
    if "GNU tar" in version:
        return "GNU tar " + version.rsplit(" ", 1)[-1]
    if "bsdtar" in version:
        return version.split(" - ", maxsplit=1)[0]
    if "busybox" in version.lower():
        return "busybox tar"
    return version[:80] or "unknown tar"


def _tar(f: Mapping[str, str], options: DoctorOptions) -> DoctorCheck:
    path = f.get("tar", "")
    kind = _tar_kind(f.get("tar_version", "")) if path else "absent"
    if options.native_files:
        return make_check("tar", "ok", kind + _NATIVE, "uploads and artifact retrievals")
    if not path:
        return make_check(
            "tar", "missing", kind, "uploads (and resumes) and artifact retrievals: both stream tar"
        )
    lacks = []
    if not _yes(f, "tar_create"):
        lacks.append(
            "artifact retrievals: archiving needs --null, --no-recursion, "
            "--hard-dereference and -T - (GNU tar)"
        )
    if f.get("tar_extract") == "no":
        lacks.append("uploads and resumes: unpacking needs tar -x -o -C")
    if lacks:
        return make_check("tar", "missing", f"{kind} ({path})", "; ".join(lacks))
    found = f"{kind} ({path})"
    if "tar_extract" not in f:
        found += "; unpacking untried (no directory to try it in)"
    return make_check("tar", "ok", found, "uploads and artifact retrievals")


def _sha256sum(f: Mapping[str, str], options: DoctorOptions) -> DoctorCheck:
    breaks = "artifact retrievals: the target's manifest hashes every file with sha256sum"
    path = f.get("sha256sum", "")
    if options.native_files:
        return make_check("sha256sum", "ok", (path or "absent") + _NATIVE, breaks)
    if not path or not _yes(f, "sha256sum_works"):
        return make_check("sha256sum", "missing", path or "absent", breaks)
    if not _yes(f, "sha256sum_z"):
        return make_check(
            "sha256sum",
            "warn",
            f"{path}, without -z (busybox)",
            "manifests start one sha256sum per file: slower for many small files",
        )
    return make_check("sha256sum", "ok", path, breaks)


def _mv_t(f: Mapping[str, str], options: DoctorOptions) -> DoctorCheck:
    breaks = "stops: snapshot.request is written through mv -T (never into a linked directory)"
    if options.native_files:
        return make_check("mv-t", "ok", "not used here: files are written natively", breaks)
    if f.get("mv_t") == "yes":
        return make_check("mv-t", "ok", "mv -fT works", breaks)
    if f.get("mv_t") == "no":
        return make_check("mv-t", "missing", "mv has no -T", breaks)
    return make_check("mv-t", "warn", "untried: no directory the job's user may write", breaks)


def _utilities(f: Mapping[str, str]) -> DoctorCheck:
    missing = f.get("utilities_missing", "").split()
    broken = f.get("utilities_broken", "").split()
    breaks = (
        "the scripts call them: head -c (bounded reads), find -print0 and xargs -0 "
        "(manifests, downloads), grep -z (cancel's sweep), and the POSIX tools"
    )
    if "utilities_missing" not in f or "utilities_broken" not in f:
        return make_check("utilities", "warn", "not reported by the probe", breaks)
    if not missing and not broken:
        return make_check("utilities", "ok", "all there", breaks)
    parts = []
    if missing:
        parts.append("absent: " + " ".join(missing))
    if broken:
        parts.append("not working: " + " ".join(broken))
    status: CheckStatus = "warn" if not missing and broken == ["grep-z"] else "missing"
    return make_check("utilities", status, "; ".join(parts), breaks)


def _dd(f: Mapping[str, str]) -> DoctorCheck:
    if _yes(f, "dd_nonblock"):
        return make_check(
            "dd",
            "ok",
            "dd iflag=nonblock,nofollow (GNU)",
            "reads of job-written files that never block nor follow a link",
        )
    if _yes(f, "timeout_works"):
        return make_check(
            "dd",
            "warn",
            "no dd iflag=nonblock,nofollow; reads go through timeout 5 tail | head",
            "a FIFO the job puts in place of a file it writes costs 5 s per read (status, "
            "follow, proofs)",
        )
    return make_check(
        "dd",
        "warn",
        "no dd iflag=nonblock,nofollow, no timeout",
        "a FIFO the job puts in place of a file it writes blocks the read (status, follow) "
        "until the script's deadline",
    )


def _timeout(f: Mapping[str, str]) -> DoctorCheck:
    path = f.get("timeout", "")
    needs = []
    if not _yes(f, "dd_nonblock"):
        needs.append("reads of job-written files (no non-blocking dd)")
    if not f.get("curl") and f.get("wget"):
        needs.append("the notice watcher's wget requests")
    breaks = "bounds " + (" and ".join(needs) if needs else "reads without GNU dd, and wget")
    if path and _yes(f, "timeout_works"):
        return make_check("timeout", "ok", path, breaks)
    found = "absent" if not path else f"{path} does not work"
    if not needs:
        return make_check("timeout", "ok", f"{found} (not needed here)", breaks)
    return make_check("timeout", "warn", found, breaks)


def _sleep(f: Mapping[str, str]) -> DoctorCheck:
    if _yes(f, "sleep_fraction"):
        return make_check("sleep", "ok", "sleep 0.01 works", "cancel's and launch's 0.1 s waits")
    return make_check(
        "sleep",
        "warn",
        "whole seconds only",
        "cancel's and launch's waits count 0.1 s turns: each takes up to 10x longer",
    )


def _proc(f: Mapping[str, str]) -> DoctorCheck:
    stat, environ = _yes(f, "proc_stat"), _yes(f, "proc_environ")
    if stat and environ:
        return make_check(
            "proc",
            "ok",
            "/proc/<pid>/stat and environ readable, grep -z",
            "pid reuse detection and cancel's sweep",
        )
    lost = []
    if not stat:
        lost.append(
            "the job's start time is unknown: a reused pid may pass for the job "
            "(status and cancel fall back to the markers)"
        )
    if not environ:
        lost.append(
            "cancel cannot find by its mark a process that left the job's group (setsid, "
            "a daemon): it survives the cancel"
        )
    found = "no /proc" if not stat else "/proc/<pid>/environ unreadable or no grep -z"
    return make_check("proc", "warn", found, "; ".join(lost))


def _http(f: Mapping[str, str]) -> DoctorCheck:
    curl, wget = f.get("curl", ""), f.get("wget", "")
    watcher = "the preemption notice watcher (notices.py)"
    if curl:
        return make_check("http-client", "ok", f"curl ({curl})", f"{watcher}: clouds' notices")
    if not wget:
        return make_check(
            "http-client",
            "warn",
            "neither curl nor wget",
            f"{watcher} cannot run: a cloud's preemption notice is not seen, and the job "
            "gets no snapshot request before its machine goes away",
        )
    gnu = "Wget" in f.get("wget_version", "")
    kind = "GNU wget" if gnu else "busybox wget"
    if not _yes(f, "timeout_works"):
        return make_check(
            "http-client",
            "warn",
            f"{kind} ({wget}) without timeout",
            f"{watcher} cannot run: it bounds wget's requests with timeout",
        )
    if gnu:
        return make_check("http-client", "ok", f"{kind} ({wget})", f"{watcher}: clouds' notices")
    return make_check(
        "http-client",
        "warn",
        f"{kind} ({wget})",
        f"{watcher} cannot watch AWS: IMDSv2 needs an HTTP PUT, which busybox wget "
        "cannot send (GCP and Azure are watched); install curl",
    )


def _python(f: Mapping[str, str]) -> DoctorCheck:
    path = f.get("python", "")
    breaks = (
        "the job-side helpers (runwarden_job, runwarden_hf); without them a job writes "
        "snapshot.json and metrics.jsonl itself (runwarden needs no Python here)"
    )
    if not path:
        return make_check("python", "warn", "no python3 on the job's PATH", breaks)
    match = _VERSION.fullmatch(f.get("python_version", ""))
    if match is None:
        return make_check("python", "warn", f"{path} did not say its version", breaks)
    version = (int(match[1]), int(match[2]))
    found = f"Python {match[0]} ({path})"
    too_old = [name for name, least in JOBSIDE_PYTHON.items() if version < least]
    if not too_old:
        return make_check("python", "ok", found, breaks)
    needs = ", ".join(f"{n} needs {'.'.join(map(str, JOBSIDE_PYTHON[n]))}" for n in too_old)
    return make_check("python", "warn", found, f"job-side helpers unusable: {needs}")


def _workdir(f: Mapping[str, str], options: DoctorOptions) -> DoctorCheck:
    claims = "claims: each run directory is made in the workdir"
    if not options.job_writes_workdir:
        where = "exists" if _yes(f, "workdir") else "not there yet"
        return make_check(
            "workdir",
            "ok",
            f"{where}; the worker (root) makes each run directory and gives it to the job's user",
            claims,
        )
    writable = _yes(f, "writable")
    if _yes(f, "workdir"):
        if writable:
            return make_check("workdir", "ok", "exists, writable by the job's user", claims)
        return make_check(
            "workdir",
            "missing",
            "exists, not writable by the job's user",
            f"every launch: {claims}",
        )
    parent = f.get("workdir_parent", "") or "?"
    if writable:
        return make_check(
            "workdir", "ok", f"not there yet: the first claim makes it in {parent}", claims
        )
    return make_check(
        "workdir",
        "missing",
        f"does not exist, and the job's user cannot make it in {parent}",
        f"every launch: {claims}",
    )


def _disk(f: Mapping[str, str], options: DoctorOptions) -> DoctorCheck:
    match = _DF_LINE.search(f.get("df", ""))
    breaks = "room for checkpoints; the disk policy asks for snapshots when it runs short"
    if match is None:
        found = f.get("df", "") or "no answer"
        return make_check("disk", "warn", f"df -Pk: {found[:120]}", f"the disk policy: {breaks}")
    size, used, avail = (int(match[n]) * _KIB for n in (1, 2, 3))
    sample = DiskSample(size, used, avail, None)
    found = (
        f"{format_bytes(avail)} free of {format_bytes(size)} "
        f"({sample.used_fraction * 100:.0f} % used)"
    )
    verdict = disk_verdict(sample, options.disk_used_fraction)
    if verdict is None:
        return make_check("disk", "ok", found, breaks)
    return make_check(
        "disk",
        "warn",
        found,
        f"the disk policy asks every run here for a snapshot at once: {verdict}",
    )
