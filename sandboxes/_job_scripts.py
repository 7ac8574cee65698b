"""The scripts of `sandboxes.jobs`, as constants: caller data reaches them only as quoted
positional parameters (`sandboxes.jobs._bind`) and on stdin, never as shell syntax.

What must work when the sandbox cannot start a process (a job filled its pids limit, and every
fork fails): claiming a job's end (`claim`: a noclobber create, ``set -C``), killing its command's
process group (`kill_group`: the group id checked in ``/proc/<pid>/stat`` with ``read``) and the
sweep of every process carrying the job's markers (`STOP` with ``signal_read``: the environments read
with ``read``, which drops their NUL bytes) use only the shell's built-ins (``read``, ``printf``,
``kill``, ``[``, ``set``): a shell that started may run them. Everything else may fork.

A job's directory belongs to the sandbox's user, so any process of the sandbox may replace its
files, with FIFOs too: a script of the runner that opened one to read or write waited for its
other end until the operation timed out, holding the caller (one of the service's worker
threads) that long per request. So these scripts read a job's files with `line` (opened
read-write, which never blocks, and read only when the opened file is a regular one), write
its status read-write too, and claim its end only when nothing is there yet. Not covered: a
FIFO put in place between that check and the claim's create, and files planted in a new job's
directory between its ``mkdir`` and the start's writes (both a race of microseconds), which
hold the caller until its operation times out.
"""

from __future__ import annotations

import shlex

from sandboxes import _scripts
from sandboxes._helper._kill import JOB_MARKER_PREFIX

__all__ = ["FUNCTIONS", "KILL", "LIST", "POLL", "RECORD", "RECORD_MARKER", "SEGMENTS", "START", "STOP"]

