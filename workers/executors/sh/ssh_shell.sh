# shellcheck shell=sh
# The start of a persistent remote shell (ssh.connection), sent once on its standard
# input; then each command is `rw_framed TOKEN SCRIPT ARG...`, every word quoted.
# fd 3 is the channel's stdout for every command; rw_how=dd tells the read scripts
# (read.sh) that GNU dd reads without blocking, found once per shell instead of once
# per script.
exec 3>&1
if dd if=/dev/null bs=1 count=0 iflag=nonblock,nofollow,skip_bytes,count_bytes \
  status=none 2>/dev/null; then
  # shellcheck disable=SC2034  # read by read.sh
  rw_how='dd'
fi
rw_framed() {
  # Runs SCRIPT with the ARGs as its positional parameters in a subshell (so `exit`,
  # a syntax error or a `cd` never reach this shell), its stdout passed through as
  # bytes, its stderr captured, then prints \1rw-TOKEN-e\1, that stderr,
  # \1rw-TOKEN-x\1, a space, the exit status and a newline. SCRIPT is evaluated after
  # `exec` redirections: permanent ones, so dash keeps no saved copies of this shell's
  # descriptors (it holds those at 10+) that a process the script leaves in the
  # background would inherit, holding the capture pipe open. The first `shift` drops
  # TOKEN, the evaluated one SCRIPT.
  rw_e=$(exec </dev/null 2>&1 1>&3 3>&-; shift; eval "shift; $1")
  rw_c=$?
  printf '\001rw-%s-e\001%s\001rw-%s-x\001 %d\n' "$1" "$rw_e" "$1" "$rw_c"
}
