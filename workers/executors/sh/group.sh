# shellcheck shell=sh
# Process groups:
# - `rw_signal PGID SIG` signals a whole process group under dash (`kill -s SIG --
#   -PID`) and busybox (`kill -s SIG -PID`); `rw_alive PGID` tells whether any process
#   of the group exists (a zombie counts: whoever started the job reaps it), by /proc
#   too when `rw_others` is set (a script of another user than the job's).
# - `rw_start PID` sets `rw_st` to the start time of process PID (field 22 of
#   /proc/PID/stat, clock ticks since boot), empty when unknown (no such process, no
#   /proc). Read with builtins only: no process is started.
# - `rw_ours PGID START` tells whether the group PGID is alive and is the job's: when
#   START is known and a process PGID exists, it must have started at START. A pid is
#   never reused while a process group of that id exists, so a leader that started at
#   another time means the job's group is gone and the pid went to another process.
# - `rw_nap` sleeps 0.1 s (1 s where `sleep` takes no fraction).
# - `rw_glance CMD...` runs CMD (a test) up to 6 times 0.02 s apart, for at most 0.1 s
#   by the clock where /proc/uptime tells it (one nap a loaded machine stretches ends
#   it): 0 as soon as CMD fails (what it waits for came), else 1. Most processes end
#   within milliseconds of their signal: a wait of 0.1 s turns looks this way first.
rw_signal() { kill -s "$2" -- "-$1" 2>/dev/null || kill -s "$2" "-$1" 2>/dev/null; }
rw_alive() {
  rw_signal "$1" 0 && return 0
  [ -n "${rw_others-}" ] || return 1
  # Run as another user than the job's (`rw_others`: an SSH target's login user, its
  # jobs' user another), for whom `kill` fails alike for a group it may not signal:
  # /proc says instead, with builtins (the leader, else any member of the group).
  [ -e "/proc/$1" ] && return 0
  rw_a1=$1
  for rw_f in /proc/[0-9]*/stat; do
    rw_l=; { IFS= read -r rw_l < "$rw_f"; } 2>/dev/null || continue
    rw_l=${rw_l##*) }
    set -f
    # Split on purpose: the fields of /proc/PID/stat after the command name.
    # shellcheck disable=SC2086
    set -- $rw_l
    set +f
    [ "$#" -ge 3 ] && [ "$3" = "$rw_a1" ] && return 0
  done
  return 1
}
rw_nap() { sleep 0.1 2>/dev/null || sleep 1; }
rw_cs() {
  # Centiseconds since boot in rw_c (empty without /proc/uptime), read with a builtin.
  rw_c=; { read -r rw_c _ < /proc/uptime; } 2>/dev/null || :
  case $rw_c in *[0-9].[0-9][0-9]) rw_c=${rw_c%.*}${rw_c#*.} ;; *) rw_c= ;; esac
  rw_c=${rw_c#"${rw_c%%[!0]*}"}
  case $rw_c in ''|*[!0-9]*) rw_c= ;; esac
}
rw_glance() {
  rw_cs; rw_g0=$rw_c; rw_g=0
  while "$@"; do
    rw_g=$((rw_g + 1))
    [ "$rw_g" -gt 5 ] && return 1
    if [ -n "$rw_g0" ]; then
      rw_cs; [ -n "$rw_c" ] && [ $((rw_c - rw_g0)) -ge 10 ] && return 1
    fi
    sleep 0.02 2>/dev/null || return 1
  done
  return 0
}
rw_start() {
  rw_st=; rw_l=
  { IFS= read -r rw_l < "/proc/$1/stat"; } 2>/dev/null || return 0
  rw_l=${rw_l##*) }
  set -f
  # Split on purpose: the fields of /proc/PID/stat after the command name.
  # shellcheck disable=SC2086
  set -- $rw_l
  set +f
  if [ "$#" -ge 20 ]; then shift 19; rw_st=$1; fi
  case $rw_st in *[!0-9]*) rw_st= ;; esac
}
rw_ours() {
  rw_alive "$1" || return 1
  [ -n "$2" ] || return 0
  rw_start "$1"
  [ -z "$rw_st" ] || [ "$rw_st" = "$2" ]
}
