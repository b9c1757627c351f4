# shellcheck shell=sh
# The run's processes, as the job wrapper (wrapper.sh) sees them:
# - `rw_scan` sets `rw_left` to the pids of the run's processes other than the
#   wrapper and its own helpers: the members of the wrapper's process group (not the
#   wrapper, not its children, not zombies), and with /proc every process whose
#   environment holds `$rw_entry` (the run's mark, `RUNWARDEN_RUN_ID=<mark>`, empty:
#   none; not the wrapper, not its parent, not its children, whose environment a fork
#   copied, not zombies, pid 1 never), and every process of the run's cgroup when
#   `$rw_cgp` names its `cgroup.procs` (wrapper.sh: one that cleared its environment
#   and left the group is there; the same exclusions). Without /proc, the group's
#   members come from `ps` (POSIX `-o`), and marks cannot be read; it returns 1 when
#   `ps` fails too.
# - `rw_add PID` adds one such process to `rw_left` (rw_scan's own step).
# - `rw_count LIST` sets `rw_n` to the number of words of LIST.
rw_scan() {
  rw_left=
  if [ -r "/proc/$$/stat" ]; then
    for rw_f in /proc/[0-9]*/stat; do
      rw_l=; { IFS= read -r rw_l < "$rw_f"; } 2>/dev/null || continue
      rw_p=${rw_f#/proc/}; rw_p=${rw_p%/stat}
      rw_l=${rw_l##*) }
      set -f
      # Split on purpose: the fields of /proc/PID/stat after the command name.
      # shellcheck disable=SC2086
      set -- $rw_l
      set +f
      { [ "$#" -ge 3 ] && [ "$3" = "$$" ] && [ "$1" != Z ] && [ "$2" != "$$" ]; } || continue
      [ "$rw_p" = "$$" ] || rw_left="$rw_left $rw_p"
    done
    if [ -n "$rw_entry" ]; then
      # Words on purpose: the paths grep names are /proc/PID/environ, without blanks.
      # shellcheck disable=SC2013
      for rw_f in $(grep -lsxzF -- "$rw_entry" /proc/[0-9]*/environ 2>/dev/null); do
        rw_p=${rw_f#/proc/}; rw_p=${rw_p%/environ}
        rw_add "$rw_p"
      done
    fi
    if [ -n "${rw_cgp-}" ]; then
      { while IFS= read -r rw_p; do rw_add "$rw_p"; done < "$rw_cgp"; } 2>/dev/null || :
    fi
  else
    rw_l=$(ps -A -o pid= -o ppid= -o pgid= -o stat= 2>/dev/null) || return 1
    rw_old=$IFS; IFS='
'
    for rw_f in $rw_l; do
      IFS=$rw_old
      set -f
      # Split on purpose: the columns of one line of `ps`.
      # shellcheck disable=SC2086
      set -- $rw_f
      set +f
      { [ "$#" -ge 4 ] && [ "$3" = "$$" ] && [ "$1" != "$$" ] && [ "$2" != "$$" ]; } || continue
      case $4 in Z*) continue ;; esac
      rw_left="$rw_left $1"
    done
    IFS=$rw_old
  fi
  return 0
}
rw_add() {
  # Adds process $1 to rw_left unless it is no pid, this wrapper, its parent, pid 0
  # or 1, already there, a zombie, or a child of this wrapper (its helpers: a subshell
  # of it, the grep's, still has the mark in its environment and is in its cgroup).
  case $1 in ''|*[!0-9]*) return 0 ;; esac
  { [ "$1" != "$$" ] && [ "$1" != "$PPID" ] && [ "$1" -gt 1 ]; } || return 0
  case " $rw_left " in *" $1 "*) return 0 ;; esac
  rw_l=; { IFS= read -r rw_l < "/proc/$1/stat"; } 2>/dev/null || return 0
  rw_l=${rw_l##*) }
  rw_a=$1
  set -f
  # Split on purpose: the fields of /proc/PID/stat after the command name.
  # shellcheck disable=SC2086
  set -- $rw_l
  set +f
  { [ "$#" -ge 2 ] && [ "$1" != Z ] && [ "$2" != "$$" ]; } || return 0
  rw_left="$rw_left $rw_a"
}
rw_count() {
  set -f
  # Split on purpose: LIST is words.
  # shellcheck disable=SC2086
  set -- $1
  set +f
  # shellcheck disable=SC2034  # read by wrapper.sh
  rw_n=$#
}
