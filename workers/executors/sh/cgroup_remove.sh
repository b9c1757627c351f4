# shellcheck shell=sh
# Arguments: CGROUP AGE_MIN. Run as an SSH target's login user after a run's release
# or cancel: removes the run's emptied cgroup CGROUP (the jobs' user of a run-as
# target ended it but may not remove it), then every other run cgroup beside it
# (`<base>/runwarden/<32 hex>`) that is empty and older than AGE_MIN minutes: what a
# run's end cut short left there (the worker's `reconcile` removes those on its own
# machine only). A cgroup that holds a process stays (rmdir refuses it); a launcher
# enters its new cgroup within milliseconds, so one that old and empty is no launch's.
# Exit 1 when CGROUP is still there.
rmdir -- "$1" 2>/dev/null || :
rw_parent=${1%/*}
find "$rw_parent" -mindepth 1 -maxdepth 1 -type d -mmin "+$2" 2>/dev/null |
  while IFS= read -r rw_d; do
    case ${rw_d##*/} in *[!0-9a-f]*|'') continue ;; esac
    rw_e=
    { IFS= read -r rw_e < "$rw_d/cgroup.events"; } 2>/dev/null || continue
    [ "$rw_e" = 'populated 0' ] && rmdir -- "$rw_d" 2>/dev/null
  done
[ ! -d "$1" ]
