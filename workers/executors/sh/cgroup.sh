# shellcheck shell=sh
# A run's cgroup v2 directory CG (`JobId.cgroup`), which holds every process of its
# job whatever session or environment it made. `rw_populated CG`: true while a
# process is in it or below it (`cgroup.events`). `rw_cg_end CG TERM_TICKS GIVE_UP`
# ends them: SIGTERM to each (never pid 0, 1 or this script), then `cgroup.kill`
# after TERM_TICKS turns of 0.1 s or as long by the clock, whichever comes first
# (SIGKILL to every process of the cgroup and below at once: none can fork its way
# out), returns 1 when some are left after GIVE_UP turns (or as long), else removes
# the empty directory and returns 0. A CG that is gone is no
# error. Needs group.sh (`rw_nap`, `rw_glance`).
rw_populated() {
  rw_e=
  { IFS= read -r rw_e < "$1/cgroup.events"; } 2>/dev/null || return 1
  [ "$rw_e" != 'populated 0' ]
}
rw_cg_end() {
  [ -d "$1" ] || return 0
  rw_i=0
  if rw_populated "$1"; then
    while IFS= read -r rw_p; do
      case $rw_p in ''|*[!0-9]*) continue ;; esac
      if [ "$rw_p" -gt 1 ] && [ "$rw_p" != "$$" ]; then kill -s TERM "$rw_p" 2>/dev/null || :; fi
    done < "$1/cgroup.procs"
  fi
  rw_glance rw_populated "$1" || :
  # Turns of 0.1 s, and by the clock where /proc/uptime tells it: a loaded machine's
  # slow naps never stretch the grace or the give-up.
  rw_cs; rw_c0=$rw_c; rw_k=
  while rw_populated "$1"; do
    rw_i=$((rw_i + 1))
    rw_t=$rw_i
    if [ -n "$rw_c0" ]; then
      rw_cs; [ -n "$rw_c" ] && [ $(((rw_c - rw_c0) / 10)) -gt "$rw_t" ] && rw_t=$(((rw_c - rw_c0) / 10))
    fi
    if [ -z "$rw_k" ] && [ "$rw_t" -gt "$2" ]; then
      rw_k=1; { echo 1 > "$1/cgroup.kill"; } 2>/dev/null || :
    fi
    [ "$rw_t" -gt "$3" ] && return 1
    rw_nap
  done
  rmdir -- "$1" 2>/dev/null || :
  return 0
}
