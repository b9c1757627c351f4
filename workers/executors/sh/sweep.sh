# shellcheck shell=sh
# The processes that carry a run's mark, an exact entry RUNWARDEN_RUN_ID=<id> of their
# environment (/proc/<pid>/environ, readable for the target user's own processes):
# `rw_marked ENTRY` sets `rw_left` to their pids (never this script, pid 0 or 1);
# `rw_sweep ENTRY KILL_AT GIVE_UP` sends them TERM, KILL after KILL_AT turns of 0.1 s,
# and returns 1 when some are still there after GIVE_UP turns. A zombie's environment
# reads empty: it counts as gone. Needs group.sh (`rw_nap`).
rw_marked() {
  rw_found=$(grep -lsxzF -- "$1" /proc/[0-9]*/environ 2>/dev/null)
  rw_left=
  for rw_f in $rw_found; do
    rw_p=${rw_f#/proc/}; rw_p=${rw_p%/environ}
    case $rw_p in ''|*[!0-9]*) continue ;; esac
    [ "$rw_p" = "$$" ] || [ "$rw_p" -le 1 ] || rw_left="$rw_left $rw_p"
  done
}
rw_sweep() {
  rw_i=0
  while rw_marked "$1"; [ -n "$rw_left" ]; do
    # $rw_left is a list of pids, split on purpose.
    # shellcheck disable=SC2086
    if [ "$rw_i" = 0 ]; then kill -s TERM $rw_left 2>/dev/null || :; fi
    # shellcheck disable=SC2086
    if [ "$rw_i" = "$2" ]; then kill -s KILL $rw_left 2>/dev/null || :; fi
    rw_i=$((rw_i + 1))
    [ "$rw_i" -gt "$3" ] && return 1
    rw_nap
  done
  return 0
}
