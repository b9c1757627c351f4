# shellcheck shell=sh
# Arguments: ID... The Slurm jobs' states, one `squeue` for all (slurm.squeue_script):
# a line `ID|STATE|REASON` per job slurmctld still knows (a finished job for
# `MinJobAge`, 300 s by default), none for the others. Exit 5: no squeue here; 1:
# squeue failed (its error on stderr).
command -v squeue >/dev/null 2>&1 || { echo 'squeue is not installed on the login node' >&2; exit 5; }
rw_ids=$(printf '%s,' "$@")
rw_out=$(squeue -h --states=all -j "${rw_ids%,}" -o '%i|%T|%r' 2>&1) && {
  printf '%s\n' "$rw_out"
  exit 0
}
# One id slurmctld no longer knows is an error of squeue's; several are not.
case $rw_out in *'Invalid job id'*) [ "$#" -eq 1 ] && exit 0 ;; esac
printf '%s\n' "$rw_out" >&2
exit 1
