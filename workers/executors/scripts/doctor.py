"""The doctor's probe: one POSIX `sh` script that finds what the other scripts of this
package need on a target (the shell, `setsid`, `tar`, the coreutils pieces, `/proc`,
an HTTP client, Python, the workdir, its disk), a tiny script reading the target's
clock, and the parsers of their answers. What each finding means, and what it breaks,
is decided by `workers.executors.doctor`.

The probe changes nothing on the target but one scratch directory of its own, made
and removed by itself: `<workdir>/.runwarden-doctor.<pid>.<random>` where the job's
user must write run directories (in the nearest existing parent of a workdir that
does not exist yet, which the first claim would create there), else one `mktemp -d`
makes (a workdir that is not the job's to write: a worker that is root makes run
directories there itself),
used to try `mv -T` and an extraction, and removed before the script ends (a trap
removes it on `HUP`, `INT` or `TERM`). Only a `SIGKILL` (a script past its deadline)
can leave it behind, under that name. Every other test reads, or writes to
`/dev/null`.
"""

from __future__ import annotations

import re
from typing import Final

from ..errors import InvalidArgument, ProtocolError
from .common import quote

__all__ = [
    "CLOCK_SCRIPT",
    "DOCTOR_OUTPUT_LIMIT",
    "DOCTOR_TIMEOUT_S",
    "DOCTOR_VALUE_LIMIT",
    "SCRATCH_PREFIX",
    "doctor_script",
    "parse_clock",
    "parse_doctor",
]

DOCTOR_TIMEOUT_S: Final = 60.0
"""Longest run of the probe, in seconds (Python's start is the slowest part)."""
DOCTOR_OUTPUT_LIMIT: Final = 64 * 1024
"""Bytes of the probe's output [`parse_doctor`] looks at; the rest is ignored."""
DOCTOR_VALUE_LIMIT: Final = 300
"""Characters kept of one finding."""
SCRATCH_PREFIX: Final = ".runwarden-doctor."
"""The name of the probe's scratch directory starts with this."""

UTILITIES: Final = (
    "cat", "date", "df", "du", "find", "grep", "head", "ln", "mkdir", "mkfifo", "mv",
    "rm", "sed", "sleep", "tail", "tr", "xargs",
)  # fmt: skip
"""The programs the scripts call besides the shell's builtins, `setsid`, `tar`,
`sha256sum`, `dd`, `timeout` and the HTTP clients, which have checks of their own."""

_KEY: Final = re.compile(r"[a-z][a-z0-9_]{0,31}")
_SHA256_OF_ABC: Final = "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"

