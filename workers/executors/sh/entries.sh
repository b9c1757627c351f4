# shellcheck shell=sh
# What the scripts over a download's entries share (size, archive, manifest). Their
# arguments: ROOT, the number of entries, the number of exclude patterns (then, for
# the manifest, the size above which openssl hashes), the entries (safe relative
# paths), the patterns.
# - `rw_enter ROOT` enters ROOT, or exits 3 when it is not a directory.
# - `rw_linked ENTRY`: true when a directory on the way to ENTRY is a symbolic link
#   or not a directory; such an entry counts as missing (`find` would follow the
#   link), on every executor alike.
# - `rw_find ENTRY SKIP COUNT ARG... EXPRESSION...`: `find ./ENTRY`, the SKIP first
#   ARGs left out, names matching one of the COUNT patterns after them pruned at any
#   depth, then EXPRESSION.
rw_linked() {
  rw_rest=$1; rw_pre=.
  while :; do
    case $rw_rest in */*) ;; *) return 1 ;; esac
    rw_pre="$rw_pre/${rw_rest%%/*}"; rw_rest=${rw_rest#*/}
    if [ -h "$rw_pre" ] || [ ! -d "$rw_pre" ]; then return 0; fi
  done
}
rw_find() {
  rw_fe=$1; rw_fs=$2; rw_fn=$3; shift 3
  rw_fk=0
  for rw_a do
    shift
    if [ "$rw_fk" -lt "$rw_fs" ]; then
      rw_fk=$((rw_fk + 1))
    elif [ "$rw_fk" -lt $((rw_fs + rw_fn)) ]; then
      if [ "$rw_fk" = "$rw_fs" ]; then set -- "$@" "("; else set -- "$@" -o; fi
      set -- "$@" -name "$rw_a"
      rw_fk=$((rw_fk + 1))
      [ "$rw_fk" -lt $((rw_fs + rw_fn)) ] || set -- "$@" ")" -prune -o
    else
      set -- "$@" "$rw_a"
    fi
  done
  find "./$rw_fe" "$@"
}
rw_enter() {
  if [ ! -d "$1" ]; then printf '%s does not exist\n' "$1" >&2; exit 3; fi
  cd -- "$1" || exit 3
}
