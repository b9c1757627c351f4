# shellcheck shell=sh
# Argument: the entry RUNWARDEN_RUN_ID=<mark>. Prints `PID START` of the oldest
# process-group leader (its pid is its group's) whose environment holds it, its start
# time in clock ticks since boot (field 22 of /proc/PID/stat); nothing when there is
# none (marked.marked_job_script). Needs group.sh and sweep.sh. Read-only.
rw_marked "$1"
rw_best=; rw_best_st=
# rw_left is set by rw_marked (sweep.sh): a list of pids, split on purpose.
# shellcheck disable=SC2086,SC2154
for rw_p in $rw_left; do
  rw_l=; { IFS= read -r rw_l < "/proc/$rw_p/stat"; } 2>/dev/null || continue
  rw_l=${rw_l##*) }
  set -f
  # The fields of /proc/PID/stat after the command name, split on purpose.
  # shellcheck disable=SC2086
  set -- $rw_l
  set +f
  if [ "$#" -lt 20 ] || [ "$3" != "$rw_p" ]; then continue; fi
  rw_st=${20}
  case $rw_st in ''|*[!0-9]*) continue ;; esac
  if [ -z "$rw_best" ] || [ "$rw_st" -lt "$rw_best_st" ]; then rw_best=$rw_p; rw_best_st=$rw_st; fi
done
[ -z "$rw_best" ] || printf '%s %s\n' "$rw_best" "$rw_best_st"
