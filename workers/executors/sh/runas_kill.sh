# shellcheck shell=sh
# Arguments: PGID. Kills the process group PGID with SIGKILL, run as the job's user:
# a run-as target's script that sudo keeps in sudo's own group, which the worker may
# not signal (runas.RunAsTransport). `kill -s KILL -- -PGID` (dash), else without `--`
# (busybox).
kill -s KILL -- "-$1" || kill -s KILL "-$1"
