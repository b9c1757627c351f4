"""Hostile jobs: each a few lines of `sh` that attack what runwarden reads and writes
in its run directory, for the hostile-job matrix
(tests/integration/service/test_hostile_jobs.py) and the chaos campaign
(bench/chaos.py, tests/integration/service/test_chaos.py).

Every hostile job runs until it is killed and never writes a proof, so a stop of it
ends `cancelled` by its proof deadline. Each job resets its own `PATH` first (a case
passes a secret named `PATH`), then does its harm once, then loops (`sleep 1`),
doing it again each turn where the case says so ("a job replaces the file after it
starts, and may keep replacing it").
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from producers.api import Runwarden
from schemas import TargetConfig
from workers.executors import quote
from workers.executors.scripts.follow import FOLLOW_CHUNK_BYTES

from .paths import ROOT

__all__ = [
    "BIG_BYTES",
    "CASES",
    "FIGHTER",
    "PROTOCOL_TARGETS",
    "REPLACEMENTS",
    "SHADOW",
    "Case",
    "file_digest",
    "job_environ",
    "provide_secrets",
    "script_names",
    "secret_values",
]

SHADOW = "/etc/shadow"
BIG_BYTES = 100 * 1024 * 1024
"""The size of the "huge file" replacement: 100 MiB (sparse: `truncate`)."""

PROTOCOL_TARGETS = (
    "snapshot.json",
    "snapshot.request",
    "exit_code",
    "cancelled",
    "job.pid",
    "job.log",
    "metrics.jsonl",
)
"""The run-directory files a job replaces."""

# Each turn of the loop puts the replacement back when it is not there (runwarden
# replaces `snapshot.request`; a check first keeps a turn to one cheap test). `$F` is
# the file's name, relative to the run directory (the job's working directory).
REPLACEMENTS: dict[str, str] = {
    "dir": 'if [ -h "$F" ] || [ ! -d "$F" ]; then rm -rf -- "$F"; mkdir -- "$F"; fi',
    "fifo": 'if [ -h "$F" ] || [ ! -p "$F" ]; then rm -rf -- "$F"; mkfifo -- "$F"; fi',
    "link-zero": '[ -h "$F" ] || { rm -rf -- "$F"; ln -s /dev/zero "$F"; }',
    "link-fifo": "[ -p .hostile.fifo ] || mkfifo .hostile.fifo\n"
    '  [ -h "$F" ] || { rm -rf -- "$F"; ln -s "$PWD/.hostile.fifo" "$F"; }',
    "link-shadow": f'[ -h "$F" ] || {{ rm -rf -- "$F"; ln -s {SHADOW} "$F"; }}',
    "big": '[ -n "$(find "$F" -maxdepth 0 -type f -size +102399k 2>/dev/null)" ] ||\n'
    '  { rm -rf -- "$F"; truncate -s 100M -- "$F"; }',
}
"""How each kind of replacement is made (and made again): a directory, a FIFO, a
symbolic link to /dev/zero, to a FIFO, to /etc/shadow, and a 100 MiB file."""

_PROLOGUE = "PATH=/usr/bin:/bin; export PATH\n"


def _loop(once: str, each: str = "") -> str:
    return f"{_PROLOGUE}{once}\nwhile :; do\n  {each or ':'}\n  sleep 1\ndone\n"


def _replacing(name: str, kind: str) -> str:
    return _loop(f"F={quote(name)}\nsleep 0.3", REPLACEMENTS[kind])


def _metrics(line: str) -> str:
    """Writes the hostile metrics `line` (shell code printing it) once, then a good
    `log` line a second (steps 7, 8, ...): the run's follow must go on past the bad
    line."""
    return (
        f'{_PROLOGUE}M=$RUNWARDEN_METRICS\nsleep 0.3\n{{ {line}; }} >> "$M"\n'
        "s=7\nwhile :; do\n"
        '  printf \'{"event": "log", "time": %s, "step": %s, "loss": 0.5}\\n\' '
        '"$(date +%s)" "$s" >> "$M"\n'
        "  s=$((s + 1))\n  sleep 1\ndone\n"
    )


_NINES = "1" + "0" * 399  # 400 digits
_METRICS_LINES = {
    "nested-50000": 'printf \'{"event": "log", "step": 3, "x": \'; '
    "head -c 50000 /dev/zero | tr '\\0' '['; head -c 50000 /dev/zero | tr '\\0' ']'; "
    "printf '}\\n'",
    "number-400-digits": (
        f'printf \'%s\\n\' \'{{"event": "begin", "time": {_NINES}, "max_steps": {_NINES}}}\' '
        f'\'{{"event": "log", "time": 1, "step": {_NINES}, "loss": {_NINES}}}\''
    ),
    "invalid-utf8": 'printf \'{"event": "log", "step": 4, "note": "\\377\\376\\200"}\\n'
    "\\377{\\300\\n'",
    "line-10MiB": 'printf \'{"event": "log", "step": 5, "pad": "\'; '
    "head -c 10485760 /dev/zero | tr '\\0' a; printf '\"}\\n'",
}


FIGHTER = r"""
import os, signal, sys, time
sig, scope = getattr(signal, sys.argv[1]), sys.argv[2].encode()
me, uid = os.getpid(), os.getuid()
open("armed", "w").close()
while True:
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == me:
            continue
        try:
            if os.stat("/proc/" + pid).st_uid != uid:
                continue
            words = open("/proc/" + pid + "/cmdline", "rb").read().split(b"\0")
            if b"rw" in words[3:4] and any(scope in w for w in words[4:]):
                os.kill(int(pid), sig)
        except OSError:
            pass
    time.sleep(0.02)