# The template: @NAME@ is replaced by a quoted word (never by text a shell would read
# as code). `rw_first` keeps the first line of a command's output, at most 200 bytes,
# so no tool can make one finding long or several.
_PROBE: Final = r"""
rw_t=@TOKEN@
rw_w=@WORKDIR@
rw_job_writes=@WRITES@
rw_say() { printf '%s %s %s\n' "$rw_t" "$1" "$2"; }
rw_first() {
  head -c 512 2>/dev/null | { IFS= read -r rw_l || :; printf '%s' "$rw_l" | head -c 200; }
}
rw_yes() { if "$@" >/dev/null 2>&1; then rw_say "$rw_k" yes; else rw_say "$rw_k" no; fi; }
rw_s=
rw_clean() { if [ -n "$rw_s" ]; then rm -rf -- "$rw_s" 2>/dev/null || :; rw_s=; fi; }
trap 'rw_clean; exit 1' HUP INT TERM
cd / || :

rw_exe=
if [ -h "/proc/$$/exe" ]; then rw_exe=$(readlink "/proc/$$/exe" 2>/dev/null) || rw_exe=; fi
rw_say sh_exe "$rw_exe"
rw_say sh_version "${BASH_VERSION:-${ZSH_VERSION:-${KSH_VERSION:-${YASH_VERSION:-}}}}"
if (eval 'rw_v=abc/def.tar
  [ "${#rw_v}" = 11 ] && [ "${rw_v%%/*}" = abc ] && [ "${rw_v##*.}" = tar ] &&
  [ "$((7 * 6 - 2))" = 40 ] && [ "$(printf "%s" x)" = x ] &&
  command -v printf && rw_fn() { return 3; } && { rw_fn; [ "$?" = 3 ]; } &&
  (set -C; set +C) && { trap "" USR2; trap - USR2; }') >/dev/null 2>&1
then rw_say sh_posix yes; else rw_say sh_posix no; fi

rw_say setsid "$(command -v setsid 2>/dev/null)"

rw_tar=$(command -v tar 2>/dev/null) || rw_tar=
rw_say tar "$rw_tar"
if [ -n "$rw_tar" ]; then
  rw_v=$(tar --version 2>/dev/null </dev/null | rw_first)
  [ -n "$rw_v" ] || rw_v=$(tar --help 2>&1 </dev/null | rw_first)
  rw_say tar_version "$rw_v"
  if printf '' | tar --null --no-recursion --hard-dereference -T - -cf - >/dev/null 2>&1
  then rw_say tar_create yes; else rw_say tar_create no; fi
fi

rw_sha=$(command -v sha256sum 2>/dev/null) || rw_sha=
rw_say sha256sum "$rw_sha"
if [ -n "$rw_sha" ]; then
  rw_h=$(printf abc | sha256sum 2>/dev/null) || rw_h=
  if [ "${rw_h%% *}" = @ABC@ ]; then rw_say sha256sum_works yes; else rw_say sha256sum_works no; fi
  rw_k=sha256sum_z; rw_yes sh -c "printf '' | sha256sum -z"
fi

rw_k=dd_nonblock
rw_yes dd if=/dev/null bs=1 count=0 iflag=nonblock,nofollow,skip_bytes,count_bytes status=none
rw_say timeout "$(command -v timeout 2>/dev/null)"
rw_k=timeout_works; rw_yes timeout 5 sh -c :
rw_k=sleep_fraction; rw_yes sleep 0.01

rw_missing=
for rw_u in @UTILITIES@; do
  command -v "$rw_u" >/dev/null 2>&1 || rw_missing="$rw_missing $rw_u"
done
rw_say utilities_missing "${rw_missing# }"
rw_broken=
[ "$(printf abcdef | head -c 2 2>/dev/null)" = ab ] || rw_broken="$rw_broken head-c"
[ "$(find /dev/null -prune -print0 2>/dev/null | tr '\000' '|' 2>/dev/null)" = '/dev/null|' ] ||
  rw_broken="$rw_broken find-print0"
[ "$(printf 'a b\000' | xargs -0 -r sh -c 'printf "<%s>" "$@"' rw 2>/dev/null)" = '<a b>' ] ||
  rw_broken="$rw_broken xargs-0"
[ "$(printf 'a=1\000b=2\000' | grep -cxzF b=2 2>/dev/null)" = 1 ] || rw_broken="$rw_broken grep-z"
rw_say utilities_broken "${rw_broken# }"

if [ -r "/proc/$$/stat" ]; then rw_say proc_stat yes; else rw_say proc_stat no; fi
rw_f=$(RW_DOCTOR_MARK="$rw_t" sh -c \
  'grep -lsxzF -- "RW_DOCTOR_MARK=$1" "/proc/$$/environ" 2>/dev/null' rw "$rw_t") || rw_f=
case $rw_f in /proc/*/environ) rw_say proc_environ yes ;; *) rw_say proc_environ no ;; esac

rw_say curl "$(command -v curl 2>/dev/null)"
rw_wget=$(command -v wget 2>/dev/null) || rw_wget=
rw_say wget "$rw_wget"
if [ -n "$rw_wget" ]; then
  rw_say wget_version "$(wget --version 2>/dev/null </dev/null | rw_first)"
fi

rw_py=$(command -v python3 2>/dev/null) || rw_py=
rw_say python "$rw_py"
if [ -n "$rw_py" ]; then
  rw_c='import sys; sys.stdout.write("%d.%d.%d" % tuple(sys.version_info[:3]))'
  if command -v timeout >/dev/null 2>&1; then
    rw_v=$(timeout 20 python3 -E -s -c "$rw_c" 2>/dev/null </dev/null | rw_first)
  else
    rw_v=$(python3 -E -s -c "$rw_c" 2>/dev/null </dev/null | rw_first)
  fi
  rw_say python_version "$rw_v"
fi

rw_d=$rw_w
if [ -d "$rw_w" ]; then
  rw_say workdir yes
else
  rw_say workdir no
  while [ ! -d "$rw_d" ]; do rw_d=${rw_d%/*}; [ -n "$rw_d" ] || rw_d=/; done
  rw_say workdir_parent "$rw_d"
fi
if [ "$rw_job_writes" = 1 ]; then
  rw_n="$rw_d/@SCRATCH@$$.@RANDOM@"
  if mkdir -- "$rw_n" 2>/dev/null; then rw_s=$rw_n; rw_say writable yes
  else rw_say writable no; fi
fi
if [ -z "$rw_s" ]; then
  rw_s=$(mktemp -d "${TMPDIR:-/tmp}/@SCRATCH@XXXXXX" 2>/dev/null) || rw_s=
  case $rw_s in /*) ;; *) rw_s= ;; esac
fi
rw_say df "$(df -Pk -- "$rw_d" 2>/dev/null | tail -n +2 2>/dev/null | rw_first)"

if [ -n "$rw_s" ]; then
  rw_say scratch yes
  # `true`, not `:`: a failed redirection of a special builtin ends the script.
  if { true > "$rw_s/a"; } 2>/dev/null && mv -fT -- "$rw_s/a" "$rw_s/b" 2>/dev/null &&
    [ -f "$rw_s/b" ] && [ ! -e "$rw_s/a" ]
  then rw_say mv_t yes; else rw_say mv_t no; fi
  if [ -n "$rw_tar" ]; then
    mkdir -- "$rw_s/x" 2>/dev/null || :
    if head -c 1024 /dev/zero 2>/dev/null | tar -xf - -o -C "$rw_s/x" >/dev/null 2>&1
    then rw_say tar_extract yes; else rw_say tar_extract no; fi
  fi
else
  rw_say scratch no
fi
rw_clean
rw_say end .
"""

