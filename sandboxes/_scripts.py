"""Shell text for the file operations `BaseSandbox` builds on ``execute()``.

Rules every script here keeps:

* The script text is a constant. Caller data (paths, patterns, sizes) reaches it only as
  positional parameters, each one `shlex.quote`-d by `command`, so no path or pattern can
  become shell syntax whatever bytes it holds. File contents travel on stdin.
* Only POSIX ``sh`` plus coreutils or busybox (``base64``, ``head``, ``tail``, ``stat -c``,
  ``find``, ``grep -F``, ``md5sum``, ``mktemp``) is assumed: no python3, no bash.
* Failures are reported by exit status (the ``EXIT_*`` codes below), never by parsing error
  text, because stderr wording differs between coreutils, busybox and locales.
* Output that Python parses is NUL- or line-framed so that names with spaces, quotes or
  newlines survive.
"""

from __future__ import annotations

import shlex

from sandboxes._helper._kill import JOB_MARKER_PREFIX, KILL_MARKED_SH

EXIT_NOT_FOUND = 10
EXIT_IS_DIRECTORY = 11
EXIT_PERMISSION = 12
EXIT_NOT_A_DIRECTORY = 13
EXIT_CHANGED = 14
EXIT_NO_SPACE = 15
EXIT_NOT_REGULAR = 16
EXIT_TOO_LARGE = 17
EXIT_SHORT = 18
"""Fewer bytes arrived than were sent: the stream was cut, so the target was left as it was."""
EXIT_NO_CWD = 200
"""From `RUN_IN` when the working directory is missing; a user's command may exit 200 too, so
callers confirm with `CWD_EXISTS` before reporting ``file_not_found``."""


def command(script: str, *args: str) -> str:
    """Bind ``args`` to ``$1..$n`` of ``script`` without any of them reaching the parser."""
    bound = " ".join(shlex.quote(arg) for arg in args)
    return f"set -- {bound}\n{_PRELUDE}{script}" if args else f"{_PRELUDE}{script}"


# `why` leaves in $c the code explaining why $1 could not be used as an existing file: a
# directory, a missing path under a parent that is a file, simply missing, or present but
# refused (which includes hidden behind a directory we may not search, e.g. another user's
# workspace: EACCES, as open(2) would say, rather than ENOENT; callers that turn "present but
# not what I need" into another code check that $1 is visible first). `prep` creates $1's
# parent directory, or exits explaining why it could not.
_PRELUDE = r"""LC_ALL=C; export LC_ALL; unset CDPATH
why() {
  if [ -d "$1" ]; then c=11; return; fi
  if [ -e "$1" ] || [ -L "$1" ]; then c=12; return; fi
  d=$1
  while d=${d%/*}; [ -n "$d" ]; do
    if [ -e "$d" ] && [ ! -d "$d" ]; then c=13; return; fi
    if [ -d "$d" ] && [ ! -x "$d" ]; then c=12; return; fi
  done
  c=10
}
prep() {
  d=${1%/*}
  [ -z "$d" ] || [ -d "$d" ] || mkdir -p -- "$d" 2>/dev/null || {
    c=12
    while [ -n "$d" ]; do
      if [ -e "$d" ] && [ ! -d "$d" ]; then c=13; fi
      d=${d%/*}
    done
    return 1; }
}
"""

