# shellcheck shell=sh
# Arguments: DIR ID. Cancels Slurm job ID, whose run directory is DIR, to its end
# (slurm.cancel_script): `cancelling` first (the job side and the batch script then
# end by the signal), then `scancel`: Slurm removes a job that never started from the
# queue, and gives a running one SIGTERM on every process of every step, then SIGKILL
# after the cluster's KillWait (`scancel --signal=KILL` is no quicker: Slurm takes it
# as a cancel too). Waits for Slurm to say the job ended, at most KillWait (capped at
# 50 s) plus 8 s, then writes `cancelled` (whatever the job wrote meanwhile). A job
# Slurm had already ended is left as is (`cancelled` written when it wrote no exit
# code and none is there); a job Slurm still runs is cancelled whatever its files say.
# Exit 3: DIR does not exist; 5: no scancel here; 1: the job is still there at the end
# of the wait (`cancelling` stays; a later cancel goes on).
cd -- "$1" 2>/dev/null || { echo "$1 does not exist" >&2; exit 3; }
rw_id=$2
command -v scancel >/dev/null 2>&1 || { echo 'scancel is not installed on the login node' >&2; exit 5; }
rw_active() {
  # Whether Slurm has the job queued or running (rw_st: its state, empty: unknown).
  rw_st=$(squeue -h --states=all -j "$rw_id" -o %T 2>/dev/null) || rw_st=
  case $rw_st in
  PENDING|CONFIGURING|RUNNING|COMPLETING|SUSPENDED|STOPPED|REQUEUED|REQUEUE_HOLD|\
REQUEUE_FED|RESIZING|SIGNALING|STAGE_OUT|RESV_DEL_HOLD|SPECIAL_EXIT) return 0 ;;
  esac
  return 1
}
rw_wait() {
  # Up to $1 looks, 0.2 s apart, while the job is active; whether it ended.
  rw_i=0
  while rw_active; do
    rw_i=$((rw_i + 1))
    [ "$rw_i" -le "$1" ] || return 1
    sleep 0.2 2>/dev/null || sleep 1
  done
}
rw_done() {
  : > "cancelled.tmp.$$" && mv -f -- "cancelled.tmp.$$" cancelled && exit 0
  exit 1
}
# Slurm first: a job it still runs is cancelled whatever its files say (a job may
# write `cancelled` or `exit_code` itself).
if ! rw_active; then
  if [ -e cancelled ] || [ -h cancelled ] || [ -e exit_code ] || [ -h exit_code ]; then exit 0; fi
  rw_done
fi
: > cancelling
rw_kw=$(scontrol show config 2>/dev/null | sed -n 's/^KillWait *= *\([0-9]*\) sec.*/\1/p')
case $rw_kw in ''|*[!0-9]*) rw_kw=30 ;; esac
[ "$rw_kw" -le 50 ] || rw_kw=50
scancel "$rw_id" || exit 1
rw_wait $(((rw_kw + 8) * 5)) && rw_done
echo "Slurm job $rw_id still $rw_st $((rw_kw + 8)) s after scancel" >&2
exit 1
