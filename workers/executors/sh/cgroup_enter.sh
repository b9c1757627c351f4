# shellcheck shell=sh
# Arguments: PROCS CMD...: moves this shell into the cgroup whose `cgroup.procs` is
# PROCS, then execs CMD (the change to the job's user, then the launcher). Run as
# root by runas.RunAsTransport.entering, before the change of user: a user may not
# move a process between cgroups, so everything the launcher starts is born in the
# run's cgroup and none can leave it. Exit 7 when it cannot enter (the launcher's
# code for a cgroup that could not be made or entered).
if ! { printf '%s\n' "$$" > "$1"; } 2>/dev/null; then
  echo "cannot enter the run's cgroup ${1%/cgroup.procs}" >&2
  exit 7
fi
shift
exec "$@"
