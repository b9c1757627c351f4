# shellcheck shell=sh
# Arguments: DIR JOB MODE ARG AFTER. The batch script of a Slurm job
# (slurm.batch_script: these words, quoted, then this text), what slurmstepd runs on
# the compute node, in the run directory DIR of the shared filesystem. The job wrapper
# of a Slurm job, in its batch step's process group, so Slurm finds, signals and ends
# everything the job starts, as it does for any batch job:
# - JOB MODE ARG: the job's shell (job_shell.sh), run as `SH -c JOB SH MODE ARG`, its
#   `go` given at once; its variables and secrets are this script's environment
#   (`sbatch --export=ALL` from the submitting shell), its output `job.log`
#   (`sbatch --output`);
# - AFTER: whole seconds after which `snapshot.request` asks for the `deadline`
#   snapshot, unless a request is already there (the on-target watchdog's rule);
#   empty: none.
# The notices of Slurm: SIGUSR1 (`--signal=B:USR1@LEAD`, to this shell only: the time
# limit comes) asks for the `deadline` snapshot, SIGTERM without `cancelling` (a
# preemption's grace time, or the time limit itself: Slurm signals every process of
# the job, the job's own bridge sees it too) for the `preempted` one, both as the
# file `snapshot.request` that every job side reads at its step end. The job's
# code is written to `exit_code` when it ends, `signal NAME` to `.runwarden/ended`
# when a signal ended it. With `cancelling` (runwarden's cancel: `scancel --full`
# signals every process), this shell waits for the job's shell still (the job has
# its grace: the batch script's end would make Slurm kill every process of the step
# at once), then ends by that signal and writes nothing.
cd -- "$1" || exit 126
rw_sh=$(command -v sh) || exit 126
rw_mv=$(command -v mv) || exit 126
rw_text=$2 rw_mode=$3 rw_arg=$4 rw_after=$5 rw_sig='' rw_dog='' rw_cancel=''
mkdir -p .runwarden 2>/dev/null || :
rw_ask() {
  # snapshot.request holding $1 unless a request is there: the first reason is kept.
  if [ -e snapshot.request ] || [ -h snapshot.request ]; then return 0; fi
  if printf '%s' "$1" > ".runwarden/request.tmp.$$"; then
    ln -- ".runwarden/request.tmp.$$" snapshot.request 2>/dev/null || :
  fi
  rm -f -- ".runwarden/request.tmp.$$" 2>/dev/null || :
}
# rw_caught runs from the traps only.
# shellcheck disable=SC2317
rw_caught() {
  # shellcheck disable=SC2034  # read by rw_wait_job (wait_job.sh)
  rw_sig=1
  if [ -e cancelling ] || [ -h cancelling ]; then
    rw_cancel=$1
    return 0
  fi
  case $1 in
  USR1) rw_ask deadline ;;
  TERM) rw_ask preempted ;;
  esac
}
trap 'rw_caught TERM' TERM
trap 'rw_caught USR1' USR1
trap 'rw_caught USR2' USR2
trap 'rw_caught XCPU' XCPU
if [ -n "$rw_after" ]; then
  # The watchdog: a child of this shell in the job's process group, ended with it.
  (trap - TERM USR1 USR2 XCPU; sleep "$rw_after" && rw_ask deadline) \
    </dev/null >/dev/null 2>&1 &
  rw_dog=$!
fi
# This shell's own error output goes nowhere (a shell reports a child killed by a
# signal, which is not the job's output); the job's shell keeps it (job.log).
exec 3>&2 2>/dev/null
printf 'go\n' | "$rw_sh" -c "$rw_text" "$rw_sh" "$rw_mode" "$rw_arg" 2>&3 3>&- &
rw_job=$!
exec 3>&-
rw_code=  # the job's exit code, set by rw_wait_job (wait_job.sh)
rw_wait_job "$rw_job"
if [ -n "$rw_dog" ]; then kill "$rw_dog" 2>/dev/null || :; fi
if [ -n "$rw_cancel" ]; then
  trap - "$rw_cancel"
  kill -s "$rw_cancel" $$
fi
if [ "$rw_code" -gt 128 ]; then
  rw_name=$(kill -l "$rw_code" 2>/dev/null) || rw_name=
  case $rw_name in
  ''|*[!A-Z0-9]*) ;;
  *) printf 'signal %s\n' "${rw_name#SIG}" > ".runwarden/ended.tmp.$$" &&
    "$rw_mv" -f -- ".runwarden/ended.tmp.$$" .runwarden/ended ;;
  esac
fi
printf '%s\n' "$rw_code" > "exit_code.tmp.$$" && "$rw_mv" -f -- "exit_code.tmp.$$" exit_code
exit "$rw_code"
