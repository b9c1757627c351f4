"""The POSIX `sh` scripts of the on-target protocol, written once and run by every
executor (local and SSH), and the parsers of their answers.

Every value that reaches a script goes through [`quote`]: paths, owners, patterns,
names, file content. Scripts run under dash and busybox `sh`; they use only POSIX
utilities plus `setsid`, `head -c`, `find -print0`, `xargs -0` (and GNU `tar` and
`sha256sum -z` where a faster path exists, with a portable fallback for hashing).
"""

from __future__ import annotations

import math
import re
import secrets as _secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Final

from schemas import JobId, JobStatus, check_pid
from schemas.protocol import (
    CANCEL_FILE,
    CANCELLING_FILE,
    CLAIM_FILE,
    EXIT_FILE,
    JOB_LOG,
    JOBSIDE_DIR,
    METRICS_FILE,
    PID_FILE,
    SNAPSHOT_FILE,
    SNAPSHOT_REQUEST,
)

from .errors import InvalidArgument, ProtocolError

__all__ = [
    "CANCEL_KILL_WAIT_S",
    "CANCEL_TERM_WAIT_S",
    "FOLLOW_CHUNK_BYTES",
    "GROUP_SIGNAL",
    "WATCHDOG_PID_FILE",
    "FollowUpdate",
    "archive_script",
    "cancel_script",
    "check_exclude",
    "check_owner",
    "claim_script",
    "follow_script",
    "launcher_script",
    "manifest_script",
    "parse_claim",
    "parse_follow",
    "parse_status",
    "parse_statuses",
    "put_file_script",
    "quote",
    "read_range_script",
    "status_script",
    "unpack_script",
    "watchdog_script",
    "wrapper_script",
]

CANCEL_TERM_WAIT_S: Final = 10
"""How long cancel waits for the group to end after SIGTERM, in seconds."""
CANCEL_KILL_WAIT_S: Final = 10
"""How long cancel waits for the group to be gone after SIGKILL, in seconds."""
_TICKS_PER_S: Final = 10  # the wait loops sleep 0.1 s a turn

GROUP_SIGNAL: Final = r"""
rw_signal() { kill -s "$2" -- "-$1" 2>/dev/null || kill -s "$2" "-$1" 2>/dev/null; }
rw_alive() { rw_signal "$1" 0; }
rw_nap() { sleep 0.1 2>/dev/null || sleep 1; }
"""
"""Shell functions: `rw_signal PGID SIG` signals a whole process group under dash
(`kill -s SIG -- -PID`) and busybox (`kill -s SIG -PID`); `rw_alive PGID` tells
whether any process of the group exists (a zombie counts: whoever started the job
reaps it)."""


def quote(value: str) -> str:
    """`value` as one POSIX shell word that expands to exactly `value`: single-quoted,
    each `'` written as `'\\''`. Works for every character but NUL.

    Raises:
        InvalidArgument: when `value` holds a NUL byte, which no shell word can.
    """
    if "\0" in value:
        raise InvalidArgument("a shell argument cannot hold a NUL byte")
    return "'" + value.replace("'", "'\\''") + "'"


def _status_function() -> str:
    # The group's liveness is sampled once, before any marker is read: a job that
    # writes its exit code and ends between two reads is then seen as exited, never
    # lost.
    return f"""
rw_status() {{
  if [ ! -d "$1" ]; then echo lost; return 0; fi
  if rw_alive "$2"; then rw_a=1; else rw_a=0; fi
  if [ -e "$1/{CANCEL_FILE}" ]; then echo cancelled
  elif [ -e "$1/{CANCELLING_FILE}" ] && [ "$rw_a" = 1 ]; then echo running
  elif [ -e "$1/{EXIT_FILE}" ]; then
    rw_c=; IFS= read -r rw_c < "$1/{EXIT_FILE}" || :
    printf 'exited %.32s\\n' "$rw_c"
  elif [ -e "$1/{CANCELLING_FILE}" ]; then echo cancelled
  elif [ "$rw_a" = 1 ]; then echo running
  else echo lost
  fi
}}
"""


def _pid(job: JobId) -> int:
    # A JobId built without validation must still never make a script signal the
    # wildcard group 0 or init.
    try:
        return check_pid(job.pid)
    except ValueError as error:
        raise InvalidArgument(str(error)) from error


