# shellcheck shell=sh
# Arguments: DIR OWNER TOKEN. Claims DIR for OWNER: creates it and its parents, then
# .claim exclusively (a hard link of a complete temporary file, so a reader never
# sees a partial owner). Prints `claimed` when the claim is OWNER's (new or already),
# `taken` when another owner holds it; then nothing was changed.
rw_dir=$1
rw_owner=$2
mkdir -p -- "$rw_dir" || exit 3
rw_tmp="$rw_dir/.claim.tmp.$$.$3"
printf '%s\n' "$rw_owner" > "$rw_tmp" || exit 3
if ln -- "$rw_tmp" "$rw_dir/.claim" 2>/dev/null; then
  rm -f -- "$rw_tmp"; echo claimed; exit 0
fi
if [ ! -e "$rw_dir/.claim" ] &&
  (set -C; cat -- "$rw_tmp" > "$rw_dir/.claim") 2>/dev/null; then
  rm -f -- "$rw_tmp"; echo claimed; exit 0
fi
rm -f -- "$rw_tmp"
rw_cur=; IFS= read -r rw_cur < "$rw_dir/.claim" || :
if [ "$rw_cur" = "$rw_owner" ]; then echo claimed; else echo taken; fi
