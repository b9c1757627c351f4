# shellcheck shell=sh
# Arguments: DIR AFTER_MS POLL_MS TOKEN [PID START]. The on-target watchdog of the
# job in DIR (scripts.launch.watchdog_script): asks for the `deadline` snapshot
# AFTER_MS after its start unless the job ended, looking every POLL_MS at most.
# Started without PID, it reads it from job.pid. Needs group.sh and clock.sh.
rw_dir=$1
rw_after=$2
rw_poll=$3
rw_token=$4
rw_pid=${5-}
rw_begun=${6-}
if [ -z "$rw_pid" ]; then IFS= read -r rw_pid < "$rw_dir/job.pid" || :; fi
case $rw_begun in *[!0-9]*) rw_begun= ;; esac
case $rw_pid in ''|*[!0-9]*) exit 3 ;; esac
if [ "${#rw_pid}" -gt 9 ] || [ "$rw_pid" -le 1 ]; then exit 3; fi
cd / || :
rw_w="$rw_dir/.runwarden/watchdog.pid"
mkdir -p -- "$rw_dir/.runwarden" 2>/dev/null || :
if printf '%s\n' "$$" > "$rw_w.tmp.$$"; then mv -f -- "$rw_w.tmp.$$" "$rw_w" || :; fi
rm -f -- "$rw_w.tmp.$$" 2>/dev/null || :
rw_ended() {
  [ ! -d "$rw_dir" ] || ! rw_ours "$rw_pid" "$rw_begun"
}
rw_ask() {
  rw_req="$rw_dir/snapshot.request"
  if [ -e "$rw_req" ] || [ -h "$rw_req" ]; then return 0; fi
  rw_tmp="$rw_req.rw-tmp.$$.$rw_token"
  if printf '%s' deadline > "$rw_tmp"; then
    if ! ln -- "$rw_tmp" "$rw_req" 2>/dev/null; then
      if [ ! -e "$rw_req" ] && [ ! -h "$rw_req" ]; then mv -f -- "$rw_tmp" "$rw_req" || :; fi
    fi
  fi
  rm -f -- "$rw_tmp" 2>/dev/null || :
}
rw_now 0
# rw_ms is set by rw_now (clock.sh).
# shellcheck disable=SC2154
rw_fire=$((rw_ms + rw_after))
rw_left=0
while ! rw_ended; do
  if [ -n "$rw_fire" ]; then
    rw_now "$rw_left"
    rw_left=$((rw_fire - rw_ms))
    if [ "$rw_left" -le 0 ]; then
      rw_fire=
      rw_ask
      continue
    fi
    [ "$rw_left" -le "$rw_poll" ] || rw_left=$rw_poll
  else
    rw_left=$rw_poll
  fi
  rw_sleep "$rw_left"
done
