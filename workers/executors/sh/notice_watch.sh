# shellcheck shell=sh
# Arguments: DIR PROVIDER AWS GCP AZURE POLL_MS NONCE [PID START]. The preemption-notice
# watcher of the job in DIR (notices.notice_watch_script, whose docstring says what it
# does): PROVIDER is aws, gcp, azure or auto; AWS, GCP and AZURE the base URLs of the
# metadata services (http://host[:port]); POLL_MS its poll period in milliseconds; NONCE
# a random word of [0-9a-f] in its temporary names. Started without PID, it reads it
# from job.pid. Needs group.sh and clock.sh.
#
# The functions before `# --- main` are shared by the supervisor and its children
# (subshells: they inherit functions and variables).
LC_ALL=C; export LC_ALL
rw_dir=$1
rw_mode=$2
rw_aws=$3
rw_gcp=$4
rw_azure=$5
rw_poll=$6
rw_nonce=$7
rw_pid=${8-}
rw_begun=${9-}
# Limits (those notices.py names, NOTICE_HTTP_MAX_S, NOTICE_PROBE_S, NOTICE_GCP_WAIT_S
# and the 64 characters parse_notice accepts, are checked against it by a unit test):
rw_cap=65536          # bytes kept of one response's headers, and of its body
rw_cap_blocks=128     # the same in 512-byte blocks (ulimit -f)
rw_field_max=64       # characters kept of not_after and detail
rw_ttl=21600          # the longest IMDSv2 session AWS documents, in seconds
rw_max_s=5            # longest AWS or Azure request (and GCP's first plain read)
rw_probe_s=2          # longest probe request at the start
rw_wait_s=30          # GCP's long-poll timeout_sec
rw_wait_max_s=35      # GCP's long poll cut 5 s after that
rw_azure_api=2020-07-01
if [ -z "$rw_pid" ]; then IFS= read -r rw_pid < "$rw_dir/job.pid" || :; fi
case $rw_begun in *[!0-9]*) rw_begun= ;; esac
case $rw_pid in ''|*[!0-9]*) exit 3 ;; esac
if [ "${#rw_pid}" -gt 9 ] || [ "$rw_pid" -le 1 ]; then exit 3; fi
cd / || :
rw_sup=$$
rw_sf="$rw_dir/.runwarden/notice.state"
mkdir -p -- "$rw_dir/.runwarden" 2>/dev/null || :
rw_w="$rw_dir/.runwarden/notice.pid"
if printf '%s\n' "$$" > "$rw_w.tmp.$$"; then mv -f -- "$rw_w.tmp.$$" "$rw_w" || :; fi
rm -f -- "$rw_w.tmp.$$" 2>/dev/null || :
rw_pace() {
  # Sleeps what is left of one poll period begun at $1 (ms): at most one turn a
  # period, however fast the server answers or fails.
  rw_now 0
  # rw_ms is set by rw_now (clock.sh).
  # shellcheck disable=SC2154
  rw_left=$((rw_poll - (rw_ms - $1)))
  [ "$rw_left" -le "$rw_poll" ] || rw_left=$rw_poll
  [ "$rw_left" -le 0 ] || rw_sleep "$rw_left"
}
rw_ended() {
  [ -e "$rw_dir/exit_code" ] || [ -e "$rw_dir/cancelled" ] || [ ! -d "$rw_dir" ] ||
    ! rw_ours "$rw_pid" "$rw_begun"
}
rw_go() {
  # A child goes on while the job runs and its supervisor lives.
  kill -0 "$rw_sup" 2>/dev/null && ! rw_ended
}
rw_state() {
  rw_s="$rw_sf.rw-tmp.$$.$rw_nonce"
  if printf '%s\n' "$1" > "$rw_s"; then mv -f -- "$rw_s" "$rw_sf" || :; fi
  rm -f -- "$rw_s" 2>/dev/null || :
}
rw_files() {
  rw_h="$rw_t/$1.h"; rw_b="$rw_t/$1.b"; rw_r="$rw_t/$1.r"; rw_pf="$rw_t/$1.pid"
  rw_rc="$rw_t/$1.rc"
}
rw_run() {
  # Runs "$@" as a process whose pid is in $rw_pf, so the supervisor can end it.
  # shellcheck disable=SC2016  # expanded by that process's own sh
  "$rw_sh" -c 'printf "%s\n" "$$" > "$0" && exec "$@"' "$rw_pf" "$@"
}
rw_http() {
  # $1 method, $2 URL, $3 seconds at most, $4 one request header. Sets rw_code (three
  # digits, 000 without an answer); the response headers go to $rw_h and the body to
  # $rw_b, each at most $rw_cap bytes.
  rm -f -- "$rw_h" "$rw_b" "$rw_r" "$rw_rc"
  case $rw_client in
  curl)
    { rw_run curl -sg --noproxy '*' -X "$1" -m "$3" -H "$4" -D - -o - "$2" 2>/dev/null
      echo "$?" > "$rw_rc"; } | head -c "$rw_cap" > "$rw_r"
    tr -d '\r' < "$rw_r" > "$rw_b"
    sed -n '1,/^$/p' "$rw_b" > "$rw_h"
    sed '1,/^$/d' "$rw_b" > "$rw_r"
    mv -f -- "$rw_r" "$rw_b" ;;
  wget)
    # Files, not pipes: busybox's timeout leaves a watcher holding its outputs open
    # for up to a second. ulimit -f bounds them (512-byte blocks).
    (ulimit -f "$rw_cap_blocks" 2>/dev/null
      rw_run timeout "$3" wget -q -S -O "$rw_b" --tries=1 --max-redirect=0 --no-proxy \
        --method="$1" --header="$4" "$2" 2> "$rw_h")
    echo "$?" > "$rw_rc" ;;
  *)
    (ulimit -f "$rw_cap_blocks" 2>/dev/null
      rw_run timeout "$3" wget -q -S -O "$rw_b" -Y off --header "$4" "$2" 2> "$rw_h")
    echo "$?" > "$rw_rc" ;;
  esac
  rm -f -- "$rw_pf"
  rw_code=$(sed -n 's/^ *HTTP\/[0-9.]* \([0-9][0-9][0-9]\).*/\1/p' "$rw_h" | head -n 1)
  [ -n "$rw_code" ] || rw_code=000
  # An answer cut short (time, bytes, a broken connection: curl's 28, 23, 18,
  # timeout's 124, a signal) is no answer. GNU wget's 8 (and 6 for a 401) is an
  # error answer, kept; busybox wget says 1 for those and for a cut: errors kept.
  rw_x=; IFS= read -r rw_x < "$rw_rc" || :
  case $rw_client:$rw_x:$rw_code in
  curl:0:*|wget:0:*|wget:[68]:[45]??|bbwget:0:*|bbwget:1:[345]??) ;;
  *) rw_code=000 ;;
  esac
}
rw_field() {
  # The string value of the JSON member named $1 (our constant) in the body, raw.
  tr -d '\n\r' < "$rw_b" |
    sed -n "s/.*\"$1\"[[:space:]]*:[[:space:]]*\"\([^\"]*\)\".*/\1/p" | head -c 512
}
rw_js() {
  # $1 as a JSON string of at most $2 printable ASCII characters, or null when empty.
  rw_v=$(printf '%s' "$1" | tr -cd ' -~' | head -c "$2" | sed 's/\\/\\\\/g; s/"/\\"/g')
  if [ -z "$rw_v" ]; then printf null; else printf '"%s"' "$rw_v"; fi
}
rw_seen() {
  rw_x=$(date +%s%N 2>/dev/null) || rw_x=
  case $rw_x in
  ''|*[!0-9]*)
    rw_x=$(date +%s 2>/dev/null) || rw_x=
    case $rw_x in ''|*[!0-9]*) rw_at=null ;; *) rw_at=$rw_x ;; esac ;;
  *) rw_s=${rw_x%?????????}; rw_f=${rw_x#"$rw_s"}; rw_at="$rw_s.${rw_f%??????}" ;;
  esac
}
rw_ask() {
  rw_req="$rw_dir/snapshot.request"
  if [ -e "$rw_req" ] || [ -h "$rw_req" ]; then return 0; fi
  rw_tmp="$rw_req.rw-tmp.$$.$rw_nonce.$1"
  if printf '%s' preempted > "$rw_tmp"; then
    if ! ln -- "$rw_tmp" "$rw_req" 2>/dev/null; then
      if [ ! -e "$rw_req" ] && [ ! -h "$rw_req" ]; then mv -f -- "$rw_tmp" "$rw_req" || :; fi
    fi
  fi
  rm -f -- "$rw_tmp" 2>/dev/null || :
}
rw_notice() {
  # $1 source, $2 its not-after as the cloud gave it (may be empty), $3 its detail.
  rw_ended && return 0
  rw_seen
  rw_n="$rw_dir/notice.json"
  rw_tmp="$rw_n.rw-tmp.$$.$rw_nonce.$1"
  if printf '{"source": "%s", "seen_at": %s, "not_after": %s, "detail": %s}\n' \
    "$1" "$rw_at" "$(rw_js "$2" "$rw_field_max")" "$(rw_js "$3" "$rw_field_max")" \
    > "$rw_tmp"; then
    mv -f -- "$rw_tmp" "$rw_n" || :
  fi
  rm -f -- "$rw_tmp" 2>/dev/null || :
  rw_ended || rw_ask "$1"
  printf '%s\n' "$1" > "$rw_noticed" 2>/dev/null || :
}
rw_token() {
  # A fresh IMDSv2 token in rw_tok, or rw_tok empty.
  rw_tok=
  rw_http PUT "$rw_aws/latest/api/token" "$1" "X-aws-ec2-metadata-token-ttl-seconds: $rw_ttl"
  [ "$rw_code" = 200 ] || return 1
  rw_tok=$(head -c 512 < "$rw_b" | tr -d '\r\n')
  case $rw_tok in ''|*[!A-Za-z0-9_=+/.-]*) rw_tok=; return 1 ;; esac
}
rw_aws_get() {
  # GET of an IMDSv2 path; a 401 (token expired) gets one fresh token and a retry.
  [ -n "$rw_tok" ] || rw_token "$rw_max_s" || { rw_code=000; return 0; }
  rw_http GET "$rw_aws$1" "$rw_max_s" "X-aws-ec2-metadata-token: $rw_tok"
  if [ "$rw_code" = 401 ]; then
    rw_token "$rw_max_s" || { rw_code=000; return 0; }
    rw_http GET "$rw_aws$1" "$rw_max_s" "X-aws-ec2-metadata-token: $rw_tok"
  fi
}
rw_aws_loop() {
  rw_files aws; rw_tok=
  while rw_go; do
    rw_now 0; rw_t0=$rw_ms
    rw_aws_get /latest/meta-data/spot/instance-action
    if [ "$rw_code" = 200 ]; then
      rw_a=$(rw_field action)
      [ -n "$rw_a" ] || rw_a=$(head -c "$rw_field_max" < "$rw_b")
      rw_notice aws-spot "$(rw_field time)" "$rw_a"
      return 0
    fi
    rw_aws_get /latest/meta-data/events/recommendations/rebalance
    if [ "$rw_code" = 200 ]; then
      rw_notice aws-rebalance '' "rebalance noticeTime=$(rw_field noticeTime)"
      return 0
    fi
    rw_pace "$rw_t0"
  done
}
rw_gcp_loop() {
  # $1 key, $2 source. One plain GET, then long polls from the last ETag. A plain
  # read that gave an ETag is followed by its long poll at once (the long poll
  # waits by itself); any other turn is paced.
  rw_files "$2"; rw_etag=
  while rw_go; do
    rw_now 0; rw_t0=$rw_ms
    rw_u="$rw_gcp/computeMetadata/v1/instance/$1"
    rw_plain=
    if [ -n "$rw_etag" ]; then
      rw_http GET "$rw_u?wait_for_change=true&timeout_sec=$rw_wait_s&last_etag=$rw_etag" \
        "$rw_wait_max_s" 'Metadata-Flavor: Google'
    else
      rw_plain=1
      rw_http GET "$rw_u" "$rw_max_s" 'Metadata-Flavor: Google'
    fi
    if [ "$rw_code" = 200 ]; then
      rw_etag=$(sed -n 's/^ *[Ee][Tt][Aa][Gg]:[[:space:]]*//p' "$rw_h" | head -n 1 |
        tr -cd 'A-Za-z0-9' | head -c 64)
      rw_v=$(head -c 64 < "$rw_b" | tr -d '\r\n')
      case $1:$rw_v in
      preempted:TRUE|maintenance-event:TERMINATE_ON_HOST_MAINTENANCE|\
maintenance-event:SHUTDOWN_ON_HOST_MAINTENANCE)
        rw_notice "$2" '' "$rw_v"
        return 0 ;;
      esac
      [ -n "$rw_plain" ] && [ -n "$rw_etag" ] && continue
    fi
    rw_pace "$rw_t0"
  done
}
rw_azure_loop() {
  rw_files azure
  while rw_go; do
    rw_now 0; rw_t0=$rw_ms
    rw_http GET "$rw_azure/metadata/scheduledevents?api-version=$rw_azure_api" "$rw_max_s" \
      'Metadata: true'
    if [ "$rw_code" = 200 ]; then
      # One event a line (events hold no objects), the first Preempt one kept.
      rw_e=$(tr -d '\n\r' < "$rw_b" | tr '{' '\n' |
        sed -n '/"EventType"[[:space:]]*:[[:space:]]*"Preempt"/{p;q;}')
      if [ -n "$rw_e" ]; then
        printf '%s\n' "$rw_e" > "$rw_b"
        rw_notice azure-preempt "$(rw_field NotBefore)" "Preempt $(rw_field EventStatus)"
        return 0
      fi
    fi
    rw_pace "$rw_t0"
  done
}
rw_probe() {
  # Whether the service $1 answers as itself, each request bounded by $rw_probe_s s.
  rw_files probe
  case $1 in
  aws) rw_token "$rw_probe_s" ;;
  gcp)
    rw_http GET "$rw_gcp/computeMetadata/v1/instance/preempted" "$rw_probe_s" \
      'Metadata-Flavor: Google'
    [ "$rw_code" = 200 ] &&
      [ -n "$(sed -n '/^ *[Mm][Ee][Tt][Aa][Dd][Aa][Tt][Aa]-[Ff][Ll][Aa][Vv][Oo][Rr]: *Google/p' \
        "$rw_h" | head -c 1)" ] ;;
  azure)
    rw_http GET "$rw_azure/metadata/versions" "$rw_probe_s" 'Metadata: true'
    [ "$rw_code" = 200 ] && [ -n "$(sed -n '/"apiVersions"/p' "$rw_b" | head -c 1)" ] ;;
  esac
}
rw_kids=
rw_end_clients() {
  # Ends the requests whose pids are in $1; rw_again=1 when a pid file was still
  # empty (its wrapper between open and write).
  rw_again=
  for rw_k in "$1"/*.pid; do
    [ -f "$rw_k" ] || continue
    rw_c=; IFS= read -r rw_c < "$rw_k" || :
    case $rw_c in ''|*[!0-9]*) rw_again=1 ;; *) kill "$rw_c" 2>/dev/null ;; esac
  done
}
rw_stop() {
  # Ends the children, then the requests they had under way, then removes the
  # scratch. It is renamed first: a request starting then cannot record its pid
  # (its wrapper then never starts the client), and one that recorded it is in
  # the renamed directory, read again after a nap only when a wrapper was between
  # open and write: the removal comes at once otherwise, before a release's KILL
  # (0.1 s after its TERM) can leave the scratch behind.
  for rw_k in $rw_kids; do kill "$rw_k" 2>/dev/null; done
  rw_g="$rw_t.end"
  mv -f -- "$rw_t" "$rw_g" 2>/dev/null || rw_g=$rw_t
  rw_end_clients "$rw_g"
  if [ -n "$rw_again" ]; then rw_nap; rw_end_clients "$rw_g"; fi
  rw_i=0
  while [ -d "$rw_g" ] && [ "$rw_i" -lt 10 ]; do
    rm -rf -- "$rw_g" 2>/dev/null || :
    [ -d "$rw_g" ] || break
    rw_i=$((rw_i + 1)); rw_nap
  done
  rm -f -- "$rw_dir/notice.json.rw-tmp.$$.$rw_nonce".* \
    "$rw_dir/snapshot.request.rw-tmp.$$.$rw_nonce".* 2>/dev/null || :
}
rw_quit() { rw_stop; rw_state "$2"; exit "$1"; }
# --- main
# Scratch outside the run directory, so its pid files outlive a removed run
# directory; a fresh name (mkdir fails on anything already there), private.
rw_t="${TMPDIR:-/tmp}/rw-notice.$$.$rw_nonce"
rw_noticed=$rw_t/noticed  # the source of the notice a loop recorded
if ! mkdir -m 700 -- "$rw_t"; then
  # shellcheck disable=SC2016  # the variable's name, said
  rw_state 'unavailable: cannot create its scratch directory in $TMPDIR or /tmp'
  exit 5
fi
trap 'rw_quit 0 "done: stopped by a signal"' TERM INT HUP
rw_ended && rw_quit 0 'done: the job ended'
rw_sh=$(command -v sh) || rw_quit 4 'unavailable: no sh on the PATH'
rw_timeout=
if timeout 5 sleep 0 >/dev/null 2>&1; then rw_timeout=1; fi
rw_client=
if command -v curl >/dev/null 2>&1; then rw_client=curl; rw_name=curl
elif command -v wget >/dev/null 2>&1; then
  [ -n "$rw_timeout" ] || rw_quit 4 \
    'unavailable: wget is installed but timeout is not, so its requests cannot be bounded'
  case $(wget --version 2>/dev/null | head -n 1) in
  *Wget*) rw_client=wget; rw_name='GNU wget' ;;
  *) rw_client=bbwget; rw_name='busybox wget' ;;
  esac
else
  rw_quit 4 'unavailable: neither curl nor wget is installed'
fi
rw_noput='aws needs an HTTP PUT for its IMDSv2 token, which busybox wget cannot send'
rw_watch=
rw_note=
case $rw_mode in
auto)
  rw_note=' (auto)'
  for rw_p in gcp azure aws; do
    if [ "$rw_p" = aws ] && [ "$rw_client" = bbwget ]; then continue; fi
    if rw_probe "$rw_p"; then rw_watch="$rw_watch $rw_p"; fi
  done
  if [ -z "$rw_watch" ]; then
    if [ "$rw_client" = bbwget ]; then
      rw_quit 4 "unavailable: no metadata service answered (not asked: $rw_noput)"
    fi
    rw_quit 4 'unavailable: no metadata service answered'
  fi ;;
*)
  if [ "$rw_mode" = aws ] && [ "$rw_client" = bbwget ]; then
    rw_quit 4 "unavailable: $rw_noput; install curl or GNU wget"
  fi
  rw_watch=" $rw_mode"
  rw_probe "$rw_mode" || rw_note=' (no answer yet)' ;;
esac
for rw_p in $rw_watch; do
  case $rw_p in
  aws) rw_aws_loop & rw_kids="$rw_kids $!" ;;
  azure) rw_azure_loop & rw_kids="$rw_kids $!" ;;
  gcp)
    rw_gcp_loop preempted gcp-preempted & rw_kids="$rw_kids $!"
    rw_gcp_loop maintenance-event gcp-maintenance & rw_kids="$rw_kids $!" ;;
  esac
done
rw_state "watching${rw_watch} with ${rw_name}${rw_note}"
while :; do
  if [ -e "$rw_noticed" ]; then
    rw_src=; IFS= read -r rw_src < "$rw_noticed" || :
    rw_quit 0 "done: recorded the ${rw_src:-cloud} notice"
  fi
  rw_ended && rw_quit 0 'done: the job ended'
  rw_sleep "$rw_poll"
done