def status_script(jobs: Sequence[JobId]) -> str:
    """A script printing one status line per job of `jobs`, in order: `running`,
    `exited <code>`, `cancelled` or `lost`, decided in the seeds' order:

    1. `cancelled` exists -> cancelled;
    2. `cancelling` exists and the group is alive -> running;
    3. `exit_code` exists -> exited(code);
    4. `cancelling` exists (group gone) -> cancelled;
    5. the group is alive -> running; otherwise lost. A missing directory is lost.
    """
    calls = "\n".join(f"rw_status {quote(job.dir)} {_pid(job)}" for job in jobs)
    return GROUP_SIGNAL + _status_function() + calls + "\n"


_EXITED = re.compile(r"exited (-?[0-9]{1,11})")


def parse_status(line: str) -> JobStatus:
    """The [`JobStatus`] one line of [`status_script`] names.

    Raises:
        ProtocolError: for anything else, such as an `exit_code` file that does not
            hold an integer (the line is shown, cut to 80 characters).
    """
    text = line.strip()
    if text == "running":
        return JobStatus.RUNNING
    if text == "cancelled":
        return JobStatus.CANCELLED
    if text == "lost":
        return JobStatus.LOST
    match = _EXITED.fullmatch(text)
    if match is not None:
        code = int(match[1])
        if -(2**31) <= code < 2**31:
            return JobStatus.exited(code)
    raise ProtocolError(f"status {text[:80]!r}")


def parse_statuses(output: bytes, count: int) -> list[JobStatus | ProtocolError]:
    """The statuses of a [`status_script`] run over `count` jobs, in order. A line
    that does not parse (a garbage `exit_code` file in one run directory) gives that
    job a [`ProtocolError`], and the others their status.

    Raises:
        ProtocolError: when the output is not `count` lines.
    """
    lines = output.decode("utf-8", "replace").splitlines()
    if len(lines) != count:
        raise ProtocolError(f"{len(lines)} status lines for {count} jobs")
    results: list[JobStatus | ProtocolError] = []
    for line in lines:
        try:
            results.append(parse_status(line))
        except ProtocolError as error:
            results.append(error)
    return results


def cancel_script(job: JobId) -> str:
    """A script that cancels `job` as the seeds do, to its end:

    - no-op (exit 0) when `cancelled` or `exit_code` already exists: a recycled pid
      is never signalled, an exited job is never marked cancelled;
    - exit 3 when the run directory does not exist;
    - otherwise writes `cancelling`, stops the container if any
      (`<engine> stop -t 30 <name>`), SIGTERMs the group, waits up to 10 s, SIGKILLs
      it, waits up to 10 s for it to be gone, then writes `cancelled`;
    - exit 5 with a message when the group survives: `cancelling` stays, and a later
      cancel retries.
    """
    container = ""
    if job.container is not None:
        container = (
            f"{quote(job.container.engine)} stop -t 30 {quote(job.container.name)}"
            " >/dev/null 2>&1 || :\n"
        )
    term_ticks = CANCEL_TERM_WAIT_S * _TICKS_PER_S
    kill_ticks = CANCEL_KILL_WAIT_S * _TICKS_PER_S
    return (
        GROUP_SIGNAL
        + f"""
rw_dir={quote(job.dir)}
rw_pid={_pid(job)}
rw_gone() {{
  rw_i=0
  while rw_alive "$rw_pid"; do
    rw_i=$((rw_i + 1))
    [ "$rw_i" -gt "$1" ] && return 1
    rw_nap
  done
  return 0
}}
if [ -e "$rw_dir/{CANCEL_FILE}" ] || [ -e "$rw_dir/{EXIT_FILE}" ]; then exit 0; fi
if [ ! -d "$rw_dir" ]; then printf '%s does not exist\\n' "$rw_dir" >&2; exit 3; fi
: > "$rw_dir/{CANCELLING_FILE}" || exit 4
{container}rw_signal "$rw_pid" TERM
if ! rw_gone {term_ticks}; then
  rw_signal "$rw_pid" KILL
  if ! rw_gone {kill_ticks}; then
    printf 'process group %s survived SIGKILL\\n' "$rw_pid" >&2
    exit 5
  fi
fi
: > "$rw_dir/{CANCEL_FILE}" || exit 4
"""
    )


