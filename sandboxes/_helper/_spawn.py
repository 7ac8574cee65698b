"""Starting a command's shell, for the exec helper (`_server`): stdlib only, Python
3.6-compatible.

Two ways. Cold (`spawn`): ``/bin/sh -c command``, started when the command arrives. Warm
(`WarmShell`): a ``/bin/sh -s`` the helper started once an earlier command like it was answered,
waiting for this one on its stdin. Starting a shell is mostly exec and dynamic linking, not fork, so a
shell started ahead of time takes that out of the command's latency.

Which commands run warm (`warm_script`, `Spares.take`): only where ``/bin/sh`` is dash, for a
command without stdin, in the same working directory (the same directory, not just the same
name: one deleted and made again meanwhile is another) and with the same environment as the
shell was started with, its marker included (fixed when the shell started: a caller that marks
its commands itself announces each marker a command ahead, `_command._next_key`), and at most
`WARM_LIMIT` bytes long. Every other runs cold.

Why it then behaves as ``sh -c`` does: dash reads its input in blocks of 8 KiB, and the whole
script arrives in one atomic pipe write (at most ``PIPE_BUF``), so the shell's first read takes
all of it, and its stdin is at its end before the first command runs. The script starts, on the
command's first line, with ``exec </dev/null; set +s; trap - INT;``: the command's stdin is
/dev/null as a cold one's is, ``$-`` loses the ``s`` that ``-s`` put there, and SIGINT is caught
as in a ``-c`` shell (dash decides that at its start from ``-c``, and again on ``trap``). Line
numbers, ``$0`` (``/bin/sh``), the error messages (``/bin/sh: 1: foo: not found``), exit codes,
the environment, the session and the signal dispositions are then a cold command's. What differs
is its ``/proc/<pid>/cmdline`` (``/bin/sh -s``, not the command). That the shell reads so is
checked once per shell program (`PROBE`), not assumed from its name: a shell that reads less at
once would lose the rest of the script to the /dev/null it was just given (dash built with musl
reads 1 KiB at a time; bash, as POSIX asks, a byte), and one that fails the probe leaves every
command cold.

A command that is exactly ``exec /bin/bash -l -c WORD`` (a login shell running WORD, as E2B's
envd starts every command) runs warm too where ``/bin/bash`` is bash: in a waiting
``/bin/bash -l -c LOGIN_BOOT``, which has read the login files already and waits to read WORD
whole from its stdin (its ``read`` takes every byte to the end, so no atomic read is needed),
then makes /dev/null its stdin and ``eval``s it. Environment, working directory, umask, ``$0``,
``$-``, line numbers, run-time error messages and exit codes are then the cold command's; the login
files' effects are the cold command's as long as they are unchanged, so such a shell is used only
while ``/etc/profile``, ``/etc/profile.d`` and its files, ``/etc/bash.bashrc`` and the home's
``.bash_profile``, ``.bash_login``, ``.profile`` and ``.bashrc`` are the very files (device, inode,
size, mtime and ctime) they were when it started (`login_stamp`); any other file a profile reads
is not watched. What differs: a syntax error is reported as ``bash: eval: line N`` rather than
``bash: -c: line N``, ``BASH_EXECUTION_STRING`` and ``/proc/<pid>/cmdline`` are the bootstrap's,
the login files run before the command came (with the script's pipe as their stdin, not
/dev/null), and their output, if any, comes first all the same.

A waiting shell holds its working directory, as the helper holds the last command's: a file
system mounted there cannot be unmounted (EBUSY) while it waits, only lazily (``umount -l``).

A waiting shell runs as the sandbox's user, like its commands, so a command can reach the shell
its successor will run in (reopen its stdin through /proc, or ptrace it where that is allowed),
as it can reach its successor through the files they share: a sandbox is one tenant's, and the
waiting shells are inside it. Nothing outside the sandbox is reachable through them.
"""

import os
import select
import sys
import time

from ._kill import MARKER_ENV

TYPE_CHECKING = False
if TYPE_CHECKING:  # mypy only: `typing` is not imported in the sandbox
    import signal
    from collections.abc import Callable
    from typing import Any

    WarmKey = tuple[dict[str, str], str | None, str]  # (env, cwd, kind) a shell is started for
else:  # the C module behind `signal` (which imports `enum`), with the same calls and numbers
    import _signal as signal

