# shellcheck shell=sh
# `rw_wait_job PID` waits for PID, the job's shell (a child of this shell), to end and
# sets rw_code to its exit code. A signal this shell traps ends a `wait` early; its
# handler sets rw_sig, and while the job runs the wait is done again (a code above 128
# with a signal caught may be the interrupted wait's, not the job's). Needed by
# wrapper.sh and slurm_batch.sh.
rw_wait_job() {
  rw_code=
  while :; do
    rw_sig=
    wait "$1"; rw_c=$?
    # A second wait of a child already reported answers 127 (dash): the first answer was the job's.
    if [ "$rw_c" = 127 ] && [ -n "$rw_code" ]; then break; fi
    rw_code=$rw_c
    { [ -n "$rw_sig" ] && [ "$rw_c" -gt 128 ]; } || break
  done
}