LS = r"""if ! cd -P -- "$1" 2>/dev/null; then
  [ -d "$1" ] && exit 12
  why "$1"; [ "$c" = 12 ] && [ -e "$1" ] && c=13; exit "$c"
fi
g1=; g2=; g3=; n=0
for f in * .[!.]* ..?*; do
  if [ -d "$f" ]; then printf 'd%s\0' "$f"
  elif [ -e "$f" ] || [ -L "$f" ]; then printf 'f%s\0' "$f"
  else continue; fi
  n=$((n + ${#f} + 9))
  case $f in ..?*) g3='..?*' ;; .*) g2='.[!.]*' ;; *) g1='*' ;; esac
done
[ -n "$g1$g2$g3" ] || exit 0
[ "$n" -gt 65536 ] || exec stat -c '%s %Y' -- $g1 $g2 $g3 2>/dev/null
stat -c '%s %Y' -- $g1 $g2 $g3 2>/dev/null
exit 0
"""
"""Entries as NUL-terminated ``d<name>``/``f<name>``, then one ``size mtime`` line per entry in
the same order: the globs that matched expand identically twice. The one ``stat`` for all
entries replaces the shell (``exec``: a fork saved), its status
the script's (`EXIT_LS_VANISHED`), unless the names are over 64 KiB (each counted with its NUL
and the kernel's 8-byte pointer, as the argument limit counts them): then it runs as a child,
since an ``exec`` past the kernel's argument limit would end the script (status 126) where the
child's failure leaves the listing, without sizes."""

EXIT_LS_VANISHED = 1
"""`LS`'s status when its ``exec``'d ``stat`` missed an entry that went (or came) after it was
listed: the listing stands, without sizes and times when the lines no longer align
(`_parse.ls_entries`). Only after a record: before any, a status 1 is a shell or a jail that
failed (bwrap's own errors, a ``nologin`` account), and stays an error."""

READ_FILE = r"""f=$1
if [ ! -f "$f" ]; then why "$f"; [ "$c" = 12 ] && [ -e "$f" ] && c=16; exit "$c"; fi
true < "$f" 2>/dev/null || exit 12
head -c "$2" < "$f" | base64
"""
"""The file (at most ``$2`` bytes of it) as base64: binary-safe through any text channel."""

READ_LINES = r"""f=$1
if [ ! -f "$f" ]; then why "$f"; [ "$c" = 12 ] && [ -e "$f" ] && c=16; exit "$c"; fi
true < "$f" 2>/dev/null || exit 12
s=$(stat -L -c %s -- "$f" 2>/dev/null); [ "${s:-0}" -gt "$4" ] || exit 17
n=$(wc -l < "$f") || exit 12
[ -n "$(tail -c 1 < "$f")" ] && n=$((n + 1))
printf '%s\n' "$n"
tail -n "+$2" < "$f" | head -n "$3" | head -c "$4" | base64
"""
"""Lines ``$2`` (1-based) to ``$2 + $3 - 1`` of a big file, at most ``$4`` bytes of them, as
base64 after a line with the file's number of lines (split at LF): for a window past what
``read`` looks at of it, found and cut in the sandbox. Only a file that had more than ``$4``
bytes to give ``read`` comes here, so one whose size says no more (a pseudo-file, which says 0 or
a page) gets 17 (too large) rather than being counted to an end that may never come."""

DOWNLOAD = r"""limit=$1; shift
for f do
  if [ ! -f "$f" ]; then why "$f"; [ "$c" = 12 ] && [ -e "$f" ] && c=16
  elif ! { true < "$f"; } 2>/dev/null; then c=12
  elif [ "$limit" = - ]; then base64 < "$f"; c=0
  else
    s=$(stat -L -c %s -- "$f" 2>/dev/null)
    case $s in 0 | 4096 | '') [ "$(head -c "$((limit + 1))" < "$f" | wc -c)" -gt "$limit" ] && s=$((limit + 1)) ;; esac
    if [ "$s" -gt "$limit" ] 2>/dev/null; then c=17; else head -c "$limit" < "$f" | base64; c=0; fi
  fi
  printf '!%s\n' "$c"
done
"""
"""Per file: its base64 lines, then ``!<status>``; base64 lines never start with ``!``. A file
over ``$1`` bytes (``-``: no limit) gets status 17 and no content, and no more than ``$1`` bytes
of any file are sent (one may grow meanwhile). Its size says whether it is over, except where
it says 0 or a page, as a pseudo-file of ``/proc`` or ``/sys`` does whatever it holds: then its
first ``$1 + 1`` bytes are counted (read to its end when it has fewer). What is not a regular
file (a FIFO, a device, a socket; through links too) gets status 16, never opened."""

