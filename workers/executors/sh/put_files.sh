# shellcheck shell=sh
# Arguments: TOKEN, then for each file INDEX PATH CONTENT. Replaces each PATH (its
# directory created if needed) with CONTENT through a rename from a name unique to
# this writer, as put_file.sh does one; prints `TOKEN W INDEX ok` or `TOKEN W INDEX
# fail` for each, then `TOKEN E` (scripts.files.put_files_script). One file that
# cannot be replaced never stops the others.
rw_put() {
  # $1 path, $2 content.
  rw_path=$1
  case $rw_path in */*) rw_parent=${rw_path%/*} ;; *) rw_parent=. ;; esac
  [ -n "$rw_parent" ] || rw_parent=/
  [ -d "$rw_parent" ] || mkdir -p -- "$rw_parent" || return 1
  rw_tmp="$rw_path.rw-tmp.$$.$rw_t"
  if [ -d "$rw_path" ] && [ ! -h "$rw_path" ]; then rm -rf -- "$rw_path" 2>/dev/null; fi
  if printf '%s' "$2" > "$rw_tmp" && mv -fT -- "$rw_tmp" "$rw_path"; then return 0; fi
  rm -f -- "$rw_tmp"
  return 1
}
rw_t=$1
shift
while [ "$#" -ge 3 ]; do
  if rw_put "$2" "$3" 2>/dev/null; then
    printf '%s W %s ok\n' "$rw_t" "$1"
  else
    printf '%s W %s fail\n' "$rw_t" "$1"
  fi
  shift 3
done
printf '%s E\n' "$rw_t"