# Shared by every script below: `line FILE` (its first line in ``_ln``; empty unless FILE is a
# regular file, and never blocking on a FIFO; ``<>`` would create it: hence the ``-e``), `alive
# DIR MARKER` (the supervisor of the job in DIR runs: its pid carries the supervisor's marker,
# so a reused pid is not mistaken for it), `create FILE` (create FILE unless it exists, at most
# one caller succeeding), `claim DIR` (create ``end``: the one atomic claim of a job's end),
# `starting DIR` (the start that made the job in DIR still runs: its ``starter`` names a live
# pid with the start time it had), `finish DIR STATE CODE` (the
# time, then claim and write the status: the supervisor's end, which has forked before),
# `kill_group DIR` (stop and kill the command's process group while its leader is the
# supervisor's child and leads it, so the group id is still the command's), `kill_job DIR
# MARKER STATE` (claim and write STATE without its time, kill the group, which frees room, then
# `stamp` the time and kill every process carrying the marker: a shell that cannot fork dies
# at ``$(date)``, with the status written by then; a poll in between sees no end time). `create`,
# `claim`, `starting`, `kill_group` and ``signal_read PREFIX SIGNAL ''``
# (`sandboxes._helper._kill`: signal every process whose environment holds
# ``SANDBOXES_EXEC_ID=PREFIX...``, every role of a job) use built-ins alone. A status is
# written right after its claim, with nothing that forks between.
FUNCTIONS = (
    _scripts.KILL_MARKED
    + r"""now() {
  _t=$(date +%s%N 2>/dev/null)
  case $_t in '' | *[!0-9]*) _t=$(date +%s 2>/dev/null)000000000 ;; esac
  case $_t in 000000000 | *[!0-9]*) _t=- ;; esac
}
line() {
  _ln=
  [ -e "$1" ] || return 0
  { [ -f /proc/self/fd/9 ] && read -r _ln <&9; } 2>/dev/null 9<> "$1"
}
alive() {
  line "$1/pid"
  _p=$_ln
  [ -n "$_p" ] && grep -qsxzF -e "SANDBOXES_EXEC_ID=$2-s" "/proc/$_p/environ"
}
create() {
  [ ! -e "$1" ] && [ ! -L "$1" ] || return 1
  set -C
  { printf '' > "$1"; } 2>/dev/null
  _r=$?
  set +C
  return $_r
}
claim() {
  create "$1/end"
}
record() {
  { printf '%s %s %s\n' "$2" "$3" "$4" 1<> "$1/status"; } 2>/dev/null || { : > "$1/status.$2.$3.$4"; } 2>/dev/null
}
recorded() {
  for _f in "$1"/status.*; do
    _f=${_f##*/status.}
    case $_f in *[!A-Za-z0-9.-]* | *.*.*.*) continue ;; *.*.*) ;; *) continue ;; esac
    st="${_f%%.*}" _f=${_f#*.}
    st="$st ${_f%%.*} ${_f#*.}"
    return 0
  done
}
finish() {
  now
  claim "$1" || return 1
  record "$1" "$2" "$3" "$_t"
}
stamp() {
  now
  [ "$_t" = - ] || { rm -f -- "$1/status.new" && printf '%s %s %s\n' "$2" "$3" "$_t" 1<> "$1/status.new" &&
    mv -f -- "$1/status.new" "$1/status"; }
}
starting() {
  line "$1/starter"
  _bp=${_ln%% *} _st=
  case $_bp in '' | *[!0-9]*) return 1 ;; esac
  { read -r _st < "/proc/$_bp/stat"; } 2>/dev/null
  set -- ${_st##*) }
  [ -n "$_st" ] && [ "${20}" = "${_ln#* }" ]
}
kill_group() {
  _st=
  line "$1/cpid"
  _c=$_ln
  line "$1/pid"
  _s=$_ln
  [ -n "$_c" ] && [ -n "$_s" ] || return 1
  { read -r _st < "/proc/$_c/stat"; } 2>/dev/null
  set -- ${_st##*) }
  [ "$2" = "$_s" ] && [ "$3" = "$_c" ] || return 1
  kill -STOP "-$_c" 2>/dev/null
  kill -9 "-$_c" 2>/dev/null
}
kill_job() {
  _k=
  claim "$1" && record "$1" "$3" - - && _k=1
  kill_group "$1"
  [ -z "$_k" ] || stamp "$1" "$3" -
  kill_marked "$2"
}
"""
)

_OUTPUT = r"""d=$1 x=$2
read -r H T < "$d/limits"
f=$d/$x.h lim=$H k=-1 size=0
: > "$f"
while :; do
  if [ "$size" -ge "$lim" ]; then
    k=$((k + 1)) f=$d/$x.$k lim=$T size=0
    : > "$f"
    [ "$k" -lt 2 ] || rm -f -- "$d/$x.$((k - 2))"
  fi
  n=$((lim - size))
  [ "$n" -le 65536 ] || n=65536
  dd bs="$n" count=1 2>/dev/null >> "$f" || break
  new=$(wc -c < "$f") || break
  new=$(($new))
  [ "$new" -ne "$size" ] || { : > "$d/$x.done"; exit 0; }
  size=$new
done
: > "$d/$x.done"
exec cat > /dev/null
"""
"""``DIR X``, the output process of one stream (``X``: ``o`` stdout, ``e`` stderr), on its
FIFO: one ``dd`` read (at most what fits) per round into the head ``X.h``, then into tail
chunks ``X.<k>``, the newest two kept. A failed write (the sandbox's tmp is full) stops keeping
output but never stops reading. ``X.done`` says it ended (or gave up keeping); the supervisor
waits for it."""

_WATCHDOG = (
    FUNCTIONS
    + r"""sleep "$3"
kill_job "$1" "$2" timeout
"""
)

