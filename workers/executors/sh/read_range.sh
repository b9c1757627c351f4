# shellcheck shell=sh
# Arguments: PATH LIMIT OFFSET. At most LIMIT bytes of PATH from byte OFFSET: nothing
# for a missing file; exit 3 for anything else that is not a regular file, and for a
# regular file the read then fails on (a job may put a link, a FIFO or a directory in
# its place between the test and the read, or make it unreadable): what a job wrote,
# never the target's failure. Needs read.sh.
rw_path=$1
[ -e "$rw_path" ] || [ -h "$rw_path" ] || exit 0
if [ ! -f "$rw_path" ] || [ -h "$rw_path" ]; then
  printf '%s is not a regular file\n' "$rw_path" >&2; exit 3
fi
if ! rw_read "$rw_path" "$2" "$3"; then
  printf '%s could not be read as a regular file\n' "$rw_path" >&2; exit 3
fi
