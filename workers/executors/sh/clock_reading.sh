# shellcheck shell=sh
# Prints the target's clock: Unix nanoseconds where `date` has %N (GNU), else Unix
# seconds (busybox, BSD).
rw_d=$(date +%s%N 2>/dev/null) || rw_d=
case $rw_d in ''|*[!0-9]*) rw_d=$(date +%s 2>/dev/null) || exit 3 ;; esac
printf '%s\n' "$rw_d"
