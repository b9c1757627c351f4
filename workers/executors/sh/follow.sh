# shellcheck shell=sh
# Arguments: TOKEN CHUNK LOG_CHUNK NOTICE_BYTES NOTICE_STATE_BYTES PROOF_LIMIT
# END_LIMIT, then
# for each run DIR PID START LOG_OFFSET METRICS_OFFSET PROOF (6 arguments; START
# empty when unknown; PROOF 0 not to read the proof, - to read it, else the
# signature SIZE:MTIME of the proof last read, to read it only when it changed). The
# follow tick of a whole target (scripts.follow.follow_script). Needs group.sh,
# read.sh and status_fn.sh.
# Every record is a line beginning with TOKEN. The bytes a job wrote never reach the
# output as they are: each read follows its record encoded (`rw_take`: base64, or hex
# where there is no base64), lines without a blank, so nothing a job writes can make
# a line that reads as a record, even when the job knows TOKEN (a local script's
# arguments can be read in /proc). The first record says which encoding (`B`).
rw_t=$1
rw_chunk=$2
rw_lchunk=$3
rw_notice=$4
rw_state=$5
rw_proof=$6
rw_endlim=$7
shift 7
if command -v base64 >/dev/null 2>&1; then rw_code=b64; else rw_code=hex; fi
[ -n "$rw_how" ] || rw_pick
printf '%s B %s\n' "$rw_t" "$rw_code"
rw_take() {
  # `rw_read FILE MAX [OFFSET]`, its bytes encoded as the `B` record says (nothing
  # for none). With GNU dd and base64, two processes (rw_read's dd, written out here:
  # a function on the left of a pipe would cost a subshell more, for each read).
  [ -f "$1" ] && [ ! -h "$1" ] || return 0
  if [ "$rw_code$rw_how" = b64dd ]; then
    dd if="$1" bs=65536 skip="${3:-0}" count="$2" \
      iflag=nonblock,nofollow,skip_bytes,count_bytes status=none 2>/dev/null | base64
  elif [ "$rw_code" = b64 ]; then rw_read "$@" | base64
  else rw_read "$@" | od -An -v -tx1 | tr -d ' \n'; echo
  fi
}
# The files to size, as references to the arguments ("${7}/job.log"), never their
# values: `eval` below expands them as words, and no name is parsed as code.
rw_list=
rw_flags=
rw_count=0
rw_j=1
rw_d=
rw_pf=
while [ "$rw_j" -le "$#" ]; do
  eval "rw_d=\${$rw_j} rw_pf=\${$((rw_j + 5))}"
  rw_names='job.log metrics.jsonl'
  [ "$rw_pf" = 0 ] || rw_names="snapshot.json $rw_names"
  for rw_name in $rw_names; do
    if [ -f "$rw_d/$rw_name" ] && [ ! -h "$rw_d/$rw_name" ]; then
      rw_list="$rw_list \"\${$rw_j}/$rw_name\""
      rw_count=$((rw_count + 1))
      rw_flags="${rw_flags}1"
    else rw_flags="${rw_flags}0"; fi
  done
  rw_j=$((rw_j + 6))
