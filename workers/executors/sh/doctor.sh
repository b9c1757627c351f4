# shellcheck shell=sh
# Arguments: TOKEN WORKDIR WRITES ABC SCRATCH RANDOM UTILITY...: the doctor's probe
# (scripts.doctor.doctor_script). WRITES is 1 when the job's user makes run
# directories in WORKDIR; ABC the SHA-256 of `abc`; the scratch directory is named
# SCRATCH<pid>.RANDOM; the UTILITY programs must be on the PATH. It prints one
# finding a line, `TOKEN KEY VALUE` (VALUE one line, at most 200 bytes: `rw_first`
# keeps the first line of a command's output, so no tool can make one finding long
# or several), and `TOKEN end .` last.
rw_t=$1
rw_w=$2
rw_job_writes=$3
rw_abc=$4
rw_scratch=$5
rw_random=$6
shift 6
rw_say() { printf '%s %s %s\n' "$rw_t" "$1" "$2"; }
rw_first() {
  head -c 512 2>/dev/null | { IFS= read -r rw_l || :; printf '%s' "$rw_l" | head -c 200; }
}
rw_yes() { if "$@" >/dev/null 2>&1; then rw_say "$rw_k" yes; else rw_say "$rw_k" no; fi; }
rw_s=
rw_clean() { if [ -n "$rw_s" ]; then rm -rf -- "$rw_s" 2>/dev/null || :; rw_s=; fi; }
trap 'rw_clean; exit 1' HUP INT TERM
cd / || :