_POSIX_SPAWN = sys.version_info >= (3, 8) and hasattr(os, "posix_spawn")  # setsid= came in 3.8
_DEFAULT_SIGNALS = [getattr(signal, name) for name in ("SIGPIPE", "SIGXFZ", "SIGXFSZ") if hasattr(signal, name)]
_DASH = os.path.basename(os.path.realpath("/bin/sh")) == "dash"
_BASH = os.path.isfile("/bin/bash") and os.path.basename(os.path.realpath("/bin/bash")) == "bash"
LOGIN_PREFIX = "exec /bin/bash -l -c "
LOGIN_BOOT = (
    'IFS= read -r -d "" _SANDBOXES_LOGIN; exec </dev/null; eval "unset _SANDBOXES_LOGIN; SECONDS=0; $_SANDBOXES_LOGIN"'
)
"""What a waiting login shell runs: its command read whole (to the end of its stdin), stdin
then /dev/null as a cold command's, the variable gone and ``SECONDS`` from 0 as the command runs."""
SH = "sh"
LOGIN = "login"
"""The kinds of waiting shells: ``/bin/sh -s``, and a bash login shell (`LOGIN_BOOT`)."""
_LOGIN_FILES = ("/etc/profile", "/etc/bash.bashrc", "/etc/profile.d")
_HOME_FILES = ("/.bash_profile", "/.bash_login", "/.profile", "/.bashrc")
WARM_PREFIX = b"exec </dev/null; set +s; trap - INT; "
SPARES = 2
"""Shells kept waiting. Two: a program running commands one after another sends the next one
about as soon after an answer as a shell takes to start, so the shell started after that answer
is often not ready yet, and the one started an answer earlier is."""
WARM_LIMIT = 4096
"""Bytes of a warm shell's script, prefix included: ``PIPE_BUF``, the most one atomic write puts
in a pipe whole, well below the 8 KiB dash reads at once."""
_PROBE_START = WARM_PREFIX + b"read x || echo ok\n#"
_PROBE_END = b'\necho "[$-]"\n'
PROBE = _PROBE_START + b"x" * (WARM_LIMIT - len(_PROBE_START) - len(_PROBE_END)) + _PROBE_END
PROBE_ANSWER = b"ok\n[]\n"
"""What `PROBE` prints in a shell that knows ``set +s`` (bash refuses it) and whose first read
takes a whole script: PROBE's first line switches stdin to /dev/null, and its last line ends at
byte `WARM_LIMIT` (dash built with musl reads 1 KiB at a time, and would lose it). Run once in
the first shell of each shell program (`Spares.trusted`)."""
PROBE_WAIT = 0.5
"""Seconds the helper waits for the probe's answer, serving nothing else meanwhile (a healthy
shell answers within a few ms). No answer by then, or a shell killed meanwhile, is no verdict:
the next top-up probes again, at most `PROBE_TRIES` times in all."""
PROBE_TRIES = 3
try:  # where commands without a cwd run; O_PATH needs no read permission (run_as, a 0700 home)
    _home: "int | None" = os.open(".", getattr(os, "O_PATH", os.O_RDONLY))
except OSError:
    _home = None


def enter_cwd(cwd: "str | None") -> None:
    """Make ``cwd`` the helper's working directory, which its children inherit (raises as the
    command's start would fail: a missing or unreadable directory). No cwd, or a relative one:
    from where the helper started, as with Popen."""
    if cwd and cwd.startswith("/"):
        os.chdir(cwd)
        return
    if _home is not None:
        os.fchdir(_home)
    if cwd:
        os.chdir(cwd)


def _here() -> "tuple[int, int]":
    """The working directory's identity: a directory deleted and made again is another."""
    info = os.stat(".")
    return info.st_dev, info.st_ino