def check_owner(owner: str) -> str:
    """Returns `owner` when it is one non-empty line without NUL, else raises
    [`InvalidArgument`]."""
    if not owner or any(c in owner for c in "\n\r\0"):
        raise InvalidArgument("a claim owner is one non-empty line")
    return owner


def claim_script(dir: str, owner: str) -> str:
    """A script that claims `dir` for `owner`: creates it and its parents, then
    `.claim` exclusively (a hard link of a complete temporary file, so a reader never
    sees a partial owner). Prints `claimed` when the claim is `owner`'s (new or
    already), `taken` when another owner holds it; then nothing was changed."""
    check_owner(owner)
    token = _secrets.token_hex(6)
    return f"""
rw_dir={quote(dir)}
rw_owner={quote(owner)}
mkdir -p -- "$rw_dir" || exit 3
rw_tmp="$rw_dir/{CLAIM_FILE}.tmp.$$.{token}"
printf '%s\\n' "$rw_owner" > "$rw_tmp" || exit 3
if ln -- "$rw_tmp" "$rw_dir/{CLAIM_FILE}" 2>/dev/null; then
  rm -f -- "$rw_tmp"; echo claimed; exit 0
fi
if [ ! -e "$rw_dir/{CLAIM_FILE}" ] &&
  (set -C; cat -- "$rw_tmp" > "$rw_dir/{CLAIM_FILE}") 2>/dev/null; then
  rm -f -- "$rw_tmp"; echo claimed; exit 0
fi
rm -f -- "$rw_tmp"
rw_cur=; IFS= read -r rw_cur < "$rw_dir/{CLAIM_FILE}" || :
if [ "$rw_cur" = "$rw_owner" ]; then echo claimed; else echo taken; fi
"""


def parse_claim(output: bytes) -> bool:
    """Whether a [`claim_script`] run claimed its directory.

    Raises:
        ProtocolError: for any answer but `claimed` or `taken`.
    """
    text = output.decode("utf-8", "replace").strip()
    if text == "claimed":
        return True
    if text == "taken":
        return False
    raise ProtocolError(f"claim answered {text[:80]!r}")


def read_range_script(path: str, offset: int, limit: int) -> str:
    """A script printing at most `limit` bytes of `path` from byte `offset`: nothing
    for a missing file; exit 3 for something that exists but is not a readable
    regular file."""
    if offset < 0 or limit < 0:
        raise InvalidArgument("offset and limit are non-negative")
    # One process fewer from the start of the file: a poll over SSH pays per fork.
    if offset == 0:
        read = f'head -c {limit} -- "$rw_path"'
    else:
        # One process with GNU dd (RW_GNU_DD is set by a shell that found it), else two.
        read = (
            f'if [ -n "${{RW_GNU_DD-}}" ]; then dd if="$rw_path" bs=65536 skip={offset} '
            f"count={limit} iflag=skip_bytes,count_bytes status=none; "
            f'else tail -c +{offset + 1} -- "$rw_path" | head -c {limit}; fi'
        )
    return f"""
rw_path={quote(path)}
[ -e "$rw_path" ] || exit 0
if [ ! -f "$rw_path" ] || [ ! -r "$rw_path" ]; then
  printf 'cannot read %s\\n' "$rw_path" >&2; exit 3
fi
{read}
"""


def put_file_script(path: str, parent: str, content: str) -> str:
    """A script that replaces `path` (in the directory `parent`, created if needed)
    with `content` through a rename from a temporary name unique to this writer
    (shell pid and a random token), so a reader sees the old or the new content,
    never a part."""
    token = _secrets.token_hex(6)
    return f"""
rw_path={quote(path)}
[ -d {quote(parent)} ] || mkdir -p -- {quote(parent)} || exit 3
rw_tmp="$rw_path.rw-tmp.$$.{token}"
if printf '%s' {quote(content)} > "$rw_tmp" && mv -f -- "$rw_tmp" "$rw_path"; then exit 0; fi
rm -f -- "$rw_tmp"
exit 3
"""


_PATTERN_SPECIALS = re.compile(r"[\[\]\\/]")


