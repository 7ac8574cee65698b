"""Background jobs that live IN the sandbox: start, poll, kill, list, on `BaseSandbox.execute`.

Why in the sandbox, not in the caller's memory: a job held by a thread of the process that
started it (the service's former background processes) dies or is forgotten with that process,
and no other process can see it. A job here is a supervisor process and a directory inside the
sandbox; any process holding a handle to the sandbox polls or kills it by its id, after a
restart of the one that started it too. Everything goes through ``execute()`` alone, one round
trip per operation, so every backend (Local, Docker, SSH, Kubernetes, busybox images without
python3) has jobs. The scripts are constants; caller data reaches them only as quoted positional
parameters (the command too) and on stdin (the environment, the job's stdin), as in
`sandboxes._scripts`, so no command, environment or path can become the runner's shell syntax.

A job ``<id>`` (time-ordered hex) is a directory ``${TMPDIR:-/tmp}/.sandboxes-jobs/<id>`` (0700,
in a 0700 root the sandbox user must own: on a shared ``/tmp`` a root planted by someone else
is refused) holding:

- ``cmd``, ``env`` (base64 lines of ``NAME=VALUE``, so values never appear in a command line),
  ``stdin`` (when given), ``limits`` (output head size and tail chunk size);
- ``pid``: the supervisor, started by ``setsid`` with stdin from ``/dev/null``: it left the
  starting command's session and group, and its marker (below) exempts it from the exec
  helper's sweep of orphans, so it outlives the ``execute()`` that started it;
- ``cpid``: the command, ``setsid /bin/sh -c CMD`` in the job's directory of choice, with the
  caller's environment and ``SANDBOXES_EXEC_ID=sandboxes-job-<id>``: every process it starts
  inherits the marker, so `kill` takes down the whole tree (`sandboxes._scripts.KILL_MARKED`),
  and its process group is killed too (a leader that wiped its environment);
- ``o.h``, ``o.<k>``: the output (stdout and stderr merged, bytes as written). An output
  process reads the command's FIFO with one ``dd`` read at a time (busybox ``head -c`` reads
  past its count and buffers its output): the first ``H`` bytes go to ``o.h``, the rest to tail
  chunks of ``T`` bytes of which the newest two are kept, so at most ``H + 2T`` (the output
  limit) is kept, head and tail as `sandboxes._output.OutputBuffer` does, however long the
  command runs. It never stops reading: a command past its output limit keeps running (no
  SIGPIPE), and how much was dropped follows from which chunks remain;
- ``status``: ``exited <code>``, ``timeout``, ``killed``, ``lost`` (its supervisor vanished:
  the sandbox or its jail restarted) or ``failed cwd``, written once: whoever first creates
  the directory ``end`` (the supervisor, the watchdog, a kill) writes it, by rename.

The timeout is enforced inside the sandbox by a watchdog process (``sleep``, then the kill),
not by the caller. The supervisor waits for the command, kills what it left running, lets the
output drain (1 s at most: an escaped process may hold the FIFO), then writes the status, so a
finished job's output is complete. Finished jobs are removed at each start past the newest
``keep``. Processes carry markers ``sandboxes-job-<id>`` (the command), ``-s`` (supervisor),
``-o`` (output), ``-w`` (watchdog), all under `sandboxes._kill.JOB_MARKER_PREFIX`.

Limits: a job lives as long as its sandbox's processes do. On Docker, SSH and Kubernetes that is
the container, host or pod; a `LocalSandbox` jail dies with the process holding the sandbox
(``bwrap --die-with-parent``), and so do its jobs (a restarted holder finds none: their ``/tmp``
was the jail's), and without the exec helper every local command is a jail of its own, so a job
cannot outlive its start there. Sandboxes sharing one SSH user (``isolation="none"``) share
``/tmp`` and so see each other's jobs. The per-sandbox cap on running jobs is checked in the
start script, so two starts at the same moment may both pass it.
"""