def spawn(
    args: "list[str]", env: "dict[str, str]", with_stdin: bool, program: str = "/bin/sh"
) -> "tuple[int, int, int, int | None]":
    """(pid, stdout fd, stderr fd, stdin fd or None) of ``program`` + ``args`` in a new session,
    in the helper's working directory (the caller enters the command's first: `enter_cwd`).

    posix_spawn (vfork + exec in C) where Python has it, without Popen's Python per start.
    The helper's own fds are all close-on-exec (PEP 446) and 0-2 are replaced, so nothing leaks."""
    out_r, out_w = os.pipe()
    in_r: "int | None" = None
    in_w: "int | None" = None
    err_r: "int | None" = None
    err_w: "int | None" = None
    try:
        err_r, err_w = os.pipe()
        if with_stdin:
            in_r, in_w = os.pipe()
        argv = [program, *args]
        if _POSIX_SPAWN:
            # novermin below: Python 3.8's, and only where `_POSIX_SPAWN` says it has them
            stdin: "tuple[Any, ...]" = (  # novermin
                (os.POSIX_SPAWN_DUP2, in_r, 0) if with_stdin else (os.POSIX_SPAWN_OPEN, 0, "/dev/null", os.O_RDONLY, 0)
            )
            actions = [stdin, (os.POSIX_SPAWN_DUP2, out_w, 1), (os.POSIX_SPAWN_DUP2, err_w, 2)]  # novermin
            pid = os.posix_spawn(  # novermin
                program, argv, env, file_actions=actions, setsid=True, setsigdef=_DEFAULT_SIGNALS, setsigmask=()
            )
        else:
            import subprocess

            proc = subprocess.Popen(
                argv,
                stdin=in_r if with_stdin else subprocess.DEVNULL,
                stdout=out_w,
                stderr=err_w,
                env=env,
                start_new_session=True,
            )
            proc.returncode = 0  # reaped by the helper: Popen must never wait for this pid (it may be reused)
            pid = proc.pid
    except BaseException:
        for fd in (out_r, err_r, in_w):
            if fd is not None:
                os.close(fd)
        raise
    finally:
        os.close(out_w)
        if err_w is not None:
            os.close(err_w)
        if in_r is not None:
            os.close(in_r)
    if in_w is not None:
        os.set_blocking(in_w, False)
    return pid, out_r, err_r, in_w


def has_exited(pid: int) -> bool:
    """Whether the child ``pid`` has exited (it is not reaped: WNOWAIT)."""
    try:
        info = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        return False
    return info is not None and bool(info.si_pid)


def plain_env(env: object) -> bool:
    """Whether ``env`` (an R frame's, so the client's word) is a dict of strings, as a shell
    started for it needs (a malformed one: the cold start reports it)."""
    if not isinstance(env, dict):
        return False
    return all(isinstance(key, str) and isinstance(value, str) for key, value in env.items())


def warm_script(command: str, env: object, with_stdin: bool) -> "tuple[str, bytes] | None":
    """(kind, script): what kind of warm shell would run ``command``, given which script (see
    the module docstring), or None: it must run cold."""
    if with_stdin or not plain_env(env):
        return None
    word = login_word(command)
    kind, script = (SH, WARM_PREFIX + os.fsencode(command)) if word is None else (LOGIN, os.fsencode(word))
    if len(script) > WARM_LIMIT or b"\0" in script:  # a NUL: the cold start's own error
        return None
    return kind, script


def login_word(command: str) -> "str | None":
    """WORD if ``command`` is exactly ``exec /bin/bash -l -c WORD``, WORD quoted as
    ``shlex.quote`` quotes it (so one word of the shell, whose value is WORD); else None."""
    if not command.startswith(LOGIN_PREFIX) or len(command) > 2 * WARM_LIMIT:
        return None
    from shlex import quote

    rest = command[len(LOGIN_PREFIX) :]
    word = rest[1:-1].replace("'\"'\"'", "'") if len(rest) > 1 and rest[0] == rest[-1] == "'" else rest
    return word if quote(word) == rest else None


def login_stamp(env: "dict[str, str]") -> "tuple[object, ...]":
    """The identity of every login file a ``bash -l`` started with ``env`` reads (see the
    module docstring): equal stamps, the same files."""
    paths = list(_LOGIN_FILES)
    try:
        paths += ["/etc/profile.d/" + name for name in sorted(os.listdir("/etc/profile.d"))]
    except OSError:
        pass
    home = env.get("HOME")
    if home:
        paths += [home + name for name in _HOME_FILES]
    stamp: "list[object]" = []
    for path in paths:
        try:
            info = os.stat(path)
        except OSError:
            stamp.append(None)
            continue
        stamp.append((info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns))
    return tuple(stamp)