def check_exclude(pattern: str) -> str:
    """Returns `pattern` when it is a name pattern in the executors' glob syntax: `*`
    (any run of characters) and `?` (one character), every other character literal,
    no `/`, `[`, `]` or `\\`, not empty. Raises [`InvalidArgument`] otherwise."""
    if not pattern or "\0" in pattern or _PATTERN_SPECIALS.search(pattern):
        raise InvalidArgument(
            f"exclude pattern {pattern[:80]!r}: use a name with only * and ? as wildcards"
        )
    return pattern


def _find_args(excludes: Sequence[str]) -> str:
    if not excludes:
        return ""
    names = " -o ".join(f"-name {quote(check_exclude(p))}" for p in excludes)
    return f"\\( {names} \\) -prune -o"


def _entries_loop(root: str, entries: Sequence[str], body: str) -> str:
    words = " ".join(quote(e) for e in entries)
    return f"""
rw_root={quote(root)}
if [ ! -d "$rw_root" ]; then printf '%s does not exist\\n' "$rw_root" >&2; exit 3; fi
cd -- "$rw_root" || exit 3
rw_main=$$
for rw_e in {words}; do
  [ -e "./$rw_e" ] || [ -h "./$rw_e" ] || continue
{body}
done
"""


MANIFEST_OPENSSL_ABOVE: Final = 4 * 1024 * 1024
"""Files larger than this many bytes are hashed by `openssl dgst` where it works: one
process a file, worth it once the file takes longer to hash than a process to start."""
_EMPTY_SHA256: Final = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"


def manifest_script(root: str, entries: Sequence[str], exclude: Sequence[str]) -> str:
    """A script printing `<sha256 hex>  ./<path>` NUL-terminated records for every
    regular file under `entries` of `root`, names matching an `exclude` pattern left
    out at any depth, symbolic links not followed. Exit 3 when `root` is not a
    directory. Each file is read once. Files above [`MANIFEST_OPENSSL_ABOVE`] go to
    `openssl dgst -sha256` where it answers correctly (its SHA-256 uses the CPU's
    SHA instructions: 4x coreutils' `sha256sum` measured on x86 with SHA-NI, which
    made the manifest slower than a 1 GiB download over SSH); the others to
    `sha256sum -z` where it exists (GNU), else to one `sha256sum` a file (busybox)."""
    if not entries:
        return "exit 0\n"
    prune = _find_args(exclude)
    big = MANIFEST_OPENSSL_ABOVE
    body = f"""
  if [ -n "$rw_o" ]; then
    find "./$rw_e" {prune} -type f -size +{big}c -exec sh -c '
      for f do h=$(openssl dgst -sha256 -r < "$f") || exit 4
        printf "%s  %s\\0" "${{h%% *}}" "$f"; done
    ' rw {{}} + || exit 4
  fi
  if [ -n "$rw_z" ]; then
    {{ find "./$rw_e" {prune} -type f $rw_small -print0 || kill -s TERM "$rw_main"; }} |
      xargs -0 -r sha256sum -z -- || exit 4
  else
    find "./$rw_e" {prune} -type f $rw_small -exec sh -c '
      for f do h=$(sha256sum < "$f") || exit 4; printf "%s  %s\\0" "${{h%% *}}" "$f"; done
    ' rw {{}} + || exit 4
  fi"""
    head = f"""if printf '' | sha256sum -z >/dev/null 2>&1; then rw_z=1; else rw_z=; fi
case $(printf '' | openssl dgst -sha256 -r 2>/dev/null) in
  "{_EMPTY_SHA256} "*) rw_o=1; rw_small="-size -{big + 1}c" ;;
  *) rw_o=; rw_small= ;;
esac
"""
    return head + _entries_loop(root, entries, body)


def archive_script(root: str, entries: Sequence[str], exclude: Sequence[str]) -> str:
    """A script writing to stdout a tar stream of `entries` of `root` (directories,
    files and symbolic links, links not followed), names matching an `exclude`
    pattern left out at any depth. Exit 3 when `root` is not a directory. Needs GNU
    tar (`--null -T -`)."""
    if not entries:
        return "exit 0\n"
    prune = _find_args(exclude)
    words = " ".join(quote(e) for e in entries)
    return f"""
rw_root={quote(root)}
if [ ! -d "$rw_root" ]; then printf '%s does not exist\\n' "$rw_root" >&2; exit 3; fi
cd -- "$rw_root" || exit 3
rw_main=$$
for rw_e in {words}; do
  [ -e "./$rw_e" ] || [ -h "./$rw_e" ] || continue
  find "./$rw_e" {prune} -print0 || kill -s TERM "$rw_main"
done | tar --null --no-recursion -T - -cf - || exit 4
"""