rw_exe=
if [ -h "/proc/$$/exe" ]; then rw_exe=$(readlink "/proc/$$/exe" 2>/dev/null) || rw_exe=; fi
rw_say sh_exe "$rw_exe"
rw_say sh_version "${BASH_VERSION:-${ZSH_VERSION:-${KSH_VERSION:-${YASH_VERSION:-}}}}"
if (eval 'rw_v=abc/def.tar
  [ "${#rw_v}" = 11 ] && [ "${rw_v%%/*}" = abc ] && [ "${rw_v##*.}" = tar ] &&
  [ "$((7 * 6 - 2))" = 40 ] && [ "$(printf "%s" x)" = x ] &&
  command -v printf && rw_fn() { return 3; } && { rw_fn; [ "$?" = 3 ]; } &&
  (set -C; set +C) && { trap "" USR2; trap - USR2; }') >/dev/null 2>&1
then rw_say sh_posix yes; else rw_say sh_posix no; fi

rw_say setsid "$(command -v setsid 2>/dev/null)"

rw_tar=$(command -v tar 2>/dev/null) || rw_tar=
rw_say tar "$rw_tar"
if [ -n "$rw_tar" ]; then
  rw_v=$(tar --version 2>/dev/null </dev/null | rw_first)
  [ -n "$rw_v" ] || rw_v=$(tar --help 2>&1 </dev/null | rw_first)
  rw_say tar_version "$rw_v"
  if printf '' | tar --null --no-recursion --hard-dereference -T - -cf - >/dev/null 2>&1
  then rw_say tar_create yes; else rw_say tar_create no; fi
fi

rw_sha=$(command -v sha256sum 2>/dev/null) || rw_sha=
rw_say sha256sum "$rw_sha"
if [ -n "$rw_sha" ]; then
  rw_h=$(printf abc | sha256sum 2>/dev/null) || rw_h=
  if [ "${rw_h%% *}" = "$rw_abc" ]; then rw_say sha256sum_works yes; else rw_say sha256sum_works no; fi
  rw_k=sha256sum_z; rw_yes sh -c "printf '' | sha256sum -z"
fi

rw_k=dd_nonblock
rw_yes dd if=/dev/null bs=1 count=0 iflag=nonblock,nofollow,skip_bytes,count_bytes status=none
rw_say timeout "$(command -v timeout 2>/dev/null)"
rw_k=timeout_works; rw_yes timeout 5 sh -c :
rw_k=sleep_fraction; rw_yes sleep 0.01

rw_missing=
for rw_u in "$@"; do
  command -v "$rw_u" >/dev/null 2>&1 || rw_missing="$rw_missing $rw_u"
done
rw_say utilities_missing "${rw_missing# }"
rw_broken=
[ "$(printf abcdef | head -c 2 2>/dev/null)" = ab ] || rw_broken="$rw_broken head-c"
[ "$(find /dev/null -prune -print0 2>/dev/null | tr '\000' '|' 2>/dev/null)" = '/dev/null|' ] ||
  rw_broken="$rw_broken find-print0"
[ "$(printf 'a b\000' | xargs -0 -r sh -c 'printf "<%s>" "$@"' rw 2>/dev/null)" = '<a b>' ] ||
  rw_broken="$rw_broken xargs-0"
[ "$(printf 'a=1\000b=2\000' | grep -cxzF b=2 2>/dev/null)" = 1 ] || rw_broken="$rw_broken grep-z"
rw_say utilities_broken "${rw_broken# }"

if [ -r "/proc/$$/stat" ]; then rw_say proc_stat yes; else rw_say proc_stat no; fi
rw_f=$(RW_DOCTOR_MARK="$rw_t" sh -c \
  'grep -lsxzF -- "RW_DOCTOR_MARK=$1" "/proc/$$/environ" 2>/dev/null' rw "$rw_t") || rw_f=
case $rw_f in /proc/*/environ) rw_say proc_environ yes ;; *) rw_say proc_environ no ;; esac

rw_say curl "$(command -v curl 2>/dev/null)"
rw_wget=$(command -v wget 2>/dev/null) || rw_wget=
rw_say wget "$rw_wget"
if [ -n "$rw_wget" ]; then
  rw_say wget_version "$(wget --version 2>/dev/null </dev/null | rw_first)"
fi

rw_py=$(command -v python3 2>/dev/null) || rw_py=
rw_say python "$rw_py"
if [ -n "$rw_py" ]; then
  rw_c='import sys; sys.stdout.write("%d.%d.%d" % tuple(sys.version_info[:3]))'
  if command -v timeout >/dev/null 2>&1; then
    rw_v=$(timeout 20 python3 -E -s -c "$rw_c" 2>/dev/null </dev/null | rw_first)
  else
    rw_v=$(python3 -E -s -c "$rw_c" 2>/dev/null </dev/null | rw_first)
  fi
  rw_say python_version "$rw_v"
fi

rw_d=$rw_w
if [ -d "$rw_w" ]; then
  rw_say workdir yes
else
  rw_say workdir no
  while [ ! -d "$rw_d" ]; do rw_d=${rw_d%/*}; [ -n "$rw_d" ] || rw_d=/; done
  rw_say workdir_parent "$rw_d"
fi
if [ "$rw_job_writes" = 1 ]; then
  rw_n="$rw_d/$rw_scratch$$.$rw_random"
  if mkdir -- "$rw_n" 2>/dev/null; then rw_s=$rw_n; rw_say writable yes
  else rw_say writable no; fi
fi
if [ -z "$rw_s" ]; then
  rw_s=$(mktemp -d "${TMPDIR:-/tmp}/${rw_scratch}XXXXXX" 2>/dev/null) || rw_s=
  case $rw_s in /*) ;; *) rw_s= ;; esac
fi
rw_say df "$(df -Pk -- "$rw_d" 2>/dev/null | tail -n +2 2>/dev/null | rw_first)"

if [ -n "$rw_s" ]; then
  rw_say scratch yes
  # `true`, not `:`: a failed redirection of a special builtin ends the script.
  if { true > "$rw_s/a"; } 2>/dev/null && mv -fT -- "$rw_s/a" "$rw_s/b" 2>/dev/null &&
    [ -f "$rw_s/b" ] && [ ! -e "$rw_s/a" ]
  then rw_say mv_t yes; else rw_say mv_t no; fi
  if [ -n "$rw_tar" ]; then
    mkdir -- "$rw_s/x" 2>/dev/null || :
    if head -c 1024 /dev/zero 2>/dev/null | tar -xf - -o -C "$rw_s/x" >/dev/null 2>&1
    then rw_say tar_extract yes; else rw_say tar_extract no; fi
  fi
else
  rw_say scratch no
fi
rw_clean
rw_say end .