class WarmShell(object):
    """A ``/bin/sh -s`` (or, of kind `LOGIN`, a ``/bin/bash -l -c LOGIN_BOOT``) waiting for its
    command, started with what an earlier command was given (``spec_env``, ``cwd``); one of the
    helper's ``leaders`` while it waits, so that no sweep takes it for an orphan, and so that its
    death is seen (`exited`: a command killed it)."""

    def __init__(
        self,
        env: "dict[str, str]",
        spec_env: "dict[str, str]",
        cwd: "str | None",
        marker: str,
        leaders: "dict[int, Any]",
        kind: str = SH,
    ) -> None:
        self.spec_env = spec_env
        self.cwd = cwd
        self.kind = kind
        self.marker = marker
        self.leaders = leaders
        self.reaped = False
        enter_cwd(cwd)
        self.here = _here()
        self.out_fd: "int | None"
        self.err_fd: "int | None"
        self.script_fd: "int | None"
        self.env = env
        if kind == LOGIN:
            self.stamp = login_stamp(env)  # before bash reads them: a change meanwhile is seen
            started = spawn(["-l", "-c", LOGIN_BOOT], env, True, "/bin/bash")
        else:
            started = spawn(["-s"], env, True)
        self.pid, self.out_fd, self.err_fd, self.script_fd = started
        leaders[self.pid] = self

    def made_for(self, spec_env: "dict[str, str]", cwd: "str | None", kind: str = SH) -> bool:
        return self.kind == kind and self.cwd == cwd and self.spec_env == spec_env

    def current(self) -> bool:
        """Whether what the shell read before its command is still what a cold start would read."""
        return self.kind != LOGIN or self.stamp == login_stamp(self.env)

    def program(self) -> "tuple[int, int] | None":
        """(device, inode) of the program the shell runs, or None if /proc cannot tell."""
        try:
            info = os.stat("/proc/%d/exe" % self.pid)
        except OSError:
            return None
        return info.st_dev, info.st_ino

    def probe(self) -> "bool | None":
        """True if the shell answers `PROBE` with `PROBE_ANSWER`; False if it answers otherwise
        and then exits by itself (a shell that cannot run warm commands); None, no verdict: it
        took no script, died by a signal, or did not answer within `PROBE_WAIT` seconds. Uses
        the shell up (reaped here when it exited)."""
        deadline = time.monotonic() + PROBE_WAIT
        if not self.hand(PROBE):
            return None
        poller = select.poll()
        assert self.out_fd is not None
        poller.register(self.out_fd, select.POLLIN)
        answer = b""
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not poller.poll(left * 1000):
                return None
            chunk = os.read(self.out_fd, 4096)
            if not chunk:
                break
            answer += chunk
            if len(answer) > len(PROBE_ANSWER):
                break
        while not self.has_exited():  # its output ended: it is exiting
            if time.monotonic() >= deadline:
                return None
            time.sleep(0.001)
        status = self.reap()
        if answer == PROBE_ANSWER:
            return True
        return None if status is None or os.WIFSIGNALED(status) else False

    def hand(self, script: bytes) -> bool:
        """Give the shell its script (one write, whole), then its end; False if it could not
        take it: it died waiting, and never read a byte."""
        if self.script_fd is None:
            return False
        try:
            written = os.write(self.script_fd, script)
        except OSError:
            return False
        if written != len(script):  # cannot happen to an atomic write into an empty pipe
            return False
        os.close(self.script_fd)
        self.script_fd = None
        return True

    def has_exited(self) -> bool:
        return has_exited(self.pid)

    def reap(self) -> "int | None":
        """Wait for the shell (exited, or killed: it ends at once) and forget it; its status."""
        status: "int | None"
        try:
            _, status = os.waitpid(self.pid, 0)
        except ChildProcessError:  # cannot happen: only this reaps it
            status = None
        self.reaped = True
        del self.leaders[self.pid]
        return status

    def exited(self) -> None:
        """It died waiting (a command's ``kill -9 -1``): reaped now, dropped by `Spares`."""
        self.discard()

    def discard(self) -> None:
        """Kill and reap the shell (a waiting dash dies at once), and close its pipes."""
        if not self.reaped:
            try:
                os.killpg(self.pid, signal.SIGKILL)
            except OSError:
                pass
            self.reap()
        for fd in (self.out_fd, self.err_fd, self.script_fd):
            if fd is not None:
                os.close(fd)
        self.out_fd = self.err_fd = self.script_fd = None


