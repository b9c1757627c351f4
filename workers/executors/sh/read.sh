# shellcheck shell=sh
# `rw_read FILE MAX [OFFSET]`: at most MAX bytes of FILE from byte OFFSET (default 0),
# only when FILE is a regular file and not a symbolic link (else exit status 3,
# nothing read). A job may replace any file of its run directory between the test and
# the read: GNU `dd` opens it with O_NONBLOCK | O_NOFOLLOW, so a FIFO or a link put
# there meanwhile never blocks and is never followed; without GNU `dd`, `timeout`
# bounds the read to 5 s; without either, the test alone guards it. How is decided
# once per script, on the first read (`rw_how`, which an SSH shell sets once).
rw_read() {
  [ -f "$1" ] && [ ! -h "$1" ] || return 3
  if [ -z "$rw_how" ]; then
    if dd if=/dev/null bs=1 count=0 iflag=nonblock,nofollow,skip_bytes,count_bytes \
        status=none 2>/dev/null; then rw_how='dd'
    elif command -v timeout >/dev/null 2>&1; then rw_how=timeout
    else rw_how=plain
    fi
  fi
  case $rw_how in
  dd) dd if="$1" bs=65536 skip="${3:-0}" count="$2" \
        iflag=nonblock,nofollow,skip_bytes,count_bytes status=none 2>/dev/null ;;
  timeout) timeout 5 tail -c +$((${3:-0} + 1)) -- "$1" 2>/dev/null | head -c "$2" ;;
  *) tail -c +$((${3:-0} + 1)) -- "$1" 2>/dev/null | head -c "$2" ;;
  esac
}
