# shellcheck shell=sh
# Arguments: CGROUP USER CMD...: run as an SSH login before its change to USER (a
# target whose jobs run as another user, ssh.SshTransport.entering): makes the run's
# cgroup CGROUP, gives USER its `cgroup.procs` and `cgroup.kill` (the user's launcher
# re-enters the cgroup it is in, its cancel and release end it), moves this shell into
# it, then execs CMD (sudo to USER, then the launcher): everything of the job is born
# in the cgroup. A root login `chown`s the two files to USER; a login that is not root
# (its own cgroup delegated to it, a member of USER's primary group: cgroup_base.sh
# checked both) cannot, so it `chgrp`s them to that group and adds the group's write
# bit (the login stays their owner, nobody else may write them). Either way the user
# may move no process in or out: that takes write access to the `cgroup.procs` of the
# cgroups' common ancestor, `<base>/runwarden` or above, which is root's or the
# login's alone. Exit 7 when it cannot (the launcher's code for a cgroup that could
# not be made or entered).
rw_cg=$1 rw_u=$2
shift 2
rw_give() {
  if [ "$(id -u)" = 0 ]; then
    chown -- "$rw_u" "$rw_cg/cgroup.procs" "$rw_cg/cgroup.kill"
  else
    rw_g=$(id -g -- "$rw_u") &&
      chgrp -- "$rw_g" "$rw_cg/cgroup.procs" "$rw_cg/cgroup.kill" &&
      chmod g+w -- "$rw_cg/cgroup.procs" "$rw_cg/cgroup.kill"
  fi
}
if ! { mkdir -p -- "$rw_cg" && [ -f "$rw_cg/cgroup.events" ] && rw_give &&
  printf '%s\n' "$$" > "$rw_cg/cgroup.procs"; } 2>/dev/null; then
  echo "cannot enter the run's cgroup $rw_cg" >&2
  exit 7
fi
exec "$@"