done
rw_words() { rw_w=$#; }
rw_sizes=
if [ "$rw_count" -gt 0 ]; then
  # SIZE:MTIME of each: a proof's signature; a size is what comes before the colon.
  eval "rw_sizes=\$(find $rw_list -maxdepth 0 -printf '%s:%T@ ' 2>/dev/null)" || rw_sizes=
  # Sizes are digits and spaces, split on purpose.
  # shellcheck disable=SC2086
  rw_words $rw_sizes
  # A file gone meanwhile, or no GNU find: sizes one by one instead.
  [ "$rw_w" -eq "$rw_count" ] || rw_sizes=
fi
rw_part() {
  # $1 tag, $2 index, $3 file, $4 offset. A file is read only when it was listed
  # above ($rw_flags, one character a file, in order), so sizes never shift.
  rw_listed=${rw_flags%"${rw_flags#?}"}; rw_flags=${rw_flags#?}
  [ "$rw_listed" = 1 ] || return 0
  if [ -n "$rw_sizes" ]; then
    rw_n=${rw_sizes%% *}; rw_sizes=${rw_sizes#* }; rw_n=${rw_n%%:*}
  else
    rw_n=$(ls -lnd -- "$3" 2>/dev/null) || return 0
    set -f
    # The fields of `ls -lnd`, split on purpose: the size is the fifth.
    # shellcheck disable=SC2086
    set -- "$1" "$2" "$3" "$4" $rw_n
    set +f
    rw_n=${9-}
  fi
  [ "${rw_n:-0}" -gt "$4" ] 2>/dev/null || return 0
  if [ "$1" = L ]; then
    # More behind than a tick reads: on from the last `rw_lchunk` bytes.
    rw_k=$((rw_n - $4 - rw_lchunk)); [ "$rw_k" -gt 0 ] || rw_k=0
    printf '%s %s %s %s %s\n' "$rw_t" "$1" "$2" "$rw_n" "$rw_k"
    rw_take "$3" "$rw_lchunk" "$(($4 + rw_k))"
    return 0
  fi
  printf '%s %s %s %s\n' "$rw_t" "$1" "$2" "$rw_n"
  rw_take "$3" "$rw_chunk" "$4"
}
rw_file() {
  # $1 tag, $2 index, $3 file, $4 most bytes: the record, only for a regular file.
  if [ ! -f "$3" ] || [ -h "$3" ]; then return 0; fi
  printf '%s %s %s\n' "$rw_t" "$1" "$2"
  rw_take "$3" "$4"
}
rw_proof_of() {
  # $1 index, $2 file, $3 signature last read: `p` with the signature and no bytes
  # when it is that one still, else `P` with the signature (empty without GNU find)
  # and at most PROOF_LIMIT bytes; nothing when no regular file was listed.
  rw_listed=${rw_flags%"${rw_flags#?}"}; rw_flags=${rw_flags#?}
  [ "$rw_listed" = 1 ] || return 0
  rw_sig=
  if [ -n "$rw_sizes" ]; then rw_sig=${rw_sizes%% *}; rw_sizes=${rw_sizes#* }; fi
  if [ -n "$rw_sig" ] && [ "$rw_sig" = "$3" ]; then
    printf '%s p %s %s\n' "$rw_t" "$1" "$rw_sig"
    return 0
  fi
  if [ ! -f "$2" ] || [ -h "$2" ]; then return 0; fi
  printf '%s P %s %s\n' "$rw_t" "$1" "$rw_sig"
  rw_take "$2" "$rw_proof"
}
rw_ended() {
  # $1 index, $2 run directory: for a job whose end is written (`exit_code` or
  # `cancelled` there), its proof (`F` then its bytes; `f` when there is none) and,
  # with `exit_code`, the wrapper's `.runwarden/ended` (`X` then its bytes; `x` when
  # it is not a regular file), so its end needs no read of its own. Neither record
  # for a proof that is not a regular file: the end reads it and says why.
  [ -e "$2/exit_code" ] || [ -e "$2/cancelled" ] || return 0
  if [ -f "$2/snapshot.json" ] && [ ! -h "$2/snapshot.json" ]; then
    printf '%s F %s\n' "$rw_t" "$1"
    rw_take "$2/snapshot.json" "$rw_proof"
  elif [ ! -e "$2/snapshot.json" ] && [ ! -h "$2/snapshot.json" ]; then
    printf '%s f %s\n' "$rw_t" "$1"
  fi
  [ -e "$2/exit_code" ] || return 0
  if [ -f "$2/.runwarden/ended" ] && [ ! -h "$2/.runwarden/ended" ]; then
    printf '%s X %s\n' "$rw_t" "$1"
    rw_take "$2/.runwarden/ended" "$rw_endlim"
  else
    printf '%s x %s\n' "$rw_t" "$1"
  fi
}
rw_nl='
'
rw_one() {
  printf '%s S %s ' "$rw_t" "$1"
  rw_status "$2" "$3" "$4"
  rw_q=
  if [ -s "$2/snapshot.request" ] && [ -f "$2/snapshot.request" ] &&
    [ ! -h "$2/snapshot.request" ]; then
    rw_q=$(rw_read "$2/snapshot.request" 64) || rw_q=
    rw_q=${rw_q%%"$rw_nl"*}
    [ -n "$rw_q" ] || rw_q=requested
  fi
  printf '%s Q %s %.32s\n' "$rw_t" "$1" "$rw_q"
  rw_file N "$1" "$2/notice.json" "$rw_notice"
  rw_file W "$1" "$2/.runwarden/notice.state" "$rw_state"
  [ "$7" = 0 ] || rw_proof_of "$1" "$2/snapshot.json" "$7"
  rw_ended "$1" "$2"
  rw_part L "$1" "$2/job.log" "$5"
  rw_part M "$1" "$2/metrics.jsonl" "$6"
}
rw_i=0
while [ "$#" -ge 6 ]; do
  rw_one "$rw_i" "$1" "$2" "$3" "$4" "$5" "$6"
  rw_i=$((rw_i + 1))
  shift 6
done
printf '%s E\n' "$rw_t"
