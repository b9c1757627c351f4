# shellcheck shell=sh
# `rw_status DIR PGID START` prints one status line of the job whose run directory is
# DIR, process group PGID and leader's start time START (empty: unknown), in the
# protocol's order (docs/protocol.md, "Status"). Needs group.sh and read.sh.
# The group's liveness is sampled once, before any marker is read: a job that writes
# its exit code and ends between two reads is then seen as exited, never lost. With
# the leader's start time known, a live group is running whatever the files say:
# every file of the run directory is the job's to write, and a job must not be able
# to forge its end.
rw_status() {
  rw_a=0
  if [ -n "$3" ]; then
    if rw_ours "$2" "$3"; then echo running; return 0; fi
  elif rw_alive "$2"; then rw_a=1
  fi
  if [ ! -d "$1" ]; then echo lost
  elif [ -e "$1/cancelled" ] || [ -h "$1/cancelled" ]; then echo cancelled
  elif [ "$rw_a" = 1 ] && { [ -e "$1/cancelling" ] || [ -h "$1/cancelling" ]; }
  then echo running
  else
    rw_c=
    if [ -f "$1/exit_code" ] && [ ! -h "$1/exit_code" ]; then
      rw_c=$(rw_read "$1/exit_code" 32) || rw_c=
    fi
    case $rw_c in
    ''|-|*[!0-9-]*|?*-*) rw_c= ;;
    *) [ "${#rw_c}" -le 11 ] || rw_c= ;;
    esac
    if [ -n "$rw_c" ]; then printf 'exited %s\n' "$rw_c"
    elif [ -e "$1/cancelling" ] || [ -h "$1/cancelling" ]; then echo cancelled
    elif [ "$rw_a" = 1 ]; then echo running
    else echo lost
    fi
  fi
}
