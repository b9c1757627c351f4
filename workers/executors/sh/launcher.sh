# shellcheck shell=sh
# Arguments: DIR TOKEN WRAPPER CGROUP (empty: none), then five sections, each ended
# by a word `--` (no
# other word of a section is `--`: scripts.launch.launcher_script checks):
#   WATCHDOG ARG... --   the on-target watchdog (watchdog.sh) and its arguments ('': none)
#   WATCHER ARG... --    the preemption-notice watcher and its arguments ('': none)
#   NAME=VALUE... --     the job's variables
#   NAME... --           the names of the job's secrets, whose values are the lines of
#                        the standard input, in order
#   ARG...               the arguments of WRAPPER (wrapper.sh) after its SH and MV
# The launcher of a job (scripts.launch.launcher_script); TOKEN names its FIFO when
# the run directory cannot hold it. Needs group.sh (rw_start). Exit 3: the run
# directory cannot be made or cleared; 4: the secrets ended early; 5: no sh, setsid or
# mv, or no FIFO; 6: the job did not start (see below); 7: the cgroup CGROUP could not
# be made or entered.
rw_more() { case $1 in --) return 1 ;; esac; }
rw_companion() {
  # rw_companion NAME TEXT ARG... -- ...: starts TEXT (unless empty) as
  # `sh -c TEXT NAME ARG... PID START` in a session of its own (`setsid`: never a
  # member of the job's process group, so status never sees it as the job and cancel
  # never signals it), SIGHUP ignored, stdio on /dev/null, with a waiting parent `sh`
  # that reaps it on a host whose init does not reap orphans. It never has the job's
  # variables or secrets.
  rw_name=$1
  shift
  [ -n "$1" ] || return 0
  rw_k=$#
  for rw_a in "$@"; do
    rw_more "$rw_a" || break
    set -- "$@" "$rw_a"
  done
  shift "$rw_k"
  # The parent's own arguments, expanded by it; rw_st is set by rw_start (group.sh).
  # shellcheck disable=SC2016,SC2154
  "$rw_sh" -c 'trap "" HUP; rw_s=$1 rw_h=$2 rw_n=$3 rw_t=$4; shift 4
  "$rw_s" "$rw_h" -c "$rw_t" "$rw_n" "$@" </dev/null >/dev/null 2>&1 & wait $!' \
    "$rw_name-parent" "$rw_setsid" "$rw_sh" "$rw_name" "$@" "$rw_pid" "$rw_st" \
    </dev/null >/dev/null 2>&1 &
}
rw_spawn() {
  # rw_spawn WATCHDOG... -- WATCHER... -- NAME=VALUE... -- NAME... -- ARG...: sets the
  # job's variables and secrets, starts the wrapper and prints its pid. Run in a
  # subshell of its own.
  while rw_more "$1"; do shift; done; shift
  while rw_more "$1"; do shift; done; shift
  set -- "$@" -- "$rw_go" "$rw_setsid" "$rw_sh" -c "$rw_wrapper" rw-job "$rw_sh" "$rw_mv"
  # From here on no variable of the launcher is read or set: the job's variables may
  # have any name, rw_sh too. Only positional parameters hold the launcher's words.
  # Each word is NAME=VALUE.
  # shellcheck disable=SC2163
  while rw_more "$1"; do export "$1"; shift; done; shift
  while rw_more "$1"; do
    # Straight into its name: a secret is never on a command line or in a file.
    IFS= read -r "$1" || { echo 'the secrets ended early' >&2; exit 4; }
    # shellcheck disable=SC2163  # the variable named by $1
    export "$1"
    shift
  done
  shift
  # The wrapper's arguments go last: GO SETSID SH -c WRAPPER rw-job SH MV ARG...
  while rw_more "$1"; do set -- "$@" "$1"; shift; done; shift
  # The wrapper's parent is a small sh that only waits for it, so the job's session
  # leader is reaped even on a host whose init does not reap orphans. It is exec'd,
  # not forked: a forked subshell would keep the caller's saved descriptors (dash
  # holds them at 10+), pipes the caller waits on among them. It tells the wrapper's
  # pid, $!: never read from job.pid, which the job can rewrite.
  # shellcheck disable=SC2016
  "$3" -c 'trap "" HUP; shift; "$@" <&5 5<&- >>job.log 2>&1 & printf "%s\n" "$!"
exec >/dev/null 2>&1 5<&-; wait $!' rw-job-parent "$@" </dev/null 5<"$1" 4>&- 2>/dev/null &
}
rw_sh=$(command -v sh) || exit 5
rw_setsid=$(command -v setsid) || { echo 'setsid is not installed on the target' >&2; exit 5; }
rw_mv=$(command -v mv) || exit 5
rw_dir=$1 rw_token=$2 rw_wrapper=$3 rw_cg=$4
shift 4
if [ -n "$rw_cg" ]; then
  # Into the run's cgroup before anything of the job starts: every process it makes
  # is born there, and no session or environment of its own takes it out.
  # (`cgroup.events` tells a cgroup from a plain directory.)
  { mkdir -p -- "$rw_cg" && [ -f "$rw_cg/cgroup.events" ] &&
    printf '%s\n' "$$" > "$rw_cg/cgroup.procs"; } 2>/dev/null ||
    { echo "cannot enter the run's cgroup $rw_cg" >&2; exit 7; }
fi
# A new job never inherits an end, a cancel, a snapshot or a notice.
mkdir -p -- "$rw_dir" && cd -- "$rw_dir" || exit 3
rm -f -- exit_code cancelling cancelled job.pid .runwarden/watchdog.pid \
  snapshot.request snapshot.json notice.json .runwarden/notice.state .runwarden/notice.pid \
  .runwarden/ended || exit 3
# The job's shell waits for the `go` written to this FIFO once the wrapper wrote its
# pid and the launcher read the leader's start time.
rw_go=.runwarden/go.$$
if ! { mkdir -p .runwarden && rm -f -- "$rw_go" && mkfifo -m 600 "$rw_go"; } 2>/dev/null; then
  rw_go="${TMPDIR:-/tmp}/rw-go.$$.$rw_token"
  rm -f -- "$rw_go"
  mkfifo -m 600 "$rw_go" || { echo 'cannot make the FIFO that starts the job' >&2; exit 5; }
fi
exec 4<>"$rw_go" || exit 5
# The job's variables and secrets are set in a subshell that starts the job and
# nothing else: they reach the job's processes only, never the launcher's own state.
rw_pid=$(rw_spawn "$@") || exit 4
rm -f -- "$rw_go"
case $rw_pid in ''|*[!0-9]*) echo 'the job did not start' >&2; exit 6 ;; esac
# Until the wrapper wrote job.pid (or the job already removed its run directory);
# exit 6 when it ended before (it could not enter the run directory) or did not write
# it within 10 s.
rw_i=0
while [ ! -s job.pid ] && [ -d "$rw_dir" ]; do
  if ! kill -0 "$rw_pid" 2>/dev/null; then echo 'the job ended before it started' >&2; exit 6; fi
  rw_i=$((rw_i + 1))
  if [ "$rw_i" -gt 200 ]; then echo 'the job did not start within 10 s' >&2; exit 6; fi
  sleep 0.05 2>/dev/null || sleep 1
done
rw_start "$rw_pid"
printf 'go\n' >&4
exec 4>&-
rw_companion rw-watchdog "$@"
while rw_more "$1"; do shift; done; shift
rw_companion rw-notice "$@"
printf '%s %s\n' "$rw_pid" "$rw_st"