_WRITE_ONE = r"""nm=
inplace() {
  [ -e "$1" ] && { [ -L "$1" ] || [ ! -f "$1" ] || [ ! -O "$1" ] || [ ! -w "${1%/*}/." ]; }
}
failed() {
  case $1 in *[Nn]o\ space*) c=15 ;; *) why "$2"; [ "$c" = 10 ] && c=12 ;; esac
}
place() {
  wst=$(stat -c '%s %a %g' -- "$1" "$2" 2>/dev/null)
  wn=; wm=; wg=; ts=; tm=; tg=
  { read -r wn wm wg; read -r ts tm tg; } <<EOF
$wst
EOF
  if [ "$wn" != "$3" ]; then rm -f -- "$1"; c=18; return 1; fi
  [ -n "$ts" ] || tm=${nm:-$wm}
  if [ -n "$tg" ] && [ "$wg" != "$tg" ]; then chgrp "$tg" "$1" 2>/dev/null && wm=; fi
  [ "$wm" = "$tm" ] || chmod "$tm" "$1" 2>/dev/null || { rm -f -- "$1"; c=12; return 1; }
  if mv -f -- "$1" "$2" 2>/dev/null; then c=0; return 0; fi
  rm -f -- "$1"; why "$2"; [ "$c" = 10 ] && c=12; return 1
}
put() {
  if [ -d "$1" ]; then c=11; return 1; fi
  prep "$1" || return 1
  if [ -e "$1" ] && [ ! -f "$1" ]; then c=16; return 1; fi
  if inplace "$1"; then
    if err=$("$2" 2>&1 >"$1"); then c=0; return 0; fi
    failed "$err" "$1"; return 1
  fi
  if [ -e "$1" ] && [ ! -w "$1" ]; then c=12; return 1; fi
  wt=${1%/*}/.sandboxes-write.$4
  if ! err=$(set -C; "$2" 2>&1 >"$wt"); then rm -f -- "$wt"; failed "$err" "$1"; return 1; fi
  place "$wt" "$1" "$3"
}
"""
# `put PATH PRODUCER SIZE TOKEN` writes what the function PRODUCER prints to PATH, leaving in $c
# why not (its own variables are named w* and t*, so its callers' survive). It is atomic: the
# bytes go to a new file beside PATH named after TOKEN (random, from the caller: shells in
# separate pid namespaces share $$), and `place TEMP PATH SIZE` renames it over PATH only once
# all SIZE bytes are there, with PATH's mode (and group, where we may set it), so a writer
# killed halfway or a stream cut short leaves the old file whole and never a part of the new
# one. One `stat` and one `mv` are all it adds to a write: chmod and chgrp run only when needed.
# A PATH that is (or links to) a FIFO, device or socket is refused (16), never opened: a FIFO
# would block the writer. Where a rename could not keep what PATH is (`inplace`), the write
# happens in place as before: a symlink (written through), another user's file, or a directory
# we may not create entries in. New files get the mode the umask gave the temporary file (created by a redirection,
# 0666 less the umask, never mktemp's 0600): no `$(umask)`, whose subshell costs a fork. Only
# COMMIT_STAGED sets $nm, the umask's mode, once a batch: its staged files may come from elsewhere
# (Kubernetes' tar keeps its headers' 0644 whatever the umask).
# PRODUCER always runs in a command substitution of its own, so it may `exec` its last command:
# `_cat` does, one fork fewer a write.

WRITE = (
    _WRITE_ONE
    + r"""_cat() { exec cat; }
put "$1" _cat "$2" "$3"; exit "$c"
"""
)
"""Write stdin (``$2`` bytes) to ``$1``, creating parents; atomically (``$3``: a random token),
keeping mode and owner."""

CAS_WRITE = (
    _WRITE_ONE
    + r"""_cat() { exec cat; }
[ -f "$1" ] || { why "$1"; exit "$c"; }
cur=$(md5sum < "$1" 2>/dev/null) || exit 12
case $cur in "$2"*) ;; *) exit 14 ;; esac
put "$1" _cat "$3" "$4"; exit "$c"
"""
)
"""Compare-and-swap: write stdin (``$3`` bytes) to ``$1`` only if its md5 is still ``$2`` (``$4``:
a random token)."""

