# shellcheck shell=sh
# Argument: CGROUP. Removes the run's emptied cgroup CGROUP as an SSH target's login
# user, whose directory holds it (the jobs' user ended it but may not remove it); one
# that still holds a process stays (rmdir refuses it), one already gone is no error.
rmdir -- "$1" 2>/dev/null || [ ! -d "$1" ]
