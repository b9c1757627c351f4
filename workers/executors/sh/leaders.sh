# shellcheck shell=sh
# Arguments: PGID START for each job. Run as an SSH target's login user (the control
# user of a target whose jobs run as another user), never as the jobs' user, who can
# then neither pause it nor write into its output: one line per job, `1` when the
# job's leader, process PGID, runs (not a zombie) and started at START (clock ticks
# since boot, field 22 of /proc/PGID/stat), else `0` (gone, ended, another process,
# no /proc, or /proc hides it: the job user's status script then decides). Builtins
# only: no process is started.
rw_leader() {
  rw_l=; rw_s=$2
  { IFS= read -r rw_l < "/proc/$1/stat"; } 2>/dev/null || return 1
  rw_l=${rw_l##*) }
  set -f
  # Split on purpose: the fields of /proc/PID/stat after the command name.
  # shellcheck disable=SC2086
  set -- $rw_l
  set +f
  [ "$#" -ge 20 ] && [ "$1" != Z ] && [ "${20}" = "$rw_s" ]
}
while [ "$#" -ge 2 ]; do
  if rw_leader "$1" "$2"; then echo 1; else echo 0; fi
  shift 2
done