UPLOAD = (
    _WRITE_ONE
    + r"""tok=$1; shift
t=$(mktemp 2>/dev/null) || t=$(mktemp -p "${1%/*}" 2>/dev/null) || exit 12
trap 'rm -f "$t"' EXIT HUP INT TERM
cat > "$t" || exit 15
off=1; k=0
_part() { tail -c "+$off" "$t" 2>/dev/null | head -c "$n"; }
while [ $# -gt 0 ]; do
  n=$2; k=$((k + 1))
  put "$1" _part "$n" "$tok.$k"
  printf '%s\n' "$c"
  off=$((off + n)); shift 2
done
exit 0
"""
)
"""Several files in one stream: a random token, then ``$2 $3`` = path and byte count, repeated. The stream is spooled
to a temporary file removed on exit, because ``head -c`` on a pipe may read past its count
(busybox) and would swallow the next file's bytes."""

PREPARE_UPLOAD = (
    _WRITE_ONE
    + r"""for f do
  if [ -d "$f" ]; then c=11
  elif prep "$f"; then
    if [ -e "$f" ] && [ ! -f "$f" ]; then c=16
    elif [ -e "$f" ]; then [ -w "$f" ] && c=0 || c=12
    else [ -w "${f%/*}" ] && c=0 || c=12; fi
  fi
  printf '%s\n' "$c"
done
"""
)
"""Per destination, whether a bulk transport may write it: parents created, status printed."""

COMMIT_STAGED = (
    _WRITE_ONE
    + r"""nm=$(umask); nm=$(printf %o $((0666 & ~0$nm)))
while [ $# -gt 0 ]; do
  s=$1 f=$2 n=$3; shift 3
  if [ "$n" = - ]; then rm -f -- "$s"; continue; fi
  if [ -d "$f" ]; then rm -f -- "$s"; c=11
  elif [ -e "$f" ] && [ ! -f "$f" ]; then rm -f -- "$s"; c=16
  elif [ ! -f "$s" ]; then c=18
  elif inplace "$f"; then
    if [ "$(wc -c < "$s")" -ne "$n" ]; then c=18
    elif err=$(cat -- "$s" 2>&1 >"$f"); then c=0
    else failed "$err" "$f"; fi
    rm -f -- "$s"
  else place "$s" "$f" "$n"; fi
  printf '%s\n' "$c"
done
exit 0
"""
)
"""Put files a bulk transport (tar, SFTP) staged beside their targets in place, atomically:
``$1 $2 $3`` = staged file, target, expected size, repeated; size ``-`` only removes the staged
file (its transfer failed) and prints nothing. One status line per committed file."""

STAGE_CHUNK = r"""if [ "$2" = new ]; then
  true 2>/dev/null > "$1" || { why "$1"; [ "$c" = 10 ] && c=12; exit "$c"; }
else
  [ -f "$1" ] || exit 10
fi
cat >> "$1" || exit 15
"""
"""Append stdin to the staged file ``$1``, created empty first when ``$2`` is ``new``: a big file
crosses the sandbox's command stream in bounded pieces, then `COMMIT_STAGED` renames it. (Created
by ``true``, not ``:``: a failed redirection of a special builtin ends the whole shell with
status 2 in dash, instead of answering why.)"""

DELETE = r"""f=$1
if [ ! -e "$f" ] && [ ! -L "$f" ]; then why "$f"; exit "$c"; fi
rm -rf -- "$f" 2>/dev/null
if [ -e "$f" ] || [ -L "$f" ]; then exit 12; fi
exit 0
"""

FIND_FILES = r"""root=$1; shift
if [ ! -e "$root" ]; then why "$root"; exit "$c"; fi
find -P "$root" "$@" -type f -print0 2>/dev/null
exit 0
"""
"""Regular files under ``$1`` (or ``$1`` itself), NUL-terminated; ``$2...`` are extra ``find``
predicates such as ``( -name *.py )`` that narrow the walk."""

