# shellcheck shell=sh
# Arguments: DIR PGID START for each job (START empty when unknown); one status line
# per job, in order (rw_status).
while [ "$#" -ge 3 ]; do
  rw_status "$1" "$2" "$3"
  shift 3
done
