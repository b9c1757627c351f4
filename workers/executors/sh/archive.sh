# shellcheck shell=sh
# Arguments: see entries.sh. A tar stream of the entries on the standard output
# (scripts.files.archive_script). Needs GNU tar (--null -T -).
rw_ne=$2
rw_nx=$3
if [ "$rw_ne" = 0 ]; then exit 0; fi
rw_enter "$1"
shift 3
rw_main=$$
rw_todo=$rw_ne
while [ "$rw_todo" -gt 0 ]; do
  rw_e=$1; shift; rw_todo=$((rw_todo - 1))
  [ -e "./$rw_e" ] || [ -h "./$rw_e" ] || continue
  if rw_linked "$rw_e"; then continue; fi
  rw_find "$rw_e" "$rw_todo" "$rw_nx" "$@" -print0 || kill -s TERM "$rw_main"
done | tar --null --no-recursion --hard-dereference -T - -cf - || exit 4
