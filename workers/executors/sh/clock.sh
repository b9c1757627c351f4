# shellcheck shell=sh
# The target's clock, for the watchers that outlive a worker (the --max-hours
# watchdog, the preemption-notice watcher):
# - `rw_now MS` sets `rw_ms` to the clock in milliseconds: `date +%s%N` where that
#   gives nanoseconds (GNU), else `date +%s` (whole seconds); when `date` fails, the
#   last reading plus MS (the time the caller slept since) stands in for it.
# - `rw_sleep MS` sleeps MS milliseconds where `sleep` takes fractions, else the whole
#   seconds rounded up.
rw_ms=0
rw_now() {
  rw_x=$(date +%s%N 2>/dev/null) || rw_x=
  case $rw_x in
  ''|*[!0-9]*)
    rw_x=$(date +%s 2>/dev/null) || rw_x=
    case $rw_x in
    ''|*[!0-9]*) rw_ms=$((rw_ms + $1)) ;;
    *) rw_ms=$((rw_x * 1000)) ;;
    esac ;;
  *) rw_ms=${rw_x%??????} ;;
  esac
}
rw_sleep() {
  rw_f=$((1000 + $1 % 1000))
  sleep "$(($1 / 1000)).${rw_f#1}" 2>/dev/null || sleep $((($1 + 999) / 1000))
}
