# shellcheck shell=sh
# Argument: [root]. Prints the directory under which this user may make cgroups and move
# its own processes into them (a run's cgroup is `<it>/runwarden/<mark>`, which the
# launcher makes and enters: docs/protocol.md, "Containment"): the cgroup v2 mount
# point for root, else this shell's own cgroup when it is delegated to the user (the
# directory and its `cgroup.procs` writable; not with `root`: a target whose jobs run
# as another user needs a root login). Else exit 4, the reason on stderr.
# Builtins only (and `id`).
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
if [ "${1-}" = root ]; then
  echo 'the login user is not root: it cannot put the jobs of another user in a cgroup' >&2
  exit 4
fi
rw_own=
while IFS= read -r rw_l; do
  case $rw_l in 0::/*) rw_own=${rw_l#0::} ;; esac
done < /proc/self/cgroup 2>/dev/null
case $rw_own in
''|/|*/../*|*/./*|*/..|*/.) ;;
*)
  if [ -d "$rw_m$rw_own" ] && [ -w "$rw_m$rw_own" ] && [ -w "$rw_m$rw_own/cgroup.procs" ]; then
    printf '%s\n' "$rw_m$rw_own"; exit 0
  fi ;;
esac
echo "the login user is not root and its cgroup (${rw_own:-none}) is not delegated to it" >&2
exit 4