"""
"""A daemon a hostile job leaves behind (its own session, an empty environment), in
Python: `python FIGHTER SIGNAL SCOPE`. Once armed (the file `armed` in its working
directory), it sends SIGNAL to every process of its user whose command line names a
worker's script (`sh -c SCRIPT rw ARG...`), 50 times a second. Only scripts with an
argument holding SCOPE (the test's own directory): tests beside it run scripts as the
same user, which a real hostile job would attack too."""


def script_names() -> list[str]:
    """Every `rw_*` shell name the executors' scripts use (their variables and
    functions), read from the scripts themselves (`workers/executors/sh/*.sh`, and the
    modules that build them): each a secret name of a case."""
    executors = ROOT / "workers" / "executors"
    names: set[str] = set()
    for path in sorted([*(executors / "sh").glob("*.sh"), *(executors / "scripts").glob("*.py")]):
        names.update(re.findall(r"\brw_[A-Za-z0-9_]*", path.read_text()))
    return sorted(names)


def secret_values(names: list[str]) -> dict[str, str]:
    """A hostile value for each secret name: quotes, `$()`, backquotes, spaces at both
    ends, a tab, a backslash (never a line end or NUL, which no secret may hold)."""
    return {name: f" \t{name}'\"$(touch /tmp/rw-pwned-{name})`id`\\ ;{name} " for name in names}


def provide_secrets(api: Runwarden, names: Iterable[str], targets: Iterable[str]) -> None:
    """As an operator would for the hostile cases: the hostile value of each secret
    of `names` in the workers' secrets directory (the one of `api`'s settings), and
    each of `targets` allowing them all."""
    allowed = tuple(sorted(set(names)))
    for name, value in secret_values(list(allowed)).items():
        api.settings.secrets.ensure(name, make=value)
    for target in targets:
        config = TargetConfig.model_validate(api.store.targets.get(target))
        api.add_target(config.model_copy(update={"allow_secrets": allowed}))


@dataclass(frozen=True)
class Case:
    """One hostile job: its name, its `sh` script, the secrets it is launched with, and
    what the test checks beyond the common invariants (`kind`)."""

    name: str
    script: str
    kind: str = "files"
    """`files`, `forged`, `secrets`, `escape` (processes that leave the group),
    `stubborn` (processes of the group deaf to SIGTERM), `hidden` (a process that
    leaves the group and clears its environment: only a cgroup holds it), `metrics`."""
    secrets: tuple[str, ...] = ()
    expect_step: int | None = None
    """A `metrics` case: the step of a good line after the bad one the follow must
    have recorded."""
    expect_metrics_bytes: int | None = None
    """A `metrics` case whose bad line takes many ticks to read (a tick reads at most
    256 KiB of a file): how far the follow must have read `metrics.jsonl`."""


def _cases() -> list[Case]:
    cases = [
        Case(f"{target}-{kind}", _replacing(target, kind))
        for target in PROTOCOL_TARGETS
        for kind in REPLACEMENTS
    ]
    cases += [
        Case(
            "forged-exit-code",
            _loop("sleep 0.3; echo 0 > exit_code", "echo 0 > exit_code"),
            kind="forged",
        ),
        Case("forged-cancelled", _loop("sleep 0.3; : > cancelled", ": > cancelled"), kind="forged"),
        # Lines shaped as the follow's records (a status, an end) for every word of
        # every command line it can read, where a follow script's token is whenever the
        # job may read that script's: the follow encodes job.log's bytes, so none is
        # ever taken for a record.
        Case(
            "imitation-records",
            _loop(
                "sleep 0.3",
                "cat /proc/[0-9]*/cmdline 2>/dev/null | tr '\\0' '\\n' |"
                " grep -E '^[A-Za-z0-9]{8,64}$' | sort -u | head -200 |"
                " sed 's/.*/& S 0 exited 0\\n& S 1 exited 0\\n& E/' >> job.log",
            ),
            kind="forged",
        ),
    ]
    # `IFS` is no case: a secret of that name is refused at the launch (every shell on
    # the job's way resets it; schemas.job.SHELL_NAMES), tests/unit/schemas/test_job.py.
    every = sorted({"PATH", *script_names()})
    cases += [
        Case(f"secret-{name}", _loop(""), kind="secrets", secrets=(name,))
        for name in ("PATH", "rw_setsid")
    ]
    cases.append(Case("secret-all-rw", _loop(""), kind="secrets", secrets=tuple(every)))
    cases += [
        Case(
            "setsid-child",
            _loop("setsid sh -c 'while :; do sleep 1; done' </dev/null >/dev/null 2>&1 &"),
            kind="escape",
        ),
        Case(
            "nohup-daemon",
            _loop(
                'sh -c \'setsid nohup sh -c "trap \\"\\" TERM HUP; '
                "while :; do sleep 1; done\" </dev/null >/dev/null 2>&1 &' &"
            ),
            kind="escape",
        ),
        # Out of the group and with no mark: only a cgroup holds it. Its command line
        # names the run directory, for the test to find it (`hidden_processes`).
        # Deaf to SIGTERM, with 100 children of its group deaf to it too: the cancel's
        # SIGKILL after its wait ends them all.
        Case(
            "term-ignored-100-children",
            _loop(
                "trap '' TERM\ni=0\nwhile [ \"$i\" -lt 100 ]; do\n"
                "  sh -c 'while :; do sleep 1; done' </dev/null >/dev/null 2>&1 &\n"
                "  i=$((i + 1))\ndone"
            ),
            kind="stubborn",
        ),
        Case(
            "env-i-daemon",
            _loop(
                "setsid env -i /bin/sh -c 'trap \"\" TERM; while :; do sleep 1; done' "
                'rw-hidden "$PWD" </dev/null >/dev/null 2>&1 &'
            ),
            kind="hidden",
        ),
    ]
    cases += [
        Case(f"metrics-{name}", _metrics(line), kind="metrics", expect_step=8)
        for name, line in _METRICS_LINES.items()
        if name != "line-10MiB"
    ]
    # 10 MiB take 40 ticks to read at 256 KiB a tick: more than a stopped run lives
    # here. The follow must be reading on, not stuck on the line: four ticks' worth
    # at least (each reads a chunk less one byte of a line it cuts; a stuck follow
    # reads one chunk, or none; a loaded machine may give the run only 8 ticks).
    cases.append(
        Case(
            "metrics-line-10MiB",
            _metrics(_METRICS_LINES["line-10MiB"]),
            kind="metrics",
            expect_metrics_bytes=4 * (FOLLOW_CHUNK_BYTES - 1),
        )
    )
    return cases


CASES: list[Case] = _cases()
"""The matrix: 7 files x 6 replacements, 2 forged markers and imitation follow
records, 3 secret sets, 2 escapes, 100 children deaf to SIGTERM, 1 hidden daemon,
4 metrics lines."""


def job_environ(pid: int) -> dict[str, str]:
    """The environment of process `pid` (`/proc/<pid>/environ`), decoded with
    surrogate escapes; empty when it cannot be read."""
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return {}
    found = {}
    for entry in raw.split(b"\0"):
        name, sep, value = entry.partition(b"=")
        if sep:
            found[name.decode("utf-8", "surrogateescape")] = value.decode(
                "utf-8", "surrogateescape"
            )
    return found


def file_digest(path: str) -> tuple[str, int]:
    """SHA-256 and mtime (ns) of `path`: the fingerprint a test compares before and
    after, to show runwarden never wrote through a job's link."""
    data = Path(path).read_bytes()
    return hashlib.sha256(data).hexdigest(), Path(path).stat().st_mtime_ns