GREP_PART_MAX = 8 << 20
"""Bytes of each part of `GREP`'s answer (the candidate names; the matching lines) the sandbox
sends at most (``head -c``: the search stops when it fills, its writer killed by SIGPIPE); a
part that fills it is cut (`sandboxes._parse.parse_grep`: ``truncated``). The exec helper's
native grep (`sandboxes._helper._search`, ``SEARCH_MAX_OUTPUT``) cuts its lines at the same size."""

_GREP_BATCH = r"""p=$1; shift; grep -F -n -H -e "$p" -- "$@"; s=$?
[ "$s" -le 128 ] || kill -s PIPE "$PPID" 2>/dev/null; exit 0"""
"""One ``grep`` of ``find``'s batch of files (``$1`` the pattern): once a ``grep`` dies of a
signal (SIGPIPE: the cap was reached) ``find`` is stopped too, as its other batches would only
die the same way after walking the rest of the tree (SIGPIPE: no shell reports it)."""

GREP = (
    f"cap={GREP_PART_MAX}\n_GREP_BATCH={shlex.quote(_GREP_BATCH)}\n"
    + r"""root=$1; pat=$2; tool=$3; shift 3
if [ ! -e "$root" ]; then why "$root"; exit "$c"; fi
for n do case $n in "!"*) tool=find ;; esac; done
if [ "$tool" = rg ] && [ -d "$root" ] && [ ! -L "$root" ] && command -v rg >/dev/null 2>&1; then
  for n do set -- "$@" -g "$n"; shift; done
  printf '=Z\n'
  rg --no-config -F -n -H --null --no-heading --color never --hidden --no-ignore --no-messages \
    "$@" -e "$pat" -- "$root" | head -c "$cap"
  exit 0
fi
if [ $# -gt 0 ]; then
  o="("
  for n do set -- "$@" "$o" -name "$n"; o=-o; shift; done
  set -- "$@" ")"
fi
case $root in
  /proc | /proc/* | /sys | /sys/* | /dev | /dev/*) ;;
  *) set -- "(" -path /proc -o -path /sys -o -path /dev ")" -prune -o "$@" ;;
esac
find -P "$root" "$@" -type f -print0 2>/dev/null | head -c "$cap"
printf '\0\n'
find -P "$root" "$@" -type f -exec sh -c "$_GREP_BATCH" sh "$pat" {} + 2>/dev/null | head -c "$cap"
exit 0
"""
)
"""Literal matches of ``$2`` under ``$1``; ``$4...`` are basename patterns that narrow the walk.

With ripgrep in the sandbox (``$3`` = ``rg``, a directory root): one process walks and searches,
its output ``=Z``, then ``path NUL line:text`` lines (no config file, ignore files or hidden-file
rules apply: it must find what ``find`` finds; binary files are skipped as ``grep`` does).
Otherwise POSIX tools: the candidate files NUL-terminated (so the parser can tell where a name
ends even when it holds ``:`` or a newline) and a NUL-newline after them (their end, even when
the cap cut the last), then ``grep -F -n -H`` output, which is NUL-free. Each part stops at
`GREP_PART_MAX` bytes. A walk from above them skips ``/proc``, ``/sys`` and ``/dev``: their
files are the kernel's, and reading some never ends (a grep with no path, i.e. from ``/``, ran
into its 300 s timeout in a local jail); a root inside them is searched as asked."""