_SUPERVISOR = (
    FUNCTIONS
    + f"OUTPUT={shlex.quote(_OUTPUT)}\nWATCHDOG={shlex.quote(_WATCHDOG)}\n"
    + r"""d=$1 m=$2 t=$3
now
printf '%s\n' "$_t" > "$d/started"
if [ "$4" = 1 ] && ! CDPATH= cd -- "$5" 2>/dev/null; then
  finish "$d" failed cwd
  echo $$ > "$d/pid"
  exit 0
fi
if ! mkfifo "$d/pipe" "$d/epipe" "$d/go"; then
  finish "$d" failed fifo
  echo $$ > "$d/pid"
  exit 0
fi
SANDBOXES_EXEC_ID=$m-o /bin/sh -c "$OUTPUT" sandboxes-job-output "$d" o < "$d/pipe" &
o=$!
SANDBOXES_EXEC_ID=$m-o /bin/sh -c "$OUTPUT" sandboxes-job-output "$d" e < "$d/epipe" &
e=$!
in=/dev/null
[ ! -e "$d/stdin" ] || in=$d/stdin
(
  set --
  while IFS= read -r l; do
    v=$(printf '%s\n' "$l" | base64 -d && printf x)
    set -- "$@" "${v%x}"
  done < "$d/env"
  x=$(cat "$d/cmd" && printf x)
  read -r _ < "$d/go"
  [ ! -e "$d/end" ] || exit 137
  exec setsid env -- "$@" "SANDBOXES_EXEC_ID=$m" /bin/sh -c "${x%x}"
) < "$in" > "$d/pipe" 2> "$d/epipe" &
c=$!
echo "$c" > "$d/cpid"
[ "$t" = 0 ] || SANDBOXES_EXEC_ID=$m-w /bin/sh -c "$WATCHDOG" sandboxes-job-watchdog "$d" "$m" "$t" \
  < /dev/null > /dev/null 2>&1 &
w=$!
echo $$ > "$d/pid.new" && mv -f "$d/pid.new" "$d/pid"
i=0
while [ ! -e "$d/ack" ] && { starting "$d" || { [ ! -e "$d/starter" ] && kill -0 "$6" 2>/dev/null; }; } &&
  [ "$i" -lt 6000 ]; do
  command eval 'sleep 0.01' 2>/dev/null || i=$((i + 1))
  i=$((i + 1))
done
! create "$d/ack" || { claim "$d" && record "$d" failed start -; }
exec 3<> "$d/go"
echo go >&3
wait "$c"
s=$?
kill_marked "$m"
kill_strays $$ 0 "$o" "$e" "$w"
i=0
while { [ ! -e "$d/o.done" ] || [ ! -e "$d/e.done" ]; } && [ "$i" -lt 20 ]; do sleep 0.05; i=$((i + 1)); done
kill_marked "$m-o"
wait "$o" "$e"
finish "$d" exited "$s"
kill_marked "$m-w"
exec 3>&-
rm -f -- "$d/pipe" "$d/epipe" "$d/go"
"""
)

_REAPER = """import os, sys
try:
    import ctypes
    ctypes.CDLL(None).prctl(36, 1, 0, 0, 0)
except Exception:
    pass
os.execv(sys.argv[1], sys.argv[1:])
"""
"""``python3 -c REAPER ARGV...``: exec ARGV as a child subreaper (PR_SET_CHILD_SUBREAPER, kept
across exec): what a job's command leaves behind is re-parented to its supervisor, not to the
exec helper or the container's init, whose orphans are swept after every command (a job's
marker spares nothing there: any process can set it). Without python3 or ctypes ARGV runs as
it is."""

