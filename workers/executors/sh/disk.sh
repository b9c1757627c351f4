# shellcheck shell=sh
# Arguments: TOKEN MAX_STEP_DIGITS, then run directories. The read-only disk probe
# (probe.disk_probe_script): for the i-th directory `TOKEN M i` when it does not
# exist, else `TOKEN D i KIB` (du -sk of the newest output/checkpoint-<N>, or `-`)
# then the output of `df -Pk` for it, and `TOKEN F i` after it when df failed;
# `TOKEN E` last.
rw_t=$1
rw_digits=$2
shift 2
rw_one() {
  if [ ! -d "$2" ]; then printf '%s M %s\n' "$rw_t" "$1"; return 0; fi
  rw_best=
  rw_n=
  for rw_c in "$2/output/checkpoint-"*; do
    if [ ! -d "$rw_c" ] || [ -h "$rw_c" ]; then continue; fi
    rw_s=${rw_c##*/checkpoint-}
    case $rw_s in 0) ;; ''|0*|*[!0-9]*) continue ;; esac
    [ "${#rw_s}" -le "$rw_digits" ] || continue
    if [ -z "$rw_n" ] || [ "$rw_s" -gt "$rw_n" ]; then rw_n=$rw_s; rw_best=$rw_c; fi
  done
  rw_k=
  if [ -n "$rw_best" ]; then
    rw_k=$(du -sk -- "$rw_best" 2>/dev/null) || :
    rw_k=${rw_k%%[!0-9]*}
  fi
  printf '%s D %s %s\n' "$rw_t" "$1" "${rw_k:--}"
  df -Pk -- "$2" 2>&1 || printf '\n%s F %s\n' "$rw_t" "$1"
}
rw_i=0
for rw_dir in "$@"; do
  rw_one "$rw_i" "$rw_dir"
  rw_i=$((rw_i + 1))
done
printf '%s E\n' "$rw_t"