def unpack_script(remote: str) -> str:
    """A script that creates `remote` and unpacks the tar stream on its stdin there,
    without restoring owners."""
    return f"""
rw_dest={quote(remote)}
mkdir -p -- "$rw_dest" || exit 3
tar -xf - -o -C "$rw_dest" || exit 4
"""


def wrapper_script(dir: str, script: str) -> str:
    """The job wrapper, run as `sh -c` by the session leader of the job: writes its own
    pid to `job.pid` first, runs `script` in a child `sh`, then writes the script's
    exit code to `exit_code` last (both through a temporary name and a rename)."""
    return f"""cd -- {quote(dir)} || exit 126
printf '%s\\n' "$$" > "{PID_FILE}.tmp.$$" && mv -f -- "{PID_FILE}.tmp.$$" {PID_FILE}
sh -c {quote(script)}
rw_code=$?
printf '%s\\n' "$rw_code" > "{EXIT_FILE}.tmp.$$" && mv -f -- "{EXIT_FILE}.tmp.$$" {EXIT_FILE}
exit "$rw_code"
"""


WATCHDOG_PID_FILE: Final = f"{JOBSIDE_DIR}/watchdog.pid"
"""Where the on-target watchdog records its pid, relative to the run directory. It
stays after the watchdog ended (like `job.pid`); spawn removes a stale one."""
_WATCHDOG_MAX_S: Final = 1e9  # about 31 years: milliseconds stay far inside sh arithmetic
_WATCHDOG_MIN_POLL_MS: Final = 10


def _watchdog_ms(name: str, seconds: float, least: int) -> int:
    if not math.isfinite(seconds) or not 0 < seconds <= _WATCHDOG_MAX_S:
        raise InvalidArgument(f"{name} is a number of seconds above 0 and at most 1e9")
    return max(least, round(seconds * 1000))


