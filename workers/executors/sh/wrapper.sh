# shellcheck shell=sh
# Arguments: SH MV DIR ENTRY ALL KILL GIVE_UP POLL JOB MODE ARG. The job wrapper
# (scripts.launch.wrapper_script), run as `sh -c WRAPPER rw-job ARG...` by the job's
# session leader, its standard input the launcher's FIFO. Needs scan.sh and wait_job.sh.
# - SH, MV: the absolute paths of `sh` and `mv` (the job's own PATH never changes
#   what the wrapper runs); DIR: the run directory;
# - ENTRY: `RUNWARDEN_RUN_ID=<mark>`, the run's mark (empty: none);
# - ALL: `1` to wait for the run's processes left (wait_for_all), empty to end them;
#   KILL, GIVE_UP: the looks (two a second) after which those left get SIGKILL, and
#   are given up; POLL: the seconds between two looks of wait_for_all;
# - JOB MODE ARG: the job's shell (job_shell.sh), run as `SH -c JOB SH MODE ARG`.
# Before the job's shell starts, no variable is set but rw_sh, rw_mv, rw_entry, rw_sig
# and rw_execd: the job's environment may hold any name, which its shell would then
# inherit changed.
cd -- "$3" || exit 126
rw_sh=$1 rw_mv=$2 rw_entry=$4 rw_sig='' rw_execd=''
if [ "${10}" = command ]; then rw_execd=1; fi
# rw_shell, rw_others and rw_caught run from the traps only.
# shellcheck disable=SC2317
rw_shell() {
  # Whether process $1 still runs the job's shell: not ended (a zombie has ended),
  # not a command it execed. Without /proc it cannot be told: yes.
  kill -0 "$1" 2>/dev/null || return 1
  [ -r "/proc/$1/stat" ] || return 0
  rw_z=; { IFS= read -r rw_z < "/proc/$1/stat"; } 2>/dev/null || return 1
  case ${rw_z##*) } in Z*) return 1 ;; esac
  rw_x=$(readlink "/proc/$1/exe" 2>/dev/null) || return 1
  [ -n "$rw_real" ] || return 0
  [ "$rw_x" = "$rw_real" ]
}
# shellcheck disable=SC2317
rw_others() {
  # Whether the group holds a live process other than this wrapper, its children
  # and theirs (the job's shell, the helpers of this look). One awk over every
  # stat, not rw_scan's loop: many runs may be cancelled at once.
  if [ -r "/proc/$$/stat" ]; then
    # The awk program's `$1` and `$0` are awk's fields.
    # shellcheck disable=SC2016
    rw_left=$(cat /proc/[0-9]*/stat 2>/dev/null | awk -v w="$$" '
      { p = $1; l = $0; if (!sub(/.*\) /, "", l)) next; split(l, f, " ")
        st[p] = f[1]; pp[p] = f[2]; pg[p] = f[3] }
      END { for (p in pg) if (pg[p] == w && p != w && st[p] != "Z" &&
        pp[p] != w && pp[pp[p]] != w) { print p; exit } }')
  else
    rw_e=$rw_entry; rw_entry=; rw_scan; rw_entry=$rw_e
  fi
  [ -n "$rw_left" ]
}
# shellcheck disable=SC2317
rw_caught() {
  rw_sg=$1
  if [ -e cancelling ] || [ -h cancelling ]; then
    # Runwarden's cancel: the wrapper ends by the signal, so no exit code is written
    # and status says cancelled, not `exited 143`. Once more to the whole group when,
    # a second later, the job's own shell or another member still runs: a process a
    # shell with a trap forks loses a signal that comes between its fork and exec (a
    # background one outlives a shell that ended at once). A job that is one command
    # (execed) gets one; a group that emptied is kept no longer (a look every 0.2 s,
    # at most six looks at every process: many runs may be cancelled at once).
    trap '' "$rw_sg"; rw_w=0
    if [ -z "$rw_execd" ]; then
      rw_real=$(readlink -f "$rw_sh" 2>/dev/null) || rw_real=
      while [ "$rw_w" -lt 10 ] && rw_shell "$rw_job"; do
        sleep 0.1 2>/dev/null || sleep 1; rw_w=$((rw_w + 1))
      done
      if rw_shell "$rw_job"; then
        kill -s "$rw_sg" 0
      elif rw_others; then
        rw_more=1
        while [ "$rw_w" -lt 10 ]; do
          sleep 0.2 2>/dev/null || sleep 1
          rw_w=$((rw_w + 2))
          rw_others || { rw_more=; break; }
        done
        if [ -n "$rw_more" ]; then kill -s "$rw_sg" 0; fi
      fi
    fi
    trap - "$rw_sg"; kill -s "$rw_sg" $$
  fi
  # shellcheck disable=SC2034  # read by rw_wait_job (wait_job.sh)
  rw_sig=1
}
# The preemption signals (scripts.launch.PREEMPTION_SIGNALS): a signal caught while
# the wrapper waits ends the `wait`, not the job, so it waits again while the job runs.
trap 'rw_caught TERM' TERM
trap 'rw_caught USR1' USR1
trap 'rw_caught USR2' USR2
trap 'rw_caught XCPU' XCPU
# The wrapper's own error output goes nowhere (a shell reports a child killed by a
# signal, which is not the job's output); the job's shell keeps it (job.log).
exec 5<&0 </dev/null 3>&2 2>/dev/null
"$rw_sh" -c "$9" "$rw_sh" "${10}" "${11}" <&5 5<&- 2>&3 3>&- &
rw_job=$!
exec 5<&-
# Until the job's shell has exec'd, at most 2 s: a signal that reaches the forked copy
# of this shell before its exec runs this shell's handler, which only marks it, and is
# lost with the exec; a cancel's SIGTERM to a one-command job (which gets no second
# one) would then wait for SIGKILL. The copy still catches SIGTERM (this shell's
# trap, bit 15 of SigCgt in /proc/PID/status); the job's shell, freshly exec'd, does
# not before its `go`. job.pid, and with it the launcher's `go` and its answer, come
# after. Without /proc it cannot be told. Builtins only.
rw_i=0
while [ "$rw_i" -lt 200 ]; do
  rw_c=
  { while IFS= read -r rw_l; do
      case $rw_l in SigCgt:*) rw_c=${rw_l#SigCgt:}; break ;; esac
    done < "/proc/$rw_job/status"; } 2>/dev/null || :
  rw_c=${rw_c#"${rw_c%%[!	 ]*}"}
  rw_c=${rw_c#"${rw_c%????????}"}
  case $rw_c in ''|*[!0-9a-fA-F]*) break ;; esac
  [ $((0x$rw_c & 16384)) -ne 0 ] || break
  rw_i=$((rw_i + 1))
  sleep 0.01 2>/dev/null || sleep 1
done
rw_c='' rw_l=''
rw_all=$5 rw_kill=$6 rw_give_up=$7 rw_poll=$8
# The wrapper's helpers never count as the run's.
unset RUNWARDEN_RUN_ID
# The run's cgroup, when runwarden gave it one (the launcher entered it before this
# wrapper started: launcher.sh): its `cgroup.procs`, in which rw_scan also finds
# what left the group and cleared its environment. Builtins only.
rw_cgp='' rw_l=''
{ while IFS= read -r rw_l; do case $rw_l in 0::/*) break ;; esac; rw_l=; done \
  < "/proc/$$/cgroup"; } 2>/dev/null || rw_l=
rw_l=${rw_l#0::}
case $rw_l in
*/runwarden/*)
  # Each line of mountinfo: ID PARENT DEV ROOT MOUNT OPTIONS... - TYPE SOURCE ...
  { while read -r _ _ _ rw_r rw_m rw_o; do
      case " $rw_o " in *" - cgroup2 "*) ;; *) continue ;; esac
      if [ "$rw_r" = / ] && [ -f "$rw_m$rw_l/cgroup.procs" ]; then
        # shellcheck disable=SC2034  # read by rw_scan (scan.sh)
        rw_cgp=$rw_m$rw_l/cgroup.procs
        break
      fi
    done < /proc/self/mountinfo; } 2>/dev/null || :
  ;;
esac
# Written once the job's shell started: the launcher reads the leader's start time
# before it says `go`, so while the leader surely lives.
printf '%s\n' "$$" > "job.pid.tmp.$$" && "$rw_mv" -f -- "job.pid.tmp.$$" job.pid
rw_code=  # the job's exit code, set by rw_wait_job (wait_job.sh)
rw_wait_job "$rw_job"
rw_end=
if [ "$rw_code" -gt 128 ]; then
  rw_name=$(kill -l "$rw_code" 2>/dev/null) || rw_name=
  case $rw_name in ''|*[!A-Z0-9]*) ;; *) rw_end="signal ${rw_name#SIG}
" ;; esac
fi
rw_seen=
# rw_left is set by rw_scan, rw_n by rw_count (scan.sh).
# shellcheck disable=SC2154
if [ -n "$rw_all" ]; then
  # wait_for_all: the run lasts until no process of it is left.
  while rw_scan && [ -n "$rw_left" ]; do
    for rw_p in $rw_left; do
      case " $rw_seen " in *" $rw_p "*) ;; *) rw_seen="$rw_seen $rw_p" ;; esac
    done
    sleep "$rw_poll"
  done
  rw_count "$rw_seen"
  [ "$rw_n" = 0 ] || rw_end="${rw_end}waited $rw_n
"
else
  # SIGTERM to each process left (also to those that appear meanwhile), SIGKILL after
  # KILL looks, given up after GIVE_UP. Two looks a second: each reads every
  # process's stat and environment, and many runs may end at once on one machine.
  rw_i=0
  while rw_scan && [ -n "$rw_left" ]; do
    for rw_p in $rw_left; do
      case " $rw_seen " in
      *" $rw_p "*) ;;
      *) rw_seen="$rw_seen $rw_p"; kill -s TERM "$rw_p" 2>/dev/null || : ;;
      esac
    done
    # Split on purpose: one pid a word.
    # shellcheck disable=SC2086
    [ "$rw_i" -lt "$rw_kill" ] || kill -s KILL $rw_left 2>/dev/null || :
    rw_i=$((rw_i + 1))
    [ "$rw_i" -le "$rw_give_up" ] || break
    sleep 0.5 2>/dev/null || sleep 1
  done
  rw_count "$rw_seen"
  [ "$rw_n" = 0 ] || rw_end="${rw_end}leftovers $rw_n
"
  if [ "$rw_i" -gt "$rw_give_up" ]; then
    rw_count "$rw_left"
    rw_end="${rw_end}survived $rw_n
"
  fi
fi
# `ended`, then the exit code, last: each through a temporary name and a rename.
if [ -n "$rw_end" ]; then
  printf '%s' "$rw_end" > ".runwarden/ended.tmp.$$" && "$rw_mv" -f -- ".runwarden/ended.tmp.$$" .runwarden/ended
fi
printf '%s\n' "$rw_code" > "exit_code.tmp.$$" && "$rw_mv" -f -- "exit_code.tmp.$$" exit_code
exit "$rw_code"
