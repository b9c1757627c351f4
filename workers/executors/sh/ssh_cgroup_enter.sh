# shellcheck shell=sh
# Arguments: CGROUP USER CMD...: run as a root SSH login before its change to USER (a
# target whose jobs run as another user, ssh.SshTransport.entering): makes the run's
# cgroup CGROUP, gives USER its `cgroup.procs` and `cgroup.kill` (the user's launcher
# re-enters the cgroup it is in, its cancel and release end it; the user may still
# move no process in or out, which takes write access to the hierarchy's root), moves
# this shell into it, then execs CMD (sudo to USER, then the launcher): everything
# of the job is born in the cgroup. Exit 7 when it cannot (the launcher's code for a
# cgroup that could not be made or entered).
rw_cg=$1 rw_u=$2
shift 2
if ! { mkdir -p -- "$rw_cg" && [ -f "$rw_cg/cgroup.events" ] &&
  chown -- "$rw_u" "$rw_cg/cgroup.procs" "$rw_cg/cgroup.kill" &&
  printf '%s\n' "$$" > "$rw_cg/cgroup.procs"; } 2>/dev/null; then
  echo "cannot enter the run's cgroup $rw_cg" >&2
  exit 7
fi
exec "$@"
