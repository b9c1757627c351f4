# shellcheck shell=sh
# Arguments: see entries.sh (the 4th: the size in bytes above which openssl hashes).
# `<sha256 hex>  ./<path>` NUL-terminated records for every regular file under the
# entries (scripts.files.manifest_script).
rw_ne=$2
rw_nx=$3
rw_big=$4
if [ "$rw_ne" = 0 ]; then exit 0; fi
if printf '' | sha256sum -z >/dev/null 2>&1; then rw_z=1; else rw_z=; fi
# The small files: all of them without openssl (`-type f` again: always true).
case $(printf '' | openssl dgst -sha256 -r 2>/dev/null) in
  "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855 "*)
    rw_o=1; rw_s1=-size; rw_s2="-$((rw_big + 1))c" ;;
  *) rw_o=; rw_s1=-type; rw_s2=f ;;
esac
rw_enter "$1"
shift 4
rw_main=$$
rw_todo=$rw_ne
while [ "$rw_todo" -gt 0 ]; do
  rw_e=$1; shift; rw_todo=$((rw_todo - 1))
  [ -e "./$rw_e" ] || [ -h "./$rw_e" ] || continue
  if rw_linked "$rw_e"; then continue; fi
  if [ -n "$rw_o" ]; then
    # The inner script expands its own variables, not this one's.
    # shellcheck disable=SC2016
    rw_find "$rw_e" "$rw_todo" "$rw_nx" "$@" -type f -size "+${rw_big}c" -exec sh -c '
      for f do h=$(openssl dgst -sha256 -r < "$f") || exit 4
        printf "%s  %s\0" "${h%% *}" "$f"; done
    ' rw {} + || exit 4
  fi
  if [ -n "$rw_z" ]; then
    { rw_find "$rw_e" "$rw_todo" "$rw_nx" "$@" -type f "$rw_s1" "$rw_s2" -print0 ||
        kill -s TERM "$rw_main"; } |
      xargs -0 -r sha256sum -z -- || exit 4
  else
    # The inner script expands its own variables, not this one's.
    # shellcheck disable=SC2016
    rw_find "$rw_e" "$rw_todo" "$rw_nx" "$@" -type f "$rw_s1" "$rw_s2" -exec sh -c '
      for f do h=$(sha256sum < "$f") || exit 4; printf "%s  %s\0" "${h%% *}" "$f"; done
    ' rw {} + || exit 4
  fi
done