from __future__ import annotations

import base64
import binascii
import secrets
import shlex
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from sandboxes import _scripts
from sandboxes import protocol as p
from sandboxes._kill import JOB_MARKER_PREFIX, MARKER_ENV
from sandboxes._output import DEFAULT_OUTPUT_LIMIT
from sandboxes.base import BaseSandbox

__all__ = ["Job", "JobError", "JobNotFound", "JobRunner", "JobState", "TooManyJobs"]

State = Literal["running", "exited", "killed", "timeout", "lost", "failed"]

_ID_HEX = 32
_READ_CHUNK = 65536
_OPERATION_TIMEOUT = 60.0
_EXIT_NOT_FOUND = 10

# Shared by every script below: `alive DIR MARKER` (the supervisor of the job in DIR runs: its pid
# carries the supervisor's marker, so a reused pid is not mistaken for it), `finish DIR STATE
# CODE` (write the status if nobody did: `mkdir end` is the one atomic claim), `kill_job DIR
# MARKER STATE` (finish as STATE, kill the command's group while its supervisor is alive, so the
# group id is still the command's, then every process carrying the marker).
_FUNCTIONS = (
    _scripts.KILL_MARKED
    + r"""now() {
  _t=$(date +%s%N 2>/dev/null)
  case $_t in '' | *[!0-9]*) _t=$(date +%s)000000000 ;; esac
}
alive() {
  _p=
  { read -r _p < "$1/pid"; } 2>/dev/null
  [ -n "$_p" ] && grep -qsxzF -e "SANDBOXES_EXEC_ID=$2-s" "/proc/$_p/environ"
}
finish() {
  mkdir "$1/end" 2>/dev/null || return 1
  now
  printf '%s %s %s\n' "$2" "$3" "$_t" > "$1/status.new" && mv -f "$1/status.new" "$1/status"
}
kill_job() {
  finish "$1" "$3" -
  _c=
  { read -r _c < "$1/cpid"; } 2>/dev/null
  [ -n "$_c" ] && alive "$1" "$2" && kill -9 "-$_c" 2>/dev/null
  kill_marked "$2"
}
"""
)

_OUTPUT = r"""d=$1
read -r H T < "$d/limits"
f=$d/o.h lim=$H k=-1 size=0
: > "$f"
while :; do
  if [ "$size" -ge "$lim" ]; then
    k=$((k + 1)) f=$d/o.$k lim=$T size=0
    : > "$f"
    [ "$k" -lt 2 ] || rm -f -- "$d/o.$((k - 2))"
  fi
  n=$((lim - size))
  [ "$n" -le 65536 ] || n=65536
  dd bs="$n" count=1 2>/dev/null >> "$f" || break
  new=$(wc -c < "$f") || break
  new=$(($new))
  [ "$new" -ne "$size" ] || { : > "$d/o.done"; exit 0; }
  size=$new
done
: > "$d/o.done"
exec cat > /dev/null
"""
"""The output process, on the command's FIFO: one ``dd`` read (at most what fits) per round
into the head, then into tail chunks, the newest two kept. A failed write (the sandbox's tmp
is full) stops keeping output but never stops reading. ``o.done`` says it ended (or gave up
keeping); the supervisor waits for it."""

_WATCHDOG = (
    _FUNCTIONS
    + r"""sleep "$3"
kill_job "$1" "$2" timeout
"""
)

