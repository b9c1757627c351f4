# shellcheck shell=sh
# `rw_read FILE MAX [OFFSET]`: at most MAX bytes of FILE from byte OFFSET (default 0),
# only when FILE is a regular file and not a symbolic link (else exit status 3,
# nothing read). A job may replace any file of its run directory between the test and
# the read: GNU `dd` opens it with O_NONBLOCK | O_NOFOLLOW, so a FIFO or a link put
# there meanwhile never blocks and is never followed; without GNU `dd`, `timeout`
# bounds the read to 5 s; without either, the test alone guards it. How is decided
# once per script, on the first read (`rw_how`, which an SSH shell sets once), or
# before it by `rw_pick`: a script whose reads run in subshells (`$(...)`, a pipe)
# calls it first, so they inherit the choice instead of each making it again.
rw_pick() {
  if dd if=/dev/null bs=1 count=0 iflag=nonblock,nofollow,skip_bytes,count_bytes \
      status=none 2>/dev/null; then rw_how='dd'
  elif command -v timeout >/dev/null 2>&1; then rw_how=timeout
  else rw_how=plain
  fi
}
rw_read() {
  [ -f "$1" ] && [ ! -h "$1" ] || return 3
  [ -n "$rw_how" ] || rw_pick
  case $rw_how in
  dd) dd if="$1" bs=65536 skip="${3:-0}" count="$2" \
        iflag=nonblock,nofollow,skip_bytes,count_bytes status=none 2>/dev/null ;;
  timeout) timeout 5 tail -c +$((${3:-0} + 1)) -- "$1" 2>/dev/null | head -c "$2" ;;
  *) tail -c +$((${3:-0} + 1)) -- "$1" 2>/dev/null | head -c "$2" ;;
  esac
}
