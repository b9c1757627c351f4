# shellcheck shell=sh
# Arguments: CGROUP ENTRY, a finished job's cgroup and its mark's environment entry
# (RUNWARDEN_RUN_ID=<mark>), either empty (none). Ends what is left of the job at once
# (SIGTERM, SIGKILL or `cgroup.kill` 0.1 s later: its wrapper, or the cancel, already
# gave every process it could find SIGTERM and a grace, so what is left hid from them
# or outlived a cancel cut short) and removes the cgroup; exit 5 when something
# survives 5 s. Needs group.sh, cgroup.sh and sweep.sh (scripts.status.release_script).
if [ -n "$1" ] && ! rw_cg_end "$1" 0 50; then
  printf 'processes of the cgroup %s survived SIGKILL\n' "$1" >&2
  exit 5
fi
if [ -n "$2" ] && ! rw_sweep "$2" 1 50; then
  # rw_left is set by rw_marked (sweep.sh).
  # shellcheck disable=SC2154
  printf 'processes carrying %s survived SIGKILL:%s\n' "$2" "$rw_left" >&2
  exit 5
fi