_SUPERVISOR = (
    _FUNCTIONS
    + f"OUTPUT={shlex.quote(_OUTPUT)}\nWATCHDOG={shlex.quote(_WATCHDOG)}\n"
    + r"""d=$1 m=$2 t=$3
now
printf '%s\n' "$_t" > "$d/started"
if [ "$4" = 1 ] && ! CDPATH= cd -- "$5" 2>/dev/null; then
  finish "$d" failed cwd
  echo $$ > "$d/pid"
  exit 0
fi
if ! mkfifo "$d/pipe"; then
  finish "$d" failed fifo
  echo $$ > "$d/pid"
  exit 0
fi
SANDBOXES_EXEC_ID=$m-o /bin/sh -c "$OUTPUT" sandboxes-job-output "$d" < "$d/pipe" &
o=$!
in=/dev/null
[ ! -e "$d/stdin" ] || in=$d/stdin
(
  set --
  while IFS= read -r l; do
    v=$(printf '%s\n' "$l" | base64 -d && printf x)
    set -- "$@" "${v%x}"
  done < "$d/env"
  x=$(cat "$d/cmd" && printf x)
  [ ! -e "$d/end" ] || exit 137
  exec setsid env -- "$@" "SANDBOXES_EXEC_ID=$m" /bin/sh -c "${x%x}"
) < "$in" > "$d/pipe" 2>&1 &
c=$!
echo "$c" > "$d/cpid"
echo $$ > "$d/pid.new" && mv -f "$d/pid.new" "$d/pid"
[ "$t" = 0 ] || SANDBOXES_EXEC_ID=$m-w /bin/sh -c "$WATCHDOG" sandboxes-job-watchdog "$d" "$m" "$t" \
  < /dev/null > /dev/null 2>&1 &
wait "$c"
s=$?
kill_marked "$m"
i=0
while [ ! -e "$d/o.done" ] && [ "$i" -lt 20 ]; do sleep 0.05; i=$((i + 1)); done
kill_marked "$m-o"
wait "$o"
finish "$d" exited "$s"
kill_marked "$m-w"
rm -f -- "$d/pipe"
"""
)

_START = (
    _FUNCTIONS
    + f"SUPERVISOR={shlex.quote(_SUPERVISOR)}\nP={JOB_MARKER_PREFIX}\n"
    + r"""r=${1:-${TMPDIR:-/tmp}/.sandboxes-jobs}
id=$2 H=$3 T=$4 t=$5 keep=$6 max=$7 c=$8 cwd=$9
shift 9
s=$1 E=$2 cmd=$3
for tool in setsid mkfifo dd base64 env; do
  command -v "$tool" > /dev/null 2>&1 || { echo "!tool $tool"; exit 21; }
done
mkdir -m 700 -- "$r" 2>/dev/null
[ -d "$r" ] && [ ! -L "$r" ] && [ -O "$r" ] || { echo "!root $r"; exit 22; }
n=0
for j in "$r"/*/pid; do
  [ -e "$j" ] || continue
  j=${j%/pid}
  [ -e "$j/status" ] || ! alive "$j" "$P${j##*/}" || n=$((n + 1))
done
[ "$n" -lt "$max" ] || { echo "!full $n"; exit 23; }
d=$r/$id
mkdir -m 700 -- "$d" || { echo "!mkdir"; exit 24; }
printf '%s %s\n' "$H" "$T" > "$d/limits" && printf '%s' "$cmd" > "$d/cmd" && : > "$d/env" || {
  rm -rf -- "$d"; echo "!write"; exit 24; }
if [ "$s" = 1 ] || [ "$E" -gt 0 ]; then
  cat > "$d/in" && head -c "$E" "$d/in" > "$d/env" || { rm -rf -- "$d"; echo "!write"; exit 24; }
  if [ "$s" = 1 ]; then tail -c "+$((E + 1))" "$d/in" > "$d/stdin" || { rm -rf -- "$d"; echo "!write"; exit 24; }; fi
  rm -f -- "$d/in"
fi
SANDBOXES_EXEC_ID=$P$id-s setsid /bin/sh -c "$SUPERVISOR" sandboxes-job "$d" "$P$id" "$t" "$c" "$cwd" \
  < /dev/null > /dev/null 2> "$d/log" &
i=0
while [ ! -e "$d/pid" ]; do
  i=$((i + 1))
  [ "$i" -le 2000 ] || { echo "!stuck"; exit 25; }
  sleep 0.01
done
set -- "$r"/*/status
n=$#
for f do
  [ "$n" -gt "$keep" ] && [ -e "$f" ] || break
  rm -rf -- "${f%/status}"
  n=$((n - 1))
done
echo "!ok"
"""
)
"""``ROOT ID H T TIMEOUT KEEP MAX HAS_CWD CWD HAS_STDIN ENV_BYTES COMMAND``, stdin: ENV_BYTES of
environment lines, then the job's stdin. Refuses (``!full``) when MAX jobs already run; returns
once the supervisor has started the command (its ``pid`` file), so a start that answered ``!ok``
ran, and one that did not answer may be checked with `JobRunner.list` before another try."""

