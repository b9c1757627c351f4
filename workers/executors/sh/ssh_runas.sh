# shellcheck shell=sh
# Argument: USER. Run as an SSH target's login user before its first script as USER
# (ssh.transport, a target whose jobs run as another user): prints USER's uid and
# home directory, separated by one space, once `sudo -n -u USER` ran `id -u` and got
# that uid. The user comes from the user database (`getent passwd`, else
# /etc/passwd). Exit 3: no such user; 4: sudo refused (its words on stderr) or ran
# another uid; 5: USER is root or the login user itself (nothing kept from the jobs).
rw_e=$(getent passwd "$1" 2>/dev/null) ||
  rw_e=$(awk -F: -v u="$1" '$1 == u { print; exit }' /etc/passwd 2>/dev/null) || rw_e=
[ -n "$rw_e" ] || { printf 'no user %s on the target\n' "$1" >&2; exit 3; }
rw_uid=$(printf '%s\n' "$rw_e" | cut -d: -f3)
rw_home=$(printf '%s\n' "$rw_e" | cut -d: -f6)
if [ "$rw_uid" = 0 ] || [ "$rw_uid" = "$(id -u)" ]; then
  printf '%s is root or the login user: its jobs would reach the control plane\n' "$1" >&2
  exit 5
fi
rw_id=$(sudo -n -u "$1" -- id -u </dev/null) || exit 4
if [ "$rw_id" != "$rw_uid" ]; then
  printf 'sudo ran a script as uid %s, not %s\n' "$rw_id" "$rw_uid" >&2
  exit 4
fi
printf '%s %s\n' "$rw_uid" "$rw_home"
