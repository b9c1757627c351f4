# shellcheck shell=sh
# Arguments: TOKEN, then for each checkpoint INDEX RUN_DIR PATH (PATH relative, of
# plain names joined by `/`: checked by the caller). Prints `TOKEN C INDEX VERDICT N` for each, then `TOKEN E`
# (scripts.proof.checkpoint_script). Reads no file and follows no link of the
# checkpoint's path: every component is tested with [ -h ] before it is used.
rw_ck() {
  # $1 index, $2 run directory, $3 the checkpoint's path, walked one component at a
  # time.
  rw_i=$1; rw_d=$2; rw_rest=$3
  if [ ! -d "$rw_d" ]; then printf '%s C %s rundir 0\n' "$rw_t" "$rw_i"; return 0; fi
  rw_p=$rw_d; rw_n=0
  while :; do
    rw_c=${rw_rest%%/*}
    rw_p=$rw_p/$rw_c; rw_n=$((rw_n + 1))
    if [ -h "$rw_p" ]; then printf '%s C %s link %s\n' "$rw_t" "$rw_i" "$rw_n"; return 0; fi
    if [ ! -e "$rw_p" ]; then printf '%s C %s missing %s\n' "$rw_t" "$rw_i" "$rw_n"; return 0; fi
    if [ ! -d "$rw_p" ]; then printf '%s C %s notdir %s\n' "$rw_t" "$rw_i" "$rw_n"; return 0; fi
    case $rw_rest in */*) rw_rest=${rw_rest#*/} ;; *) break ;; esac
  done
  # A directory this user cannot list or enter cannot be resolved either: said first.
  if [ ! -r "$rw_p" ] || [ ! -x "$rw_p" ]; then
    printf '%s C %s unreadable 0\n' "$rw_t" "$rw_i"; return 0
  fi
  # Inside: the physical path under the run directory's own (a component swapped for
  # a link between the tests above and here is caught; builtins only, in subshells).
  rw_top=$(cd -P -- "$rw_d" 2>/dev/null && pwd -P) || rw_top=
  rw_in=$(cd -P -- "$rw_p" 2>/dev/null && pwd -P) || rw_in=
  case $rw_in in
  "$rw_top"/?*) ;;
  *) printf '%s C %s outside 0\n' "$rw_t" "$rw_i"; return 0 ;;
  esac
  set -- "$rw_p"/* "$rw_p"/.[!.]* "$rw_p"/..?*
  for rw_e in "$@"; do
    if [ -e "$rw_e" ] || [ -h "$rw_e" ]; then printf '%s C %s ok 0\n' "$rw_t" "$rw_i"; return 0; fi
  done
  printf '%s C %s empty 0\n' "$rw_t" "$rw_i"
}
rw_t=$1
shift
while [ "$#" -ge 3 ]; do
  rw_ck "$1" "$2" "$3"
  shift 3
done
printf '%s E\n' "$rw_t"