START = (
    FUNCTIONS
    + f"SUPERVISOR={shlex.quote(_SUPERVISOR)}\nREAPER={shlex.quote(_REAPER)}\nP={JOB_MARKER_PREFIX}\n"
    + r"""unset SANDBOXES_JOB_START
r=${1:-${TMPDIR:-/tmp}/.sandboxes-jobs}
id=$2 H=$3 T=$4 t=$5 keep=$6 max=$7 c=$8 cwd=$9
shift 9
s=$1 E=$2 cmd=$3
for tool in setsid mkfifo dd base64 env; do
  command -v "$tool" > /dev/null 2>&1 || { echo "!tool $tool"; exit 21; }
done
[ -d "$r" ] || mkdir -m 700 -- "$r" 2>/dev/null
[ -d "$r" ] && [ ! -L "$r" ] && [ -O "$r" ] || { echo "!root $r"; exit 22; }
n=0
for j in "$r"/*/pid; do
  [ -e "$j" ] || continue
  j=${j%/pid}
  [ -e "$j/status" ] || ! alive "$j" "$P${j##*/}" || n=$((n + 1))
done
[ "$n" -lt "$max" ] || { echo "!full $n"; exit 23; }
set -- "$r"/*/status
n=$#
for f do
  [ "$n" -gt "$keep" ] && [ -e "$f" ] || break
  rm -rf -- "${f%/status}"
  n=$((n - 1))
done
d=$r/$id
mkdir -m 700 -- "$d" || { echo "!mkdir"; exit 24; }
{ read -r _st < "/proc/$$/stat"; } 2>/dev/null
set -- ${_st##*) }
[ -z "${20}" ] || printf '%s %s\n' "$$" "${20}" > "$d/starter"
printf '%s %s\n' "$H" "$T" > "$d/limits" && printf '%s' "$cmd" > "$d/cmd" && : > "$d/env" || {
  rm -rf -- "$d"; echo "!write"; exit 24; }
if [ "$s" = 1 ] || [ "$E" -gt 0 ]; then
  cat > "$d/in" && head -c "$E" "$d/in" > "$d/env" || { rm -rf -- "$d"; echo "!write"; exit 24; }
  if [ "$s" = 1 ]; then tail -c "+$((E + 1))" "$d/in" > "$d/stdin" || { rm -rf -- "$d"; echo "!write"; exit 24; }; fi
  rm -f -- "$d/in"
fi
set -- /bin/sh -c "$SUPERVISOR" sandboxes-job "$d" "$P$id" "$t" "$c" "$cwd" "$$"
! command -v python3 > /dev/null 2>&1 || set -- python3 -I -S -c "$REAPER" "$@"
SANDBOXES_EXEC_ID=$P$id-s setsid "$@" < /dev/null > /dev/null 2> "$d/log" &
i=0
while [ ! -e "$d/pid" ]; do
  i=$((i + 1))
  [ "$i" -le 2000 ] || { echo "!stuck"; exit 25; }
  sleep 0.01
done
create "$d/ack" || { echo "!late"; exit 26; }
echo "!ok"
"""
)
"""``ROOT ID H T TIMEOUT KEEP MAX HAS_CWD CWD HAS_STDIN ENV_BYTES COMMAND``, stdin: ENV_BYTES of
environment lines, then the job's stdin. Refuses (``!full``) when MAX jobs already run; once the
supervisor is ready (its ``pid`` file), lets it run the command by creating ``ack``, and only
then answers ``!ok``, with nothing that forks after the create: a command that takes every pid
at once cannot make this script die before its answer. One that ended without ``!ok`` never runs
its command (the supervisor waits for ``ack`` while this script lives, then claims the job's
end; ``!late``: the supervisor gave up first); one whose answer was lost may have, and may be
checked with `JobRunner.list` before another try."""