KILL_MARKED = (
    KILL_MARKED_SH
    + f"JOB_MARKER_PREFIX={JOB_MARKER_PREFIX}\n"
    + r"""kill_orphans() {
  [ "$PPID" = 0 ] && [ "${SANDBOXES_REAP_INIT-}" = 1 ] || return 0
  r=0 _lc= _lx= _sn=0 _sw=0 _sp=1 _ss=0 _sc=
  while [ "$r" -lt 20 ]; do
    r=$((r + 1)); v=; o=; t=; _se= _sq=
    for d in /proc/[0-9]*; do
      read -r l 2>/dev/null <"$d/stat" || continue
      set -- ${l##*') '}
      [ "$2" = 1 ] && [ "$1" != Z ] || continue
      _a=${49-}
      if environ "$d"; then l=$_sl; else l=-; fi
      [ -z "$_sf" ] || case $l in *SANDBOXES_EXEC_ID=*) _sq=1; continue ;; esac
      case "
$l" in *"
SANDBOXES_EXEC_ID=$JOB_MARKER_PREFIX"*) live_job "$l" 2>/dev/null && continue ;; *"
SANDBOXES_EXEC_ID="?*) running "
$l" && continue ;; "
") read -r l 2>/dev/null <"$d/stat" && set -- ${l##*') '} && [ "$_a" = "${49-}" ] && [ "$_a" != 0 ] || continue ;; esac
      if [ -z "$o" ] || [ "${20}" -lt "$t" ]; then v="$v $o"; o=${d#/proc/}; t=${20}; else v="$v ${d#/proc/}"; fi
    done
    [ -n "${v# }$_sq" ] || return 0
    [ -z "${v# }" ] || kill -9 $v 2>/dev/null
    pause "${v# }" || return 0
    [ "$_sg" = 0 ] || r=$((r - 1))
  done
}
kill_strays() {
  _sp=$1 _ss=${2:-0} _sr=0
  shift 2
  _sk=" $$ $* " _sc= _lc= _lx= _sn=0 _sw=0
  while [ "$_sr" -lt 20 ]; do
    _sr=$((_sr + 1)) _sv= _se= _sq=
    for _sd in /proc/[0-9]*; do
      case $_sk in *" ${_sd#/proc/} "*) continue ;; esac
      [ -O "$_sd" ] && read -r _sl 2>/dev/null <"$_sd/stat" || continue
      set -- ${_sl##*') '}
      [ "$2" = "$_sp" ] && [ "$1" != Z ] && [ "${20}" -ge "$_ss" ] || continue
      _a=${49-}
      environ "$_sd" || _sl=
      [ -z "$_sf" ] || case $_sl in *SANDBOXES_EXEC_ID=*) _sq=1; continue ;; esac
      case "
$_sl" in *"
SANDBOXES_EXEC_ID=$JOB_MARKER_PREFIX"*) ! live_job "$_sl" 2>/dev/null || continue ;; *"
SANDBOXES_EXEC_ID="?*) ! running "
$_sl" || continue ;; "
") read -r _sl 2>/dev/null <"$_sd/stat" && set -- ${_sl##*') '} &&
        [ "$_a" = "${49-}" ] && [ "$_a" != 0 ] || { _se=1; continue; } ;; esac
      _sv="$_sv ${_sd#/proc/}"
    done
    [ -n "$_sv$_se$_sq" ] || return 0
    [ -z "$_sv" ] || kill -9 $_sv 2>/dev/null
    pause "$_sv" || return 0
    [ "$_sg" = 0 ] || _sr=$((_sr - 1))
  done
}
environ() {
  _sf= _sz=$1
  command eval '_sl=$(forked _environ)' 2>/dev/null && return 0
  _sl=
  [ -r "$1/environ" ] || return 1
  _sf=1
  { while IFS= read -r _sx || [ -n "$_sx" ]; do _sl=$_sl$_sx; _sx=; done <"$1/environ"; } 2>/dev/null
}
pause() {
  if [ -n "$1" ]; then _sn=0; elif [ -z "$_se" ]; then _sn=$((_sn + 1)); fi
  [ "$_sn" -lt 2 ] || return 1
  _sg=0
  command eval 'sleep 0.05' 2>/dev/null && return 0
  _sw=$((_sw + 1))
  [ -z "$1" ] || _sg=1
  [ "$_sw" -lt 2000 ]
}
forked() {
  command eval "$1" || exit 2
}
_environ() {
  exec tr '\0' '\n' <"$_sz/environ"
}
running() {
  _rm=${1#*"
SANDBOXES_EXEC_ID="}
  _rm=${_rm%%"
"*}
  case $_sc in *" $_rm "*) return 0 ;; esac
  _rf=
  command eval '_rf=$(forked _carriers)' 2>/dev/null
  [ -n "$_rf" ] || { _sq=1; return 0; }
  for _rp in ${_rf%.}; do
    { read -r _rl <"${_rp%/environ}/stat"; } 2>/dev/null || continue
    set -- ${_rl##*') '}
    [ "$2" = 1 ] || [ "$2" = "$_sp" ] || ! outside "$2" || { _sc="$_sc $_rm "; return 0; }
  done 2>/dev/null
  return 1
}
_carriers() {
  grep -lsxzF -e "SANDBOXES_EXEC_ID=$_rm" /proc/[0-9]*/environ; echo .
}
outside() {
  _rq=$1 _rn=0
  while [ "$_rq" -gt 1 ] && [ "$_rn" -lt 4096 ]; do
    { read -r _rl <"/proc/$_rq/stat"; } 2>/dev/null || return 1
    set -- ${_rl##*') '}
    [ "$2" = "$_sp" ] && [ -O "/proc/$_rq" ] && [ "${20}" -ge "$_ss" ] && return 1
    _rq=$2 _rn=$((_rn + 1))
  done
  [ "$_rn" -lt 4096 ]
}
live_job() {
  _lj=${1#*"SANDBOXES_EXEC_ID=$JOB_MARKER_PREFIX"}
  _lj=${_lj%%"
"*}
  _lj=${_lj%-[sow]}
  case $_lj in '' | *[!0-9a-f]*) return 1 ;; esac
  case $_lc in *" $_lj "*) return 0 ;; esac
  case $_lx in *" $_lj "*) return 1 ;; esac
  _lf=
  command eval '_lf=$(forked _supervisors)' 2>/dev/null
  [ -n "$_lf" ] || { _sq=1; return 0; }
  for _lp in ${_lf%.}; do
    _lp=${_lp#/proc/} _lp=${_lp%/environ} _ld=
    command eval '_ld=$(forked _job_dir)' 2>/dev/null
    [ -n "$_ld" ] || { _sq=1; return 0; }
    _ld=${_ld%.} _ld=${_ld%"
"}
    [ "${_ld##*/}" = "$_lj" ] || continue
    { [ ! -e "$_ld/end" ] && read -r _lq <"$_ld/pid" && [ "$_lq" = "$_lp" ]; } 2>/dev/null &&
      _lc="$_lc $_lj " && return 0
  done 2>/dev/null
  _lx="$_lx $_lj "
  return 1
}
_supervisors() {
  grep -lsxzF -e "SANDBOXES_EXEC_ID=$JOB_MARKER_PREFIX$_lj-s" /proc/[0-9]*/environ; echo .
}
_job_dir() {
  tr '\n\0' '\001\n' <"/proc/$_lp/cmdline" | sed -n 5p; echo .
}
"""
)
"""``kill_marked MARKER`` (`sandboxes._helper._kill`: every process carrying the marker, stopped then
killed, rescanning until none is left) and ``kill_orphans``: in a container (the shell's parent
is outside its pid namespace: ``docker exec``) whose owner set ``SANDBOXES_REAP_INIT=1`` (ours: their init has no
other children), every orphan the init adopted but its own command (its oldest child), the
processes of a live background job (`sandboxes.jobs`) and those of a running command (``running``,
as ``kill_strays`` spares them: another command's end must not kill what a command still running
left behind; its own end does, by its marker), in rounds: what dropped the marker
and left its tree too (see the exec helper's "Orphans"). A job's marker (`JOB_MARKER_PREFIX`)
can be set by any process, so it spares only while ``live_job`` finds that job's supervisor:
a process carrying the job's supervisor marker whose job directory (its fifth argument, as
`sandboxes.jobs` starts it) is the job's, its end not claimed and its ``pid`` naming that
process (each job looked up once per sweep; a lookup that cannot fork, the sandbox at its
pids limit, spares: a live job's processes are never killed for want of a pid): a forged
marker of no job dies; one naming a
live job's id lives as long as that job does, and dies with its kill (its marker). The
caller must not carry the marker itself. Spared too: a process in the middle of an exec,
whose environment (read once: that read decides) is empty between two looks at its ``stat``
that do not agree on where it ends, or say 0; one emptied for good has a real end (see
`sandboxes._helper._kill._environ`). It sets ``r v o t d l _a _l* _s*``; past the URL budget of
Kubernetes' exec (`sandboxes.kubernetes.sandbox._URL_BUDGET`), it travels there on stdin.

``kill_strays PARENT SINCE [KEEP...]`` (its names start with ``_``: a job's supervisor calls
it): the same sweep where no init is the sandbox's own (an SSH host: `sandboxes.ssh`), or of a
subreaper's adoptees (a job's supervisor, `sandboxes.jobs`): every process of this user whose
parent is PARENT (1: the host's init, which adopted what left its tree; or the caller's own
pid), that started at or after SINCE (clock ticks after boot, as in ``/proc/<pid>/stat``; 0:
any time) and is neither a KEEP pid, the caller, a live job's, a running command's
(``running``: it carries a marker that a process outside PARENT's adoptees carries too, one
still in its command's tree, which that command's end kills; ``outside``: no process on that
one's parent chain is such an adoptee, so a stray's own children do not vouch for it) nor in
the middle of an exec, is killed, in rounds until a round finds none and none in an exec (the killed ones' children are
adopted next; one in an exec is looked at again once it is through). By
what the process cannot change: its owner, its parent and its start time (an SSH command's
escapees started after the command did); a marker only spares it while a job or a command
that carries the same one runs, and dies with it. Sandboxes sharing one user
(``isolation="none"``) also lose the escapees of each other's commands that started meanwhile,
as the exec helper's commands do.

Both sweeps work in a sandbox at its process limit (a pids cgroup, ``RLIMIT_NPROC``), which the
strays they are after may keep full: there a shell that cannot fork exits (dash, busybox ash), so
every fork they make is tried under ``command eval``, which turns that into a failed status (the
pause between rounds too), and inside a ``$(...)`` under ``forked``, which then exits the
subshell, so that no failure in there returns busybox ash into a second copy of the sweep.
``environ DIR`` leaves the process's environment in ``_sl``, one entry a line (``tr``), or, where
that cannot start, as ``read`` alone reads it, its NUL separators dropped (``_sf`` set): then a
process whose environment holds no marker is judged at once (killed, or looked at for an exec
when it is empty) and one that holds one anywhere waits for a later round (``_sq``), as does one
whose job or marker lookup could not fork (spared meanwhile). A round whose pause cannot fork
does not count while it killed something (the killed free their pids once reaped; 2,000 such at
most); two rounds in a row that killed nothing, with only such processes left, end the sweep:
what only a fork could judge is then spared, as a live job's lookup that cannot fork spares."""

RUN_IN = (
    KILL_MARKED
    + r"""cd -- "$1" 2>/dev/null || exit 200
command eval ': $(:)' 2>/dev/null || exec /bin/sh -c "$2"
/bin/sh -c "$2"
s=$?
m=$SANDBOXES_EXEC_ID; unset SANDBOXES_EXEC_ID
[ -n "$m" ] && { kill_marked "$m"; kill_orphans; }
exit "$s"
"""
)
"""Run ``$2`` in directory ``$1`` (exit 200 if it is missing), then kill whatever the command
left running that carries its ``SANDBOXES_EXEC_ID`` marker: for transports without the exec
helper, so that nothing a command starts outlives it there either.

When the sandbox has no room for a second process (a probe fork fails: its pids limit is
reached), the command replaces this shell instead (``exec``), so that it still runs, in the one
process ``docker exec`` started: the scripts that kill what fills the sandbox are such commands.
Nothing is killed after it then; its marker is still set, and a timeout still kills its tree."""

CWD_EXISTS = r"""[ -d "$1" ]"""