def watchdog_script(dir: str, after_s: float, poll_s: float) -> str:
    """The on-target watchdog of the job in `dir`: plain POSIX `sh` (no Python, no
    worker, no Redis), run as `sh -c` beside the job (see [`launcher_script`]). It
    asks for the `deadline` snapshot by itself when every worker is gone.

    - It reads the job's pid from `job.pid` (exit 3 when that is not a pid above 1),
      records its own in `.runwarden/watchdog.pid` (the folder created when missing;
      a temporary name and a rename) and moves to `/`, so it pins no directory.
    - Its fire time is `after_s` (rounded to milliseconds) after its own start, by
      the target's clock: `date +%s%N` where that gives nanoseconds (GNU), else
      `date +%s` (whole seconds: it fires within about a second of the time). When
      `date` fails, the time it slept stands in for the clock.
    - Each turn it sleeps the lesser of `poll_s` (at least 10 ms) and the time left
      (`sleep` with a fraction, else whole seconds, at least 1).
    - It exits as soon as the job has ended, checked before every write and after
      every sleep: `exit_code` or `cancelled` exists, the run directory is gone, or no
      process of the job's group is left (`kill -0` on the group, as status decides
      "running").
    - At its fire time, the job still running and no `snapshot.request` there, it
      writes `deadline` to it: a complete temporary file unique to this writer
      (shell pid and a random token), hard-linked into place, so a request that
      appears meanwhile is never replaced: the first reason is kept. Only where hard
      links fail and still no request exists does it rename the file into place (as
      put_file does). It never writes again, and keeps waiting for the job's end.

    Raises:
        InvalidArgument: when `after_s` or `poll_s` is not finite, above 0 and at
            most 1e9 seconds.
    """
    after_ms = _watchdog_ms("after_s", after_s, 1)
    poll_ms = _watchdog_ms("poll_s", poll_s, _WATCHDOG_MIN_POLL_MS)
    token = _secrets.token_hex(6)
    return (
        GROUP_SIGNAL
        + f"""
rw_dir={quote(dir)}
rw_after={after_ms}
rw_poll={poll_ms}
rw_pid=
IFS= read -r rw_pid < "$rw_dir/{PID_FILE}" || :
case $rw_pid in ''|*[!0-9]*) exit 3 ;; esac
if [ "${{#rw_pid}}" -gt 9 ] || [ "$rw_pid" -le 1 ]; then exit 3; fi
cd / || :
rw_w="$rw_dir/{WATCHDOG_PID_FILE}"
mkdir -p -- "$rw_dir/{JOBSIDE_DIR}" 2>/dev/null || :
if printf '%s\n' "$$" > "$rw_w.tmp.$$"; then mv -f -- "$rw_w.tmp.$$" "$rw_w" || :; fi
rm -f -- "$rw_w.tmp.$$" 2>/dev/null || :
rw_ms=0
rw_now() {{
  # rw_ms: the clock in ms; when `date` fails, the last reading plus the $1 ms slept.
  rw_x=$(date +%s%N 2>/dev/null) || rw_x=
  case $rw_x in
  ''|*[!0-9]*)
    rw_x=$(date +%s 2>/dev/null) || rw_x=
    case $rw_x in
    ''|*[!0-9]*) rw_ms=$((rw_ms + $1)) ;;
    *) rw_ms=$((rw_x * 1000)) ;;
    esac ;;
  *) rw_ms=${{rw_x%??????}} ;;
  esac
}}
rw_sleep() {{
  rw_f=$((1000 + $1 % 1000))
  sleep "$(($1 / 1000)).${{rw_f#1}}" 2>/dev/null || sleep $((($1 + 999) / 1000))
}}
rw_ended() {{
  [ -e "$rw_dir/{EXIT_FILE}" ] || [ -e "$rw_dir/{CANCEL_FILE}" ] || [ ! -d "$rw_dir" ] ||
    ! rw_alive "$rw_pid"
}}
rw_ask() {{
  rw_req="$rw_dir/{SNAPSHOT_REQUEST}"
  if [ -e "$rw_req" ] || [ -h "$rw_req" ]; then return 0; fi
  rw_tmp="$rw_req.rw-tmp.$$.{token}"
  if printf '%s' deadline > "$rw_tmp"; then
    if ! ln -- "$rw_tmp" "$rw_req" 2>/dev/null; then
      if [ ! -e "$rw_req" ] && [ ! -h "$rw_req" ]; then mv -f -- "$rw_tmp" "$rw_req" || :; fi
    fi
  fi
  rm -f -- "$rw_tmp" 2>/dev/null || :
}}
rw_now 0
rw_fire=$((rw_ms + rw_after))
rw_left=0
while ! rw_ended; do
  if [ -n "$rw_fire" ]; then
    rw_now "$rw_left"
    rw_left=$((rw_fire - rw_ms))
    if [ "$rw_left" -le 0 ]; then
      rw_fire=
      rw_ask
      continue
    fi
    [ "$rw_left" -le "$rw_poll" ] || rw_left=$rw_poll
  else
    rw_left=$rw_poll
  fi
  rw_sleep "$rw_left"
done
"""
    )


