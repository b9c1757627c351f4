# shellcheck shell=sh
# Arguments: DIR PGID START TERM_TICKS KILL_TICKS TICKS_PER_S MARK_ENTRY MARK ENGINE
# CONTAINER CGROUP. START, MARK_ENTRY (RUNWARDEN_MARK=<mark>), ENGINE and CGROUP may
# be empty (unknown, no mark, no container, no cgroup). Needs group.sh, sweep.sh and
# cgroup.sh. What it does: scripts.status.cancel_script.
rw_dir=$1
rw_pid=$2
rw_begun=$3
rw_term=$4
rw_kill=$5
rw_tps=$6
rw_entry=$7
rw_name=$8
rw_engine=$9
shift 9
rw_container=$1 rw_cg=$2
rw_up() {
  # Seconds since boot, read with a builtin (empty without /proc): a loaded machine
  # stretches the naps, never the waits measured by it.
  rw_s=; { read -r rw_s _ < /proc/uptime; } 2>/dev/null || :
  rw_s=${rw_s%%.*}; case $rw_s in *[!0-9]*) rw_s= ;; esac
}
rw_gone() {
  # $1 turns of 0.1 s at most, and $1 / TICKS_PER_S s by the clock when it is known.
  rw_i=0; rw_up; rw_t0=$rw_s
  while rw_ours "$rw_pid" "$rw_begun"; do
    rw_i=$((rw_i + 1))
    [ "$rw_i" -gt "$1" ] && return 1
    if [ -n "$rw_t0" ]; then
      rw_up; [ -n "$rw_s" ] && [ $((rw_s - rw_t0)) -ge $(($1 / rw_tps)) ] && return 1
    fi
    rw_nap
  done
  return 0
}
rw_mark() {
  if [ -d "$rw_dir" ] && [ ! -e "$rw_dir/$1" ] && [ ! -h "$rw_dir/$1" ]; then
    # `true`, not `:`: a failed redirection of a special builtin ends the script.
    { true > "$rw_dir/$1"; } 2>/dev/null || :
  fi
}
rw_end_group() {
  # Signal $1 to the group, then wait up to $2 turns for it to be gone: 0 once it is.
  rw_signal "$rw_pid" "$1"
  rw_glance rw_ours "$rw_pid" "$rw_begun" || rw_gone "$2"
}
rw_kill_group() {
  rw_end_group KILL "$rw_kill" && return 0
  printf 'process group %s survived SIGKILL\n' "$rw_pid" >&2
  exit 5
}
rw_signalled=
rw_ended=
if [ -z "$rw_begun" ] && [ -d "$rw_dir" ] &&
  { [ -e "$rw_dir/exit_code" ] || [ -e "$rw_dir/cancelled" ]; }; then
  rw_ended=1
fi
if [ -z "$rw_ended" ] && rw_ours "$rw_pid" "$rw_begun"; then
  rw_signalled=1
  rw_mark cancelling
  if [ -n "$rw_engine" ]; then
    "$rw_engine" stop -t 30 "$rw_container" >/dev/null 2>&1 || :
  fi
  rw_end_group TERM "$rw_term" || rw_kill_group
elif [ -d "$rw_dir" ] && [ ! -e "$rw_dir/exit_code" ] && [ ! -e "$rw_dir/cancelled" ]; then
  rw_signalled=1
  rw_mark cancelling
fi
if [ -n "$rw_cg" ] && ! rw_cg_end "$rw_cg" "$rw_term" $((rw_term + rw_kill)); then
  printf 'processes of the cgroup %s survived SIGKILL\n' "$rw_cg" >&2
  exit 5
fi
# The group once more: the cgroup's kill may have ended its last members, zombies
# until their parent reaps them (`kill -0` still finds a zombie), or a job of root's
# may have moved them out of the cgroup. The cancel answers only once the group is
# gone, as the status tells it.
if [ -z "$rw_ended" ] && rw_ours "$rw_pid" "$rw_begun" &&
  ! rw_glance rw_ours "$rw_pid" "$rw_begun"; then
  rw_kill_group
fi
if [ -n "$rw_entry" ] && ! rw_sweep "$rw_entry" "$rw_term" $((rw_term + rw_kill)); then
  # rw_left is set by rw_marked (sweep.sh).
  # shellcheck disable=SC2154
  printf 'processes of run %s survived SIGKILL:%s\n' "$rw_name" "$rw_left" >&2
  exit 5
fi
if [ -n "$rw_signalled" ]; then rw_mark cancelled; fi
