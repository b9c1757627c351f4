# shellcheck shell=sh
# Arguments: DIR SBATCH_ARG... -- NAME=VALUE... -- NAME... --. Submits a job to
# Slurm from the login node (slurm.submit_script): enters DIR (created when missing),
# clears what a new job never inherits (as launcher.sh), then runs `sbatch --parsable
# SBATCH_ARG...` with the job's variables (NAME=VALUE, not secret) and its secrets
# (one line each of the standard input, per NAME, read straight into their names:
# never on a command line or in a file here) exported, for `--export=ALL` to carry to
# the job; sbatch reads the batch script from the rest of the standard input. Prints
# what sbatch prints (`<job id>[;<cluster>]`). Exit 3: DIR cannot be made or cleared;
# 4: the secrets ended early; 5: no sbatch here; else sbatch's own code.
rw_more() { case $1 in --) return 1 ;; esac; }
rw_dir=$1
shift
rw_s=$(command -v sbatch) || { echo 'sbatch is not installed on the login node' >&2; exit 5; }
mkdir -p -- "$rw_dir/.runwarden" && cd -- "$rw_dir" || exit 3
rm -f -- exit_code cancelling cancelled job.pid .runwarden/watchdog.pid \
  snapshot.request snapshot.json notice.json .runwarden/notice.state .runwarden/notice.pid \
  .runwarden/ended || exit 3
set -- "$rw_s" "$@"
(
  # sbatch and its arguments go last: NAME=VALUE... -- NAME... -- SBATCH ARG...
  while rw_more "$1"; do set -- "$@" "$1"; shift; done; shift
  # From here on no variable is read: the job's variables may have any name.
  # shellcheck disable=SC2163
  while rw_more "$1"; do export "$1"; shift; done; shift
  while rw_more "$1"; do
    IFS= read -r "$1" || { echo 'the secrets ended early' >&2; exit 4; }
    # shellcheck disable=SC2163  # the variable named by $1
    export "$1"
    shift
  done
  shift
  exec "$@"
)
