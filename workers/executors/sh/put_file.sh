# shellcheck shell=sh
# Arguments: PATH PARENT TOKEN CONTENT. Replaces PATH (in PARENT, created if needed)
# with CONTENT through a rename from a name unique to this writer
# (scripts.files.put_file_script). Exit 3 when it cannot be replaced.
rw_path=$1
[ -d "$2" ] || mkdir -p -- "$2" || exit 3
rw_tmp="$rw_path.rw-tmp.$$.$3"
if [ -d "$rw_path" ] && [ ! -h "$rw_path" ]; then rm -rf -- "$rw_path" 2>/dev/null; fi
if printf '%s' "$4" > "$rw_tmp" && mv -fT -- "$rw_tmp" "$rw_path"; then exit 0; fi
rm -f -- "$rw_tmp"
printf 'cannot replace %s\n' "$rw_path" >&2
exit 3