def launcher_script(
    dir: str,
    script: str,
    env: Mapping[str, str],
    secret_names: Sequence[str],
    watchdog: tuple[float, float] | None = None,
) -> str:
    """The launcher of a job: enters `dir` (created when missing), clears stale
    `exit_code`, `cancelling`, `cancelled`, `job.pid` and `.runwarden/watchdog.pid`,
    exports `env` (non-secret, so on its command line), then
    reads one line per name of `secret_names` from its standard input and exports
    each (values never on a command line or in a file), and starts the
    [`wrapper_script`] with `setsid` in its own session, stdin from /dev/null, stdout
    and stderr appended to `job.log`, SIGHUP ignored (like `nohup`).

    The wrapper's parent is a small background `sh` that only waits for it, so the
    job's session leader is reaped even on a host whose init does not reap orphans.
    It is exec'd, not forked: a forked subshell would keep the caller's saved
    descriptors (dash holds them at 10+), pipes the caller waits on among them. The
    launcher itself returns at once, printing the job's pid once the wrapper wrote
    `job.pid` (within 10 s, else exit 6).

    With `watchdog` = `(after_s, poll_s)`, once the job's pid is known it also starts
    the [`watchdog_script`] the same way (`setsid`, SIGHUP ignored, a waiting parent
    `sh`), in a session of its own: never a member of the job's process group, so
    status never sees it as the job and cancel never signals it. Its stdin, stdout
    and stderr are /dev/null, and the secrets are unset before it starts: they reach
    the job's environment only.

    The caller validates names and values (`schemas.check_env_name`,
    `check_secret_value`).
    """
    exports = "".join(f"{name}={quote(value)}; export {name}\n" for name, value in env.items())
    reads = "".join(
        f"IFS= read -r rw_v || {{ echo 'the secrets ended early' >&2; exit 4; }}\n"
        f'{name}=$rw_v; export {name}\n'
        for name in secret_names
    )
    start_watchdog = ""
    if watchdog is not None:
        unset = f"unset {' '.join(secret_names)}\n" if secret_names else ""
        start_watchdog = (
            unset
            + """"$rw_sh" -c 'trap "" HUP; "$1" "$2" -c "$3" </dev/null >/dev/null 2>&1 & \\
  wait $!' rw-watchdog "$rw_setsid" "$rw_sh" """
            + quote(watchdog_script(dir, *watchdog))
            + " </dev/null >/dev/null 2>&1 &\n"
        )
    return f"""rw_sh=$(command -v sh) || exit 5
rw_setsid=$(command -v setsid) || {{ echo 'setsid is not installed on the target' >&2; exit 5; }}
mkdir -p -- {quote(dir)} && cd -- {quote(dir)} || exit 3
rm -f -- {EXIT_FILE} {CANCELLING_FILE} {CANCEL_FILE} {PID_FILE} {WATCHDOG_PID_FILE} \\
  {SNAPSHOT_REQUEST} {SNAPSHOT_FILE} || exit 3
{exports}{reads}rw_v=
"$rw_sh" -c 'trap "" HUP; "$1" "$2" -c "$3" </dev/null >>{JOB_LOG} 2>&1 & wait $!' \\
  rw-reaper "$rw_setsid" "$rw_sh" {quote(wrapper_script(dir, script))} </dev/null >/dev/null 2>&1 &
rw_i=0
while [ ! -s {PID_FILE} ]; do
  rw_i=$((rw_i + 1))
  if [ "$rw_i" -gt 200 ]; then echo 'the job did not start within 10 s' >&2; exit 6; fi
  sleep 0.05 2>/dev/null || sleep 1
done
{start_watchdog}IFS= read -r rw_pid < {PID_FILE} && printf '%s\\n' "$rw_pid"
"""


FOLLOW_CHUNK_BYTES: Final = 256 * 1024
"""Most new bytes of one file a follow tick reads for one run; the rest comes next
tick."""


