# shellcheck shell=sh
# Arguments: WORKDIR NONCE PARTITION SBATCH_ARG... The doctor of a Slurm target's
# login node (slurm.doctor_script): prints `KEY=VALUE` lines: `cmd-<name>=yes|no` for
# sbatch, squeue, scontrol, scancel and sinfo; `version`; `proctrack` and `killwait`
# (scontrol show config); `partition` (PARTITION, or the default one when empty) and
# `partition-state` (sinfo's availability: up, down, drain, inact; empty: unknown);
# then a test job (`sbatch --wrap`, SBATCH_ARG... among its options, one minute at
# most) that creates WORKDIR/.runwarden-doctor.NONCE on the compute node:
# `shared=yes` when the file is seen here within 20 s, `shared=no` when the job ended
# without it being seen, `shared=pending <reason>` when the job has not run by then
# (it is cancelled), `shared=refused <sbatch's words>` when sbatch refused it. The
# file and the job are removed.
rw_dir=$1 rw_nonce=$2 rw_part=$3
shift 3
for rw_c in sbatch squeue scontrol scancel sinfo; do
  if command -v "$rw_c" >/dev/null 2>&1; then echo "cmd-$rw_c=yes"; else echo "cmd-$rw_c=no"; fi
done
command -v sbatch >/dev/null 2>&1 || exit 0
echo "version=$(sbatch --version 2>/dev/null | head -n 1)"
rw_conf=$(scontrol show config 2>/dev/null)
echo "proctrack=$(printf '%s\n' "$rw_conf" | sed -n 's/^ProctrackType *= *//p')"
echo "killwait=$(printf '%s\n' "$rw_conf" | sed -n 's/^KillWait *= *//p')"
if [ -z "$rw_part" ]; then
  rw_part=$(sinfo -h -o '%P' 2>/dev/null | sed -n 's/\*$//p' | head -n 1)
fi
echo "partition=$rw_part"
if [ -n "$rw_part" ]; then
  echo "partition-state=$(sinfo -h -p "$rw_part" -o '%a' 2>/dev/null | head -n 1)"
  set -- "--partition=$rw_part" "$@"
fi
rw_file="$rw_dir/.runwarden-doctor.$rw_nonce"
mkdir -p -- "$rw_dir" 2>/dev/null || :
rw_out=$(sbatch --parsable --time=1 --output=/dev/null --job-name=runwarden-doctor "$@" \
  --wrap="touch $(printf "'%s'" "$(printf '%s' "$rw_file" | sed "s/'/'\\\\''/g")")" 2>&1) || {
  echo "shared=refused $(printf '%s' "$rw_out" | tr '\n' ' ' | cut -c1-300)"
  exit 0
}
rw_id=${rw_out%%;*}
rw_i=0 rw_st=
while [ "$rw_i" -lt 100 ]; do
  if [ -e "$rw_file" ]; then break; fi
  rw_st=$(squeue -h --states=all -j "$rw_id" -o '%T (%r)' 2>/dev/null) || rw_st=
  case $rw_st in PENDING*|CONFIGURING*|RUNNING*|COMPLETING*|'') ;; *) break ;; esac
  rw_i=$((rw_i + 1))
  sleep 0.2 2>/dev/null || sleep 1
done
if [ -e "$rw_file" ]; then echo 'shared=yes'
else
  case $rw_st in PENDING*) echo "shared=pending $rw_st" ;; *) echo "shared=no $rw_st" ;; esac
fi
scancel "$rw_id" 2>/dev/null || :
rm -f -- "$rw_file" 2>/dev/null || :
