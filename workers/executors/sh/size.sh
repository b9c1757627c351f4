# shellcheck shell=sh
# Arguments: see entries.sh. The total size in bytes of the regular files a download
# of the entries would bring, as one decimal line, from the directory entries alone
# (no file is read); `unknown` where `find` has no -printf (not GNU find). Names
# never reach the output, so none can forge it.
rw_ne=$2
rw_nx=$3
if [ "$rw_ne" = 0 ]; then echo 0; exit 0; fi
find / -maxdepth 0 -printf '' >/dev/null 2>&1 || { echo unknown; exit 0; }
rw_enter "$1"
shift 3
rw_main=$$
rw_todo=$rw_ne
while [ "$rw_todo" -gt 0 ]; do
  rw_e=$1; shift; rw_todo=$((rw_todo - 1))
  [ -e "./$rw_e" ] || [ -h "./$rw_e" ] || continue
  if rw_linked "$rw_e"; then continue; fi
  rw_find "$rw_e" "$rw_todo" "$rw_nx" "$@" -type f -printf '%s\n' || kill -s TERM "$rw_main"
done | awk '{ s += $1 } END { printf "%.0f\n", s }' || exit 4