def follow_script(
    entries: Sequence[tuple[JobId, int, int]], token: str, chunk: int = FOLLOW_CHUNK_BYTES
) -> str:
    """One script for a whole target's follow tick: for each `(job, log_offset,
    metrics_offset)` it prints, each record introduced by `token` (random, so no
    file content can forge one):

    - `S <i> <status>`: the job's status, as [`status_script`] decides it;
    - `Q <i> <reason>` when `snapshot.request` holds a reason (first line, at most
      32 bytes), `Q <i>` with nothing when there is no request;
    - `L <i> <n>` then the bytes of `job.log` from its offset, and `M <i> <n>` then
      those of `metrics.jsonl`, at most `chunk` bytes each, only for files that grew
      past their offset (`n` is the file's size).

    Sizes come from one `find -printf` (GNU) for the whole batch, else one `wc -c`
    per file; statuses and requests are read with shell builtins: a tick over idle
    runs starts one process, whatever their number.
    """
    if not token.isalnum():
        raise InvalidArgument("the follow token is alphanumeric")
    rows = []
    for index, (job, log_offset, metrics_offset) in enumerate(entries):
        if log_offset < 0 or metrics_offset < 0:
            raise InvalidArgument("offsets are non-negative")
        rows.append(
            f"rw_one {index} {quote(job.dir)} {_pid(job)} {log_offset} {metrics_offset}"
        )
    body = "\n".join(rows)
    return (
        GROUP_SIGNAL
        + _status_function()
        + f"""
rw_t={token}
rw_chunk={chunk}
set --
rw_flags=
for rw_d in {" ".join(quote(job.dir) for job, _, _ in entries)}; do
  for rw_f in "$rw_d/{JOB_LOG}" "$rw_d/{METRICS_FILE}"; do
    if [ -f "$rw_f" ]; then set -- "$@" "$rw_f"; rw_flags="${{rw_flags}}1"
    else rw_flags="${{rw_flags}}0"; fi
  done
done
rw_count=$#
rw_sizes=
if [ "$rw_count" -gt 0 ]; then
  rw_sizes=$(find "$@" -maxdepth 0 -printf '%s ' 2>/dev/null) || rw_sizes=
  set -- $rw_sizes
  # A file gone meanwhile, or no GNU find: sizes one by one instead.
  [ "$#" -eq "$rw_count" ] || rw_sizes=
fi
rw_read() {{
  # $1 tag, $2 index, $3 file, $4 offset. A file is read only when it was listed
  # above ($rw_flags, one character a file, in order), so sizes never shift.
  rw_listed=${{rw_flags%"${{rw_flags#?}}"}}; rw_flags=${{rw_flags#?}}
  [ "$rw_listed" = 1 ] || return 0
  if [ -n "$rw_sizes" ]; then
    rw_n=${{rw_sizes%% *}}; rw_sizes=${{rw_sizes#* }}
  else
    rw_n=$(wc -c < "$3" 2>/dev/null) || return 0
  fi
  [ "${{rw_n:-0}}" -gt "$4" ] 2>/dev/null || return 0
  printf '%s %s %s %s\\n' "$rw_t" "$1" "$2" "$rw_n"
  tail -c +$(($4 + 1)) -- "$3" | head -c "$rw_chunk"
}}
rw_one() {{
  printf '%s S %s ' "$rw_t" "$1"
  rw_status "$2" "$3"
  rw_q=
  if [ -f "$2/{SNAPSHOT_REQUEST}" ]; then
    IFS= read -r rw_q < "$2/{SNAPSHOT_REQUEST}" || :
    [ -n "$rw_q" ] || rw_q=requested
  fi
  printf '%s Q %s %.32s\\n' "$rw_t" "$1" "$rw_q"
  rw_read L "$1" "$2/{JOB_LOG}" "$4"
  rw_read M "$1" "$2/{METRICS_FILE}" "$5"
}}
{body}
printf '%s E\\n' "$rw_t"
"""
    )


@dataclass(frozen=True)
class FollowUpdate:
    """What one follow tick found for one run."""

    status: JobStatus | ProtocolError
    request: str | None
    """The reason in `snapshot.request`, or None when there is none."""
    log: bytes = b""
    log_size: int = 0
    metrics: bytes = b""
    metrics_size: int = 0


def parse_follow(output: bytes, token: str, count: int) -> list[FollowUpdate]:
    """The updates of a [`follow_script`] run over `count` runs, in order.

    Raises:
        ProtocolError: when the output is cut short (no end record) or malformed.
    """
    marker = token.encode()
    parts = output.split(marker)
    if parts[0].strip():
        raise ProtocolError("follow output before its first record")
    status: dict[int, JobStatus | ProtocolError] = {}
    request: dict[int, str | None] = {}
    files: dict[tuple[str, int], tuple[bytes, int]] = {}
    ended = False
    for part in parts[1:]:
        head, _, payload = part.partition(b"\n")
        words = head.decode("utf-8", "replace").split(" ")
        try:
            kind = words[1]
            if kind == "E":
                ended = True
                continue
            index = int(words[2])
            if not 0 <= index < count:
                raise ProtocolError(f"follow record for run {index} of {count}")
            if kind == "S":
                try:
                    status[index] = parse_status(" ".join(words[3:]))
                except ProtocolError as error:
                    status[index] = error
            elif kind == "Q":
                reason = " ".join(words[3:]).strip()
                request[index] = reason or None
            elif kind in ("L", "M"):
                files[(kind, index)] = (payload, int(words[3]))
            else:
                raise ProtocolError(f"follow record {kind!r}")
        except (IndexError, ValueError) as error:
            raise ProtocolError(f"follow record {head[:80]!r}") from error
    if not ended or len(status) != count:
        raise ProtocolError("the follow output was cut short")
    updates = []
    for index in range(count):
        log, log_size = files.get(("L", index), (b"", 0))
        metrics, metrics_size = files.get(("M", index), (b"", 0))
        updates.append(
            FollowUpdate(status[index], request.get(index), log, log_size, metrics, metrics_size)
        )
    return updates