_SCRATCH_RANDOM: Final = re.compile(r"[0-9a-f]{12}")


def doctor_script(workdir: str, token: str, *, job_writes_workdir: bool, random: str) -> str:
    """The probe of a target whose run directories live under `workdir`. It prints
    one finding a line, `<token> <key> <value>` (`value` one line, at most 200 bytes,
    empty when there is nothing), and `<token> end .` last; see the module docstring
    for what it writes. `job_writes_workdir` says whether the job's user makes run
    directories in `workdir` (then the probe tries to, as that user); `random` (12 hex
    digits) names its scratch directory.

    Keys (`yes`/`no` unless said): `sh_exe` (the shell's program, from `/proc`),
    `sh_version` (`$BASH_VERSION` and the like), `sh_posix` (parameter expansions,
    arithmetic, functions, `set -C`, `trap`); `setsid` (its path); `tar` (path),
    `tar_version` (first line of `--version`, else of `--help`), `tar_create` (a list
    archived as retrieval does: `--null --no-recursion --hard-dereference -T -`),
    `tar_extract` (an empty archive unpacked as upload does: `-x -o -C`);
    `sha256sum` (path), `sha256sum_works` (the hash of `abc`), `sha256sum_z`;
    `dd_nonblock` (the read of `scripts.common.READ_FILE`); `timeout` (path),
    `timeout_works`; `sleep_fraction`; `utilities_missing` and `utilities_broken`
    (space-separated: programs of [`UTILITIES`] absent; `head-c`, `find-print0`,
    `xargs-0`, `grep-z` that do not work); `proc_stat`, `proc_environ` (a child
    finds its own mark in `/proc/<pid>/environ` with `grep -z`, as cancel's sweep
    does); `curl`, `wget` (paths), `wget_version`; `python` (path of `python3`),
    `python_version` (`X.Y.Z`); `workdir` (exists), else `workdir_parent` (the
    nearest directory that exists); `writable` (only when the job writes the
    workdir: a directory was made in the workdir, else in that parent, as the
    claim's `mkdir -p` would); `df` (the data line of `df -Pk` of the workdir, else
    of that parent); `scratch` (a scratch directory was made), `mv_t` (`mv -fT`
    over a file).

    Raises:
        InvalidArgument: for a token that is not alphanumeric, a workdir that is not
            absolute, or `random` that is not 12 hex digits.
    """
    if not token.isalnum() or not token.isascii():
        raise InvalidArgument("the probe token is alphanumeric")
    if not workdir.startswith("/"):
        raise InvalidArgument(f"not an absolute path: {workdir[:200]!r}")
    if _SCRATCH_RANDOM.fullmatch(random) is None:
        raise InvalidArgument("the scratch name's random part is 12 hex digits")
    values = {
        "TOKEN": token,
        "WORKDIR": quote(workdir),
        "WRITES": "1" if job_writes_workdir else "0",
        "ABC": _SHA256_OF_ABC,
        "UTILITIES": " ".join(UTILITIES),
        "SCRATCH": SCRATCH_PREFIX,
        "RANDOM": random,
    }
    return re.sub(r"@([A-Z]+)@", lambda m: values[m[1]], _PROBE)