_STATE = r"""line "$d/status"
st=$_ln
[ -n "$st" ] || recorded "$d"
if [ -z "$st" ] && [ -e "$d/pid" ] && ! alive "$d" "$m"; then
  gone=$_p
  line "$d/status"
  st=$_ln
  [ -n "$st" ] || recorded "$d"
  if [ -z "$st" ]; then
    kill_job "$d" "$m" lost
    kill_marked "$m-w"
    kill_marked "$m-o"
    line "$d/status"
    st=$_ln
    [ -n "$st" ] || recorded "$d"
    [ -n "$st" ] || [ -z "$gone" ] || st="lost - -"
  fi
fi
if [ -z "$st" ] && [ ! -e "$d/pid" ] && [ -e "$d/starter" ] && ! starting "$d"; then
  ! claim "$d" || record "$d" failed start -
  line "$d/status"
  st=$_ln
fi
line "$d/started"
s0=${_ln:--}
"""
"""``st``: the job's status line (or the name `record` gave it), empty while it runs; a job
without ``pid`` whose start is gone (`starting`) is recorded ``failed start`` (its supervisor
never runs the command then); a job whose
supervisor is gone without a status is recorded ``lost`` (and whatever is left of its tree
killed), and answered ``lost`` when not even that can be recorded: a job whose end was claimed
but never written (a full ``/tmp``) is not running once the supervisor its ``pid`` names is gone
(an unreadable ``pid`` tells nothing: the job reads as running)."""

SEGMENTS = r"""line "$d/limits"
H=${_ln%% *} T=${_ln#* }
printf '!j %s %s %s %s\n' "${st:-running - -}" "$s0" "$H" "$T"
seg() {
  [ -e "$1" ] || return 0
  sz=$({ [ -f /proc/self/fd/9 ] && wc -c <&9; } 2> /dev/null 9<> "$1") || return 0
  a=$2 b=$(($2 + $sz))
  [ "$b" -gt "$off" ] && [ "$left" -gt 0 ] || return 0
  from=$a
  [ "$from" -ge "$off" ] || from=$off
  to=$b
  [ "$((to - from))" -le "$left" ] || to=$((from + left))
  left=$((left - (to - from)))
  printf '%s %s\n' "$tag" "$from"
  { [ -f /proc/self/fd/9 ] && tail -c "+$((from - a + 1))" <&9; } 2> /dev/null 9<> "$1" |
    head -c "$((to - from))" | base64
}
segs() {
  x=$1 tag=$2
  seg "$d/$x.h" 0
  k=-1
  for f in "$d/$x".[0-9]*; do
    [ -e "$f" ] || continue
    [ "${f##*/$x.}" -le "$k" ] || k=${f##*/$x.}
  done
  [ "$k" -lt 1 ] || seg "$d/$x.$((k - 1))" "$((H + (k - 1) * T))"
  [ "$k" -lt 0 ] || seg "$d/$x.$k" "$((H + k * T))"
}
most=$left
segs o '!s'
off=${eoff:-0} left=$most
segs e '!2'
if [ -e "$d/runs" ]; then
  { [ -f /proc/self/fd/9 ] && head -n 4096 <&9; } 2> /dev/null 9<> "$d/runs" | cut -c -40 | sed 's/^/!r /'
fi
echo "!e"
"""
"""With ``$d`` a job's directory (or a recorded command's, `sandboxes._helper._record`), ``st``
its status line (empty: running), ``s0`` its start, ``off``, ``eoff`` and ``left``: the header
line, then the kept output of each stream from its position ``off`` (stdout, ``!s``) and
``eoff`` (stderr, ``!2``) on, at most ``left`` bytes of each, as segments; then a record's runs
of streams (``!r OFFSET TAG``, the first 4,096)."""

_ONE_JOB = (
    FUNCTIONS
    + f"P={JOB_MARKER_PREFIX}\n"
    + r"""r=${1:-${TMPDIR:-/tmp}/.sandboxes-jobs}
d=$r/$2 m=$P$2
[ -d "$d" ] || exit 10
"""
)
"""The preamble of the scripts that act on one job (``ROOT ID ...``): ``$d`` its directory,
``$m`` its marker; exit 10 when there is no such job."""

POLL = _ONE_JOB + "off=$3 left=$4 eoff=${5:-0}\n" + _STATE + SEGMENTS
"""``ROOT ID OFFSET MAX [EOFFSET]``: the job's status line, then the kept output of its stdout
from position OFFSET on and of its stderr from EOFFSET on, at most MAX bytes of each, as
segments ``!s <position>`` (stdout) and ``!2 <position>`` (stderr) followed by base64 lines."""

