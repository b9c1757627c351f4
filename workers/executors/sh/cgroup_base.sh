# shellcheck shell=sh
# Argument: [USER], the jobs' user of a target whose jobs run as another user than the
# login. Prints the directory under which this user may make cgroups and move its own
# processes into them (a run's cgroup is `<it>/runwarden/<mark>`, which the launcher,
# or for USER `ssh_cgroup_enter.sh`, makes and enters: docs/protocol.md,
# "Containment"): the cgroup v2 mount point for root, else this shell's own cgroup
# when it is delegated to the user (the directory and its `cgroup.procs` writable).
# With USER, a login that is not root must also be able to give USER its run's
# `cgroup.procs` and `cgroup.kill` without `chown`: it must be a member of USER's
# primary group (`chgrp` to it, then `chmod g+w`), a group of USER's own (not the
# login's primary group, no other member in the group database), so that no user but
# USER and the login may write them. Else exit 4, the reason and its remedy on
# stderr. Builtins only (and `id`, `getent`).
rw_m=
while read -r _ rw_point rw_type rw_opts _; do
  if [ "$rw_type" = cgroup2 ]; then
    case ,$rw_opts, in *,rw,*) rw_m=$rw_point; break ;; esac
  fi
done < /proc/self/mounts 2>/dev/null
if [ -z "$rw_m" ]; then echo 'no writable cgroup v2 hierarchy on the target' >&2; exit 4; fi
if [ "$(id -u)" = 0 ]; then
  if [ -w "$rw_m/cgroup.procs" ]; then printf '%s\n' "$rw_m"; exit 0; fi
  echo "the cgroup v2 hierarchy $rw_m is not writable on the target" >&2; exit 4
fi
rw_own=
while IFS= read -r rw_l; do
  case $rw_l in 0::/*) rw_own=${rw_l#0::} ;; esac
done < /proc/self/cgroup 2>/dev/null
rw_base=
case $rw_own in
''|/|*/../*|*/./*|*/..|*/.) ;;
*)
  if [ -d "$rw_m$rw_own" ] && [ -w "$rw_m$rw_own" ] && [ -w "$rw_m$rw_own/cgroup.procs" ]; then
    rw_base=$rw_m$rw_own
  fi ;;
esac
if [ -z "$rw_base" ]; then
  echo "the login user is not root and its cgroup (${rw_own:-none}) is not delegated to it (give it one: docs/security.md, On an SSH target)" >&2
  exit 4
fi
if [ -n "${1-}" ]; then
  rw_me=$(id -un) || exit 4
  rw_g=$(id -g -- "$1" 2>/dev/null) || { echo "no user $1 on the target" >&2; exit 4; }
  rw_gn=$(id -gn -- "$1" 2>/dev/null) || rw_gn=$rw_g
  rw_in=
  for rw_x in $(id -G); do [ "$rw_x" = "$rw_g" ] && rw_in=1; done
  if [ -z "$rw_in" ]; then
    echo "the login user $rw_me is not root and not a member of $1's group $rw_gn: it cannot give $1 its run's cgroup (on the target, as root: usermod -a -G $rw_gn $rw_me; docs/security.md, On an SSH target)" >&2
    exit 4
  fi
  if [ "$rw_g" = "$(id -g)" ]; then
    echo "$1's group $rw_gn is the login user's own primary group: its other members could end $1's runs (give $1 a group of its own: useradd --user-group)" >&2
    exit 4
  fi
  rw_e=$(getent group "$rw_g" 2>/dev/null) || rw_e=
  rw_others=
  rw_ifs=$IFS; IFS=,
  for rw_x in ${rw_e##*:}; do
    [ "$rw_x" = "$rw_me" ] || [ "$rw_x" = "$1" ] || rw_others="$rw_others${rw_others:+,}$rw_x"
  done
  IFS=$rw_ifs
  if [ -n "$rw_others" ]; then
    echo "$1's group $rw_gn has members besides the login user ($rw_others): they could end $1's runs (give $1 a group of its own, the login user its only other member)" >&2
    exit 4
  fi
fi
printf '%s\n' "$rw_base"