def parse_doctor(output: bytes, token: str) -> dict[str, str]:
    """The findings of a [`doctor_script`] run: key -> value. Reads at most
    [`DOCTOR_OUTPUT_LIMIT`] bytes, lines ending in `\n` or `\r\n`; a line that does
    not start with the token, or whose key is not a lower-case name, is ignored; a
    value is decoded (bad UTF-8 replaced), stripped of control characters and cut to
    [`DOCTOR_VALUE_LIMIT`] characters; of a key given twice, the first value counts.

    Raises:
        ProtocolError: when the end record is not within the bytes read (the probe
            was cut short, or the shell could not run it).
    """
    head = token.encode() + b" "
    found: dict[str, str] = {}
    for line in output[:DOCTOR_OUTPUT_LIMIT].split(b"\n"):
        line = line.removesuffix(b"\r")  # noqa: PLW2901 - a line end of `\r\n` is one end
        if not line.startswith(head):
            continue
        key_bytes, _, raw = line[len(head) :].partition(b" ")
        key = key_bytes.decode("ascii", "replace")
        if _KEY.fullmatch(key) is None:
            continue
        if key == "end":
            return found
        text = raw.decode("utf-8", "replace")
        value = "".join(c for c in text if c.isprintable())[:DOCTOR_VALUE_LIMIT].strip()
        found.setdefault(key, value)
    raise ProtocolError("the doctor's probe was cut short (no end record)")


CLOCK_SCRIPT: Final = r"""rw_d=$(date +%s%N 2>/dev/null) || rw_d=
case $rw_d in ''|*[!0-9]*) rw_d=$(date +%s 2>/dev/null) || exit 3 ;; esac
printf '%s\n' "$rw_d"
"""
"""Prints the target's clock: Unix nanoseconds where `date` has `%N` (GNU), else
Unix seconds (busybox, BSD)."""

_NS_DIGITS: Final = 19  # Unix time in ns has 19 digits from 2001 to 2286


def parse_clock(output: bytes) -> tuple[float, float]:
    """The target's time in Unix seconds and the resolution of that reading in
    seconds (1e-9 for nanoseconds, 1 for whole seconds), from a [`CLOCK_SCRIPT`]
    answer.

    Raises:
        ProtocolError: for anything but one line of 1 to 12 digits (seconds) or of
            19 or 20 digits (nanoseconds).
    """
    text = output[:64].decode("ascii", "replace").strip()
    if text.isdigit() and text.isascii():
        if 1 <= len(text) <= 12:
            return float(text), 1.0
        if _NS_DIGITS <= len(text) <= _NS_DIGITS + 1:
            return int(text) / 1e9, 1e-9
    raise ProtocolError(f"the target's clock answered {text[:40]!r}")