RECORD = (
    FUNCTIONS
    + r"""d=${TMPDIR:-/tmp}/.sandboxes-streams/$1 off=$2 left=$3
[ -d "$d" ] && [ ! -L "$d" ] || exit 10
line "$d/status"
st=$_ln
if [ -z "$st" ]; then
  line "$d/helper"
  hp=${_ln%% *} ht=${_ln#* } _st=
  ht=${ht%% *}
  case $hp$ht in *[!0-9]*) hp= ;; esac
  [ -z "$hp" ] || { read -r _st < "/proc/$hp/stat"; } 2>/dev/null
  set -- ${_st##*) }
  if [ -z "$hp" ] || [ "${20}" != "$ht" ]; then
    line "$d/status"
    st=${_ln:-lost - -}
  fi
fi
line "$d/started"
s0=${_ln:--}
"""
    + SEGMENTS
)
"""``ID OFFSET MAX``: a recorded command (`sandboxes._helper._record`) as `POLL` answers a job:
``lost`` once the helper that recorded it is gone without its status; exit 10 when there is
no such record."""

RECORD_MARKER = (
    FUNCTIONS
    + r"""d=${TMPDIR:-/tmp}/.sandboxes-streams/$1
[ -d "$d" ] && [ ! -L "$d" ] || exit 10
line "$d/helper"
_m=${_ln#* }
case $_m in *' '*) printf '!m %s\n' "${_m#* }" ;; *) printf '!m\n' ;; esac
"""
)
"""``ID``: the marker of a recorded command (``!m MARKER``); exit 10 when there is no such record."""

KILL = (
    _ONE_JOB
    + r"""kill_job "$d" "$m" killed
i=0
while alive "$d" "$m" && [ "$i" -lt 200 ]; do
  sleep 0.05
  kill_marked "$m"
  i=$((i + 1))
done
line "$d/status"
[ "$_ln" != "killed - -" ] || stamp "$d" killed -
! alive "$d" "$m" || { echo '!survived'; exit 27; }
"""
)
"""``ROOT ID``: finish the job as ``killed`` unless it ended already, kill its tree, and wait
(10 s at most) until its supervisor has ended, killing again what a race let start (exit 27,
``!survived``, when it has not). A ``killed`` claimed by `STOP` without a time (it cannot run
``date``) gets this moment's."""

STOP = (
    _ONE_JOB
    + r"""if claim "$d"; then
  record "$d" killed - -
  echo '!claimed'
  kill_group "$d"
elif [ -e "$d/status" ]; then
  echo '!ended'
fi
[ "$3" = 0 ] && exit 0
signal_read "$m" STOP ''
signal_read "$m" STOP ''
signal_read "$m" KILL ''
signal_read "$m" KILL ''
"""
)
"""``ROOT ID SWEEP``, built-ins only (see the module docstring), for a kill in a sandbox that
may have no room for a process: claim the job's end as ``killed`` (``!claimed``; ``!ended``:
it had ended), so whatever the kill does to its supervisor, the job ends ``killed``, and kill
the command's process group, which frees room; with SWEEP 1, also stop then kill every process
of the job in any role (a tree that left the group with ``setsid``)."""

LIST = (
    FUNCTIONS
    + f"P={JOB_MARKER_PREFIX}\n"
    + r"""r=${1:-${TMPDIR:-/tmp}/.sandboxes-jobs}
[ -d "$r" ] || exit 0
for d in "$r"/*/limits; do
  [ -e "$d" ] || continue
  d=${d%/limits} id=${d##*/}
  m=$P$id
"""
    + _STATE
    + r"""  printf '!j %s %s %s\n' "$id" "${st:-running - -}" "$s0"
done
"""
)
"""``ROOT``: one ``!j ID STATUS CODE ENDED STARTED`` line per job, oldest first."""
