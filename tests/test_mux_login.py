"""Login shells started ahead of their command (`sandboxes._helper._spawn`, kind ``login``): the
real helper over a pipe. ``exec /bin/bash -l -c WORD`` (what the E2B API runs for every command)
runs, after a command like it, in a waiting ``bash -l`` that read the login files already; it must
answer as the same command run cold, and a login file changed meanwhile must be seen."""

from __future__ import annotations

import os
import shlex
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from support import needs
from test_mux import _PipeStream, _run

from sandboxes import protocol as p
from sandboxes._helper._spawn import LOGIN_BOOT, login_word
from sandboxes._mux import MuxClient

COLD = {"SANDBOXES_EXEC_ID": "cold-on-purpose"}
"""A caller's marker that was never announced: the command runs cold (see test_mux_spawn)."""
WHICH = "tr '\\0' ' ' </proc/$$/cmdline"
"""What the command's shell was started as: the bootstrap when warm."""
WARM = f"/bin/bash -l -c {LOGIN_BOOT} "


def _login(command: str) -> str:
    return "exec " + shlex.join(["/bin/bash", "-l", "-c", command])


@pytest.fixture
def client(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Iterator[MuxClient]:
    """A helper whose login shells read a home of their own, empty: the host user's login files
    (a ``pyenv rehash`` racing other test workers, say) would make a cold run answer differently."""
    needs(os.path.basename(os.path.realpath("/bin/bash")) == "bash", "these tests need /bin/bash")
    monkeypatch.setenv("HOME", str(tmp_path_factory.mktemp("login-home")))
    stream = _PipeStream()
    yield MuxClient(stream)
    stream.close()


def _warm(client: MuxClient, command: str, **overrides: object) -> p.ExecuteResponse:
    """``command`` as a login shell's, right after one like it: in a waiting shell (checked)."""
    assert _run(client, _login(WHICH), **overrides).exit_code == 0
    assert _run(client, _login(WHICH), **overrides).output == WARM
    return _run(client, _login(command), **overrides)


def test_only_exactly_a_login_shell_of_one_quoted_word_is_recognised() -> None:
    assert login_word(_login("echo 'a b' \"$x\"")) == "echo 'a b' \"$x\""
    assert login_word(_login("true")) == "true"
    for word in ("", "'", "it's $x", 'a"b', "x" * 4000):
        assert login_word(_login(word)) == word
    assert login_word("exec /bin/bash -l -c true; echo more") is None
    assert login_word("exec /bin/bash -l -c 'a' 'b'") is None
    assert login_word('exec /bin/bash -l -c "true"') is None  # not as shlex.quote quotes it
    assert login_word("exec /bin/bash -l -c 'unterminated") is None
    assert login_word("/bin/bash -l -c true") is None
    assert login_word("exec /bin/bash -l -c a b") is None
    assert login_word("exec /bin/bash -l -c $x") is None


def test_a_login_command_after_one_like_it_runs_in_a_waiting_login_shell(client: MuxClient) -> None:
    assert _run(client, _login(WHICH)).output == f"/bin/bash -l -c {WHICH} "  # nothing waited for the first
    assert [_run(client, _login(WHICH)).output for _ in range(3)] == [WARM] * 3
    assert _run(client, _login(WHICH), env=COLD).output == f"/bin/bash -l -c {WHICH} "
    assert _run(client, _login(WHICH), stdin=b"").output == f"/bin/bash -l -c {WHICH} "


SAME_AS_COLD = [
    "foo",
    'echo "[$-] [$0] [$#] [$LINENO] [$SHLVL]"; shopt login_shell',
    "exit 3",
    'read x; echo "[$x] $?"',
    "cat; echo done",
    "readlink /proc/self/fd/0",
    "trap 'echo bye' EXIT; echo hi",
    "kill -9 $$",
    "umask; pwd; ulimit -n",
    "set -e; false; echo no",
    "cat <<EOF\nline $LINENO\nEOF\necho $LINENO",
    "echo a\nfoo\necho $LINENO",
    "env | sort | sed 's/^SANDBOXES_EXEC_ID=.*/the marker/'",
    # (but $_ and SECONDS, which differ: see `sandboxes._helper._spawn`)
    "declare -p | grep -v -e SANDBOXES_EXEC_ID= -e BASH_EXECUTION_STRING -e BASH_ARGV -e ' _=' -e ' SECONDS'",
    "alias; shopt -p; set -o; trap -p",
    "return 4",
    "echo 'it'\"'\"'s' $'\\t' \"$HOME\"",
    "[ $(ps -o pgid= -p $$) = $$ ] && [ $(ps -o sid= -p $$) = $$ ] && echo its own group and session",
]


@pytest.mark.parametrize("command", SAME_AS_COLD)
def test_a_warm_login_command_answers_as_the_same_command_run_cold(client: MuxClient, command: str) -> None:
    warm = _warm(client, command)
    cold = _run(client, _login(command), env=COLD)
    assert (_apart(warm.output), warm.exit_code, warm.error) == (_apart(cold.output), cold.exit_code, cold.error)


def _apart(output: str) -> tuple[list[str], list[str]]:
    """The shell's own messages (on stderr) apart from the other lines, each in its order: the
    two pipes have no order between them (a CI run read a cold ``foo``'s message last)."""
    lines = output.splitlines(keepends=True)
    said = [line for line in lines if line.startswith("/bin/bash: ")]
    return [line for line in lines if not line.startswith("/bin/bash: ")], said


def test_a_syntax_error_differs_only_in_the_shells_word_for_where_it_was(client: MuxClient) -> None:
    warm = _warm(client, "echo a; if")
    cold = _run(client, _login("echo a; if"), env=COLD)
    assert (warm.exit_code, cold.exit_code) == (2, 2)
    assert warm.output == cold.output.replace("/bin/bash: -c: line", "/bin/bash: eval: line")


def _read_by_a_waiting_shell(home: Path, answered: int) -> None:
    """Wait until the login files were read once more than by the ``answered`` commands: by a
    shell now waiting for the next command."""
    deadline = time.monotonic() + 10
    while len((home / "read").read_text().splitlines()) <= answered:
        assert time.monotonic() < deadline, "no shell read the login files ahead of a command"
        time.sleep(0.01)


def test_a_login_file_changed_while_a_shell_waits_is_seen_by_the_next_command(
    client: MuxClient, tmp_path: Path
) -> None:
    home = tmp_path / "home"
    home.mkdir()
    env = {"HOME": str(home)}
    profile = home / ".profile"
    profile.write_text('echo >>"$HOME/read"; export FROM_PROFILE=one\n')
    assert _warm(client, "echo $FROM_PROFILE", env=env).output == "one\n"
    _read_by_a_waiting_shell(home, 3)
    profile.write_text('echo >>"$HOME/read"; export FROM_PROFILE=two\n')  # the same size
    assert _run(client, _login("echo $FROM_PROFILE"), env=env).output == "two\n"
    assert _run(client, _login("echo $FROM_PROFILE; " + WHICH), env=env).output == "two\n" + WARM
    answered = len((home / "read").read_text().splitlines())
    _read_by_a_waiting_shell(home, answered)
    (home / ".bash_profile").write_text("export FROM_PROFILE=three\n")  # a file that was not there
    assert _run(client, _login("echo $FROM_PROFILE"), env=env).output == "three\n"


def test_a_profile_that_reads_its_stdin_or_exits_still_runs_the_command_or_not_as_cold(
    client: MuxClient, tmp_path: Path
) -> None:
    home = tmp_path / "home"
    home.mkdir()
    env = {"HOME": str(home)}
    (home / ".profile").write_text('[ -n "$STOP" ] && exit 7\n')
    assert _warm(client, "echo ran", env=env).output == "ran\n"
    stopped = {**env, "STOP": "1"}
    answers = [_run(client, _login("echo ran"), env=stopped) for _ in range(3)]  # its shells die waiting
    assert [(a.output, a.exit_code) for a in answers] == [("", 7)] * 3
    direct = subprocess.run(
        ["/bin/bash", "-l", "-c", "echo ran"], env={**os.environ, **stopped}, capture_output=True, check=False
    )
    assert direct.returncode == 7
