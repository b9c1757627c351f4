# shellcheck shell=sh
# Arguments: MODE ARG. The job's own shell (scripts.launch.job_shell_script), a child
# of the wrapper, run as `SH -c TEXT SH MODE ARG`: `$0` is the shell's path, as
# `sh -c TEXT` alone gives. It waits for the launcher's `go` on its standard input
# (the launcher's FIFO): at end of input without it (the launcher gone) it exits 125,
# nothing of the job's run.
# - MODE `command`: ARG is one simple command (scripts.launch.single_command), `exec`ed:
#   it is then the job's main process and gets every signal itself.
# - MODE `script`: ARG is the run's `cancelling` marker, and the job's script follows
#   this text. A trap of each preemption signal (scripts.launch.PREEMPTION_SIGNALS)
#   whose handler does nothing keeps the shell alive through a signal sent to the
#   whole group, so it waits for the job's commands (a trapped signal runs its handler
#   only once the command in the foreground ended; a handler, never an ignore: a child
#   resets a caught signal to its default action when it execs), unless the marker
#   exists: then the shell ends by the signal, as runwarden's cancel wants. The
#   script starts with no positional parameter.
rw_go=
IFS= read -r rw_go || rw_go=
exec </dev/null
[ "$rw_go" = go ] || exit 125
if [ "$1" = command ]; then
  # Its words are plain (no expansion, no operator): `eval` reads them as `sh -c` would.
  eval "exec $2"
  exit
fi
rw_cancelling=$2
set --
# The handlers expand the marker's path when they run.
# shellcheck disable=SC2016
trap 'if [ -e "$rw_cancelling" ] || [ -h "$rw_cancelling" ]; then trap - TERM; kill -s TERM $$; fi' TERM
# shellcheck disable=SC2016
trap 'if [ -e "$rw_cancelling" ] || [ -h "$rw_cancelling" ]; then trap - USR1; kill -s USR1 $$; fi' USR1
# shellcheck disable=SC2016
trap 'if [ -e "$rw_cancelling" ] || [ -h "$rw_cancelling" ]; then trap - USR2; kill -s USR2 $$; fi' USR2
# shellcheck disable=SC2016
trap 'if [ -e "$rw_cancelling" ] || [ -h "$rw_cancelling" ]; then trap - XCPU; kill -s XCPU $$; fi' XCPU
