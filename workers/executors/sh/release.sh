# shellcheck shell=sh
# Argument: CGROUP, a finished job's cgroup. Ends what is left in it at once (SIGTERM,
# `cgroup.kill` after 0.1 s: the job's wrapper already gave every process it could
# find SIGTERM and 10 s, so what is left hid from it) and removes it; exit 5 when
# something survives 5 s. Needs group.sh and cgroup.sh (scripts.status.release_script).
if ! rw_cg_end "$1" 0 50; then
  printf 'processes of the cgroup %s survived SIGKILL\n' "$1" >&2
  exit 5
fi