_STATE = r"""st=
{ read -r st < "$d/status"; } 2>/dev/null
if [ -z "$st" ] && [ -e "$d/pid" ] && ! alive "$d" "$m"; then
  { read -r st < "$d/status"; } 2>/dev/null
  if [ -z "$st" ]; then
    kill_job "$d" "$m" lost
    kill_marked "$m-w"
    kill_marked "$m-o"
    { read -r st < "$d/status"; } 2>/dev/null
  fi
fi
s0=-
{ read -r s0 < "$d/started"; } 2>/dev/null
"""
"""``st``: the job's status line, empty while it runs; a job whose supervisor is gone without a
status is recorded ``lost`` (and whatever is left of its tree killed)."""

_POLL = (
    _FUNCTIONS
    + f"P={JOB_MARKER_PREFIX}\n"
    + r"""r=${1:-${TMPDIR:-/tmp}/.sandboxes-jobs}
d=$r/$2 m=$P$2 off=$3 left=$4
[ -d "$d" ] || exit 10
"""
    + _STATE
    + r"""read -r H T < "$d/limits"
printf '!j %s %s %s %s\n' "${st:-running - -}" "$s0" "$H" "$T"
seg() {
  sz=$({ wc -c < "$1"; } 2> /dev/null) || return 0
  a=$2 b=$(($2 + $sz))
  [ "$b" -gt "$off" ] && [ "$left" -gt 0 ] || return 0
  from=$a
  [ "$from" -ge "$off" ] || from=$off
  to=$b
  [ "$((to - from))" -le "$left" ] || to=$((from + left))
  left=$((left - (to - from)))
  printf '!s %s\n' "$from"
  tail -c "+$((from - a + 1))" "$1" 2> /dev/null | head -c "$((to - from))" | base64
}
seg "$d/o.h" 0
k=-1
for f in "$d"/o.[0-9]*; do
  [ -e "$f" ] || continue
  [ "${f##*/o.}" -le "$k" ] || k=${f##*/o.}
done
[ "$k" -lt 1 ] || seg "$d/o.$((k - 1))" "$((H + (k - 1) * T))"
[ "$k" -lt 0 ] || seg "$d/o.$k" "$((H + k * T))"
echo "!e"
"""
)
"""``ROOT ID OFFSET MAX``: the job's status line, then the kept output from stream position
OFFSET on, at most MAX bytes of it, as segments ``!s <position>`` followed by base64 lines."""

_KILL = (
    _FUNCTIONS
    + f"P={JOB_MARKER_PREFIX}\n"
    + r"""r=${1:-${TMPDIR:-/tmp}/.sandboxes-jobs}
d=$r/$2 m=$P$2
[ -d "$d" ] || exit 10
kill_job "$d" "$m" killed
i=0
while alive "$d" "$m" && [ "$i" -lt 200 ]; do
  sleep 0.05
  kill_marked "$m"
  i=$((i + 1))
done
"""
)
"""``ROOT ID``: finish the job as ``killed`` unless it ended already, kill its tree, and wait
(10 s at most) until its supervisor has ended, killing again what a race let start."""