class Spares(object):
    """The shells waiting for commands, at most `SPARES`, oldest first, each for the environment
    and working directory it was started with.

    Once a command that could run warm, or one that announced its caller's next marker, is
    answered (in the turn of the helper's loop that wrote the answer, after it), shells are
    started for the next one like it (`_command._next_key`, `top_up`): one, or `SPARES` when the
    command before it was alike too (never for a marker, which is one command's). Not while that command runs: a start
    holds the helper (posix_spawn returns once the shell has exec'd) just when the command's
    output is likely to end, and in a sandbox of one CPU the shell's start competes with the
    command. Room is made by ending the
    oldest shell made for something else, so that commands alternating between two directories
    keep one shell each instead of ending and starting shells for every command."""

    def __init__(
        self, leaders: "dict[int, Any]", env_for: "Callable[[dict[str, str]], tuple[dict[str, str], str]]"
    ) -> None:
        self.leaders = leaders
        self.env_for = env_for  # spec_env -> (the shell's environment, its marker)
        self.enabled = _DASH  # False for good once a shell failed the probe (`trusted`)
        self.login = _BASH  # where /bin/bash is bash: login commands may run warm
        self.proven: "tuple[int, int] | None" = None  # `WarmShell.program` of the shell that passed it
        self.tries = 0  # probes without a verdict
        self.shells: "list[WarmShell]" = []
        self.wanted: "WarmKey | None" = None  # `_command._next_key` of the last command answered that foresaw one
        self.last: "WarmKey | None" = None  # the one before it

    def usable(self, kind: str) -> bool:
        return self.login if kind == LOGIN else self.enabled

    def take(
        self, warm: "tuple[str, bytes] | None", spec_env: "dict[str, str]", cwd: "str | None"
    ) -> "WarmShell | None":
        """A shell now running the script of ``warm`` (`warm_script`; None: the command runs
        cold), or None: no shell fits, and the command runs cold. The helper is in ``cwd``
        (`enter_cwd`)."""
        if warm is None or not self.usable(warm[0]) or not self.shells:
            return None
        kind, script = warm
        try:
            here = _here()
        except OSError:  # the cold start reports it
            return None
        for shell in list(self.shells):
            if shell.reaped or not shell.made_for(spec_env, cwd, kind):
                continue
            self.shells.remove(shell)
            if shell.here == here and shell.current() and shell.hand(script):
                return shell
            shell.discard()  # its directory was deleted (and made again), or it died waiting
        return None

    def top_up(self) -> None:
        """Start the shells the next command may take (see the class docstring)."""
        wanted, self.wanted = self.wanted, None
        if wanted is None:
            return
        spec_env, cwd, kind = wanted
        # One for a marker (announced for one command), which may be announced more than once.
        target = SPARES if wanted == self.last and MARKER_ENV not in spec_env else 1
        self.last = wanted
        self.drop(lambda shell: shell.reaped or not shell.current())
        ready = sum(1 for shell in self.shells if shell.made_for(spec_env, cwd, kind))
        for _ in range(target - ready + 1):  # one more: a probe may use one up
            if ready >= target or not self.usable(kind):
                return
            if len(self.shells) >= SPARES:
                others = [shell for shell in self.shells if not shell.made_for(spec_env, cwd, kind)]
                if not others:
                    return
                self.drop(lambda shell: shell is others[0])  # noqa: B023 (called within this turn)
            try:
                env, marker = self.env_for(spec_env)
                shell = WarmShell(env, spec_env, cwd, marker, self.leaders, kind)
            except Exception:  # no pid left, a cwd gone: the next command runs cold, and says why
                return
            if kind == LOGIN or self.trusted(shell):
                self.shells.append(shell)
                ready += 1

    def trusted(self, shell: WarmShell) -> bool:
        """Whether ``shell`` runs the program that passed `PROBE`. A program not seen yet (the
        first shell; /bin/sh replaced since) is probed with this shell, which that uses up; a
        wrong answer, or `PROBE_TRIES` without a verdict, ends warm starts for this helper:
        every command runs cold."""
        program = shell.program()
        if program is not None and program == self.proven:
            return True
        verdict = shell.probe() if program is not None else None
        shell.discard()
        if verdict:
            self.proven = program
            return False
        self.tries += 1
        if verdict is False or self.tries >= PROBE_TRIES:
            self.enabled = False
            self.drop(lambda other: other.kind == SH)
        return False

    def drop(self, which: "Callable[[WarmShell], bool]") -> None:
        for shell in [shell for shell in self.shells if which(shell)]:
            self.shells.remove(shell)
            shell.discard()