_LIST = (
    _FUNCTIONS
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


class JobError(Exception):
    """A job operation failed; ``code`` is the protocol's error code."""

    def __init__(self, code: p.ErrorCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class JobNotFound(JobError):
    def __init__(self, job_id: str) -> None:
        super().__init__(p.FILE_NOT_FOUND, f"no job {job_id!r} in this sandbox")


class TooManyJobs(JobError):
    def __init__(self, running: int) -> None:
        super().__init__(p.INVALID_ARGUMENT, f"{running} background jobs already run in this sandbox (the maximum)")


@dataclass(frozen=True, slots=True)
class JobState:
    """What a job is doing, without its output."""

    id: str
    status: State
    exit_code: int | None = None
    reason: str | None = None
    """Why a ``failed`` job failed (``cwd``: its working directory is missing)."""
    started_ns: int | None = None
    ended_ns: int | None = None

    @property
    def finished(self) -> bool:
        return self.status != "running"

    @property
    def duration_ms(self) -> float | None:
        if self.started_ns is None or self.ended_ns is None:
            return None
        return max(0, self.ended_ns - self.started_ns) / 1e6


@dataclass(frozen=True, slots=True)
class Job:
    """A job's state and its output kept from some position on (`JobRunner.poll`).

    The output is the stream the command wrote, of which the sandbox keeps the first ``head``
    bytes and the last ``tail`` to ``2 * tail`` bytes; ``chunks`` are kept pieces as
    ``(position in the stream, bytes)``, in order."""

    state: JobState
    chunks: tuple[tuple[int, bytes], ...] = ()
    head: int = 0
    tail: int = 0

    @property
    def output(self) -> bytes:
        return b"".join(data for _, data in self.chunks)

    @property
    def end(self) -> int:
        """The stream position after the last byte returned: the offset to poll from next."""
        return self.chunks[-1][0] + len(self.chunks[-1][1]) if self.chunks else 0

    @property
    def dropped(self) -> int:
        """Bytes between the returned chunks that the sandbox no longer keeps."""
        gaps, position = 0, None
        for start, data in self.chunks:
            if position is not None and start > position:
                gaps += start - position
            position = start + len(data)
        return gaps

    def text(self) -> str:
        """The output as text, with a marker where bytes were dropped (as `OutputBuffer.text`)."""
        parts: list[str] = []
        position = None
        for start, data in self.chunks:
            if position is not None and start > position:
                parts.append(f"\n... [{start - position} bytes of output truncated] ...\n")
            parts.append(data.decode("utf-8", "replace"))
            position = start + len(data)
        return "".join(parts)

    def response(self) -> p.ExecuteResponse:
        """The job as a finished `execute` would have answered (only meaningful once finished)."""
        state = self.state
        output, truncated = self.text(), self.dropped > 0
        duration = state.duration_ms
        if state.status == "timeout":
            return p.ExecuteResponse(
                output,
                truncated=truncated,
                error=p.TIMEOUT,
                message="Command timed out; its process tree was killed",
                duration_ms=duration,
            )
        if state.status == "killed":
            return p.ExecuteResponse(
                output,
                truncated=truncated,
                message="Killed on request; its process tree was killed",
                duration_ms=duration,
            )
        if state.status == "lost":
            return p.ExecuteResponse(
                output,
                truncated=truncated,
                error=p.CONNECTION_LOST,
                message="The job's supervisor vanished (the sandbox restarted?); what was left of it was killed",
                duration_ms=duration,
            )
        if state.status == "failed":
            if state.reason == "cwd":
                return p.ExecuteResponse("", error=p.FILE_NOT_FOUND, message="The working directory does not exist")
            return p.ExecuteResponse("", error=p.BACKEND_ERROR, message=f"the job could not start ({state.reason})")
        return p.ExecuteResponse(output, exit_code=state.exit_code, truncated=truncated, duration_ms=duration)


class JobRunner:
    """Background jobs of one sandbox (see the module docstring). Stateless: any number of
    runners, in any processes, over handles to the same sandbox, see the same jobs."""

    def __init__(
        self,
        sandbox: BaseSandbox,
        *,
        root: str | None = None,
        keep: int = 64,
        max_running: int = 1 << 20,
        max_read: int = 64 << 20,
        operation_timeout: float = _OPERATION_TIMEOUT,
    ) -> None:
        self.sandbox = sandbox
        self.root = root or ""
        """Where the jobs' directories are; empty: ``${TMPDIR:-/tmp}/.sandboxes-jobs``."""
        self.keep = keep
        self.max_running = max_running
        self.max_read = max_read
        """Most output bytes one poll returns (and so holds in this process's memory)."""
        self.operation_timeout = operation_timeout

    def start(
        self,
        command: str,
        *,
        timeout: float | None = None,
        stdin: bytes | str | None = None,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        output_limit: int = DEFAULT_OUTPUT_LIMIT,
    ) -> JobState:
        """Start ``command`` detached; its id and state. ``timeout`` (seconds; ``None`` or 0:
        none) is enforced inside the sandbox; ``output_limit`` bytes of output are kept, head
        and tail. Raises `TooManyJobs` past ``max_running``, `JobError` if it could not start."""
        env_lines = b"".join(base64.b64encode(_env_entry(name, value)) + b"\n" for name, value in (env or {}).items())
        data = stdin.encode("utf-8") if isinstance(stdin, str) else stdin
        job_id = f"{time.time_ns():016x}{secrets.token_hex(8)}"
        tail = max(1, output_limit // 4)
        head = max(0, output_limit - 2 * tail)
        args = [
            self.root,
            job_id,
            str(head),
            str(tail),
            _seconds(timeout),
            str(self.keep),
            str(self.max_running),
            "0" if cwd is None else "1",
            cwd or "",
            "0" if data is None else "1",
            str(len(env_lines)),
            command,
        ]
        payload = env_lines + (data or b"") if data is not None or env_lines else None
        response = self._run(_bind(_START, *args), stdin=payload)
        last = response.output.strip().rsplit("\n", 1)[-1] if response.output.strip() else ""
        if response.exit_code == 0 and last == "!ok":
            return JobState(job_id, "running")
        if last.startswith("!full"):
            raise TooManyJobs(int(last.split()[1]))
        raise JobError(p.BACKEND_ERROR, f"the job could not start: {_failure(response)}")

    def poll(self, job_id: str, offset: int = 0, limit: int | None = None) -> Job:
        """The job's state and its kept output from stream position ``offset`` on, at most
        ``limit`` bytes (default: all that is kept)."""
        _check_id(job_id)
        if offset < 0:
            raise JobError(p.INVALID_ARGUMENT, "offset must be >= 0")
        wanted = self.max_read if limit is None else max(0, min(limit, self.max_read))
        bound = wanted * 4 // 3 + 4 * (wanted // 57 + 4) + 4096  # base64 and its lines, the headers
        response = self._run(_bind(_POLL, self.root, job_id, str(offset), str(wanted)), output_limit=bound)
        if response.exit_code == _EXIT_NOT_FOUND:
            raise JobNotFound(job_id)
        if response.exit_code != 0:
            raise JobError(p.BACKEND_ERROR, f"polling job {job_id} failed: {_failure(response)}")
        return _parse_poll(job_id, response.output)

    def kill(self, job_id: str) -> Job:
        """Kill the job's whole tree (unless it ended already) and answer its final state and
        output. Idempotent."""
        _check_id(job_id)
        response = self._run(_bind(_KILL, self.root, job_id))
        if response.exit_code == _EXIT_NOT_FOUND:
            raise JobNotFound(job_id)
        if response.exit_code != 0:
            raise JobError(p.BACKEND_ERROR, f"killing job {job_id} failed: {_failure(response)}")
        return self.poll(job_id)

    def list(self) -> list[JobState]:
        """Every job the sandbox still has, oldest first (finished ones until collected)."""
        response = self._run(_bind(_LIST, self.root))
        if response.exit_code != 0:
            raise JobError(p.BACKEND_ERROR, f"listing jobs failed: {_failure(response)}")
        states = []
        for line in response.output.splitlines():
            if line.startswith("!j "):
                fields = line.split()
                if len(fields) == 6:
                    states.append(_state(fields[1], fields[2:5], fields[5]))
        return states

    def _run(self, command: str, stdin: bytes | None = None, output_limit: int = 1 << 20) -> p.ExecuteResponse:
        """One round trip; its output bounded (everything a sandbox answers is untrusted)."""
        response = self.sandbox.execute(
            command, stdin=stdin, timeout=self.operation_timeout, output_limit=output_limit, env={}
        )
        if response.error is not None:
            raise JobError(response.error, response.message or f"the sandbox answered {response.error}")
        return response


def _bind(script: str, *args: str) -> str:
    """``script`` with ``args`` as ``$1..$n``, each quoted (as `sandboxes._scripts.command`,
    without its prelude: its ``LC_ALL=C`` would reach the job's environment)."""
    return f"set -- {' '.join(shlex.quote(arg) for arg in args)}\n{script}"


def _env_entry(name: str, value: str) -> bytes:
    if not name or "=" in name or "\0" in name or "\0" in value:
        raise JobError(p.INVALID_ARGUMENT, f"invalid environment variable {name!r}")
    if name == MARKER_ENV:
        raise JobError(p.INVALID_ARGUMENT, f"{MARKER_ENV} is the job's own marker")
    return f"{name}={value}".encode()


def _seconds(timeout: float | None) -> str:
    if not timeout or timeout <= 0:
        return "0"
    return f"{timeout:.3f}".rstrip("0").rstrip(".")


def _check_id(job_id: str) -> None:
    if len(job_id) != _ID_HEX or any(c not in "0123456789abcdef" for c in job_id):
        raise JobNotFound(job_id)


def _failure(response: p.ExecuteResponse) -> str:
    return f"exit {response.exit_code}: {response.output.strip()[-300:] or 'no output'}"


def _int(text: str) -> int | None:
    return int(text) if text.isdigit() else None


def _state(job_id: str, status: list[str], started: str) -> JobState:
    """A `JobState` from a status line's words (``STATE CODE ENDED``) and the start time."""
    word, code, ended = status
    kind = _STATES.get(word, "lost")
    return JobState(
        job_id,
        kind,
        exit_code=_int(code) if kind == "exited" else None,
        reason=code if kind == "failed" else None,
        started_ns=_int(started),
        ended_ns=_int(ended),
    )


_STATES: dict[str, State] = {state: state for state in ("running", "exited", "killed", "timeout", "lost", "failed")}


def _parse_poll(job_id: str, output: str) -> Job:
    lines = output.split("\n")
    header = lines[0].split() if lines else []
    if len(header) != 7 or header[0] != "!j" or lines[-2:] != ["!e", ""]:
        raise JobError(p.BACKEND_ERROR, f"unexpected answer polling job {job_id}: {output[-300:]!r}")
    state = _state(job_id, header[1:4], header[4])
    chunks: list[tuple[int, bytes]] = []
    position: int | None = None
    encoded: list[str] = []
    for line in [*lines[1:-2], "!s end"]:
        if not line.startswith("!s "):
            encoded.append(line)
            continue
        if position is not None:
            try:
                data = base64.b64decode("".join(encoded))
            except (binascii.Error, ValueError) as exc:
                raise JobError(p.BACKEND_ERROR, f"corrupt output of job {job_id}") from exc
            if data:
                chunks.append((position, data))
        position, encoded = _int(line[3:]), []
    return Job(state, tuple(chunks), head=int(header[5]), tail=int(header[6]))
