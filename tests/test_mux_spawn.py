"""Shells started ahead of their command (`sandboxes._helper._spawn`): the real helper over a pipe.

A command that may run warm runs in a waiting ``/bin/sh -s`` when one fits it, and must then be
indistinguishable from the same command run cold (``/bin/sh -c``), but for its cmdline."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from support import needs
from test_mux import _VARIANTS, _exchange, _gone, _PipeStream, _run

from sandboxes import protocol as p
from sandboxes._helper._kill import kill_marked
from sandboxes._mux import SERVER_SOURCE, MuxClient
from sandboxes._mux.client import wire_spec

WARM = "/bin/sh -s"
COLD = {"SANDBOXES_EXEC_ID": "cold-on-purpose"}
"""A caller's marker not handed out by `MuxClient.marker` (so not announced): a waiting shell's
environment was fixed before the command came, so the command runs cold, and prints the same as
warm (these tests never print the marker)."""
PROBE = "tr '\\0' ' ' </proc/$$/cmdline | cut -c1-10"
"""What the command's own shell was started as: ``/bin/sh -s`` when warm."""
WARM_ARGS = "tr '\\0' '\\n' </proc/$$/cmdline | grep -cx -- -s; true"
"""1 when the command's shell was started with ``-s`` (warm), 0 otherwise, whatever its argv[0]."""
SPARES = (
    "for d in /proc/[0-9]*; do [ \"$(cut -d' ' -f4 $d/stat 2>/dev/null)\" = $PPID ] && [ ${d#/proc/} != $$ ]"
    " && grep -qxz -- -s $d/cmdline 2>/dev/null && echo ${d#/proc/}; done"
)
"""Pids of the helper's other waiting shells (this command's parent is the helper)."""


@pytest.fixture
def client() -> Iterator[MuxClient]:
    assert os.path.basename(os.path.realpath("/bin/sh")) == "dash", "these tests need /bin/sh to be dash"
    stream = _PipeStream()
    yield MuxClient(stream)
    stream.close()


def _warm(client: MuxClient, command: str, **overrides: object) -> p.ExecuteResponse:
    """``command`` run right after a command like it: in a waiting shell (checked before)."""
    assert _run(client, PROBE, **overrides).output.strip() in (WARM, "/bin/sh -c")
    assert _run(client, PROBE, **overrides).output.strip() == WARM
    return _run(client, command, **overrides)


def test_a_command_after_one_like_it_runs_in_a_waiting_shell(client: MuxClient) -> None:
    assert client.info["warm"] is True
    assert _run(client, PROBE).output.strip() == "/bin/sh -c"  # nothing was waiting for the first
    assert [_run(client, PROBE).output.strip() for _ in range(5)] == [WARM] * 5
    assert _run(client, PROBE, env=COLD).output.strip() == "/bin/sh -c"
    assert _run(client, PROBE, stdin=b"").output.strip() == "/bin/sh -c"
    assert _run(client, PROBE + "; : " + "x" * 4096).output.strip() == "/bin/sh -c"  # over PIPE_BUF


SAME_AS_COLD = [
    "foo",
    "if",
    "echo a; if",
    "echo a\nif",
    'echo "[$-] [$0] [$#] [$LINENO] [$PPID]"',
    "exit 3",
    'read x; echo "[$x] $?"',
    "cat; echo done",
    "readlink /proc/self/fd/0; ls /proc/$$/fd",
    "trap 'echo bye' EXIT; echo hi",
    "kill -9 $$",
    "kill -TERM $$",
    "umask; pwd; ulimit -n; ulimit -u",
    "set -e; false; echo no",
    "cat <<EOF\nline $LINENO\nEOF\necho $LINENO",
    "echo -n no newline at the end",
    "exec 3>&1; echo through 3 >&3",
    "sleep 0.1 & wait; echo waited",
    "env | sort | sed 's/^SANDBOXES_EXEC_ID=.*/the marker/'",
    "alias; set | grep -v '^SANDBOXES_EXEC_ID='",
    "echo \\\n continued",
    "; echo never",
    "return 4",
    "trap -p; echo $?",
    "grep -c . /proc/$$/status >/dev/null && echo status",
    "awk '/^Sig(Ign|Cgt)/' /proc/$$/status",  # (not SigBlk: dash blocks signals around its waits)
    "[ $(ps -o pgid= -p $$) = $$ ] && [ $(ps -o sid= -p $$) = $$ ] && echo its own group and session",
]


@pytest.mark.parametrize("command", SAME_AS_COLD)
def test_a_warm_command_answers_as_the_same_command_run_cold(client: MuxClient, command: str) -> None:
    warm = _warm(client, command)
    cold = _run(client, command, env=COLD)
    assert (warm.output, warm.exit_code, warm.error) == (cold.output, cold.exit_code, cold.error)
    run_by_sh = subprocess.run(
        ["/bin/sh", "-c", command], stdin=subprocess.DEVNULL, capture_output=True, text=True, start_new_session=True
    )
    code = run_by_sh.returncode
    assert warm.exit_code == (128 - code if code < 0 else code)  # (killed by a signal: negative here)


def test_a_waiting_shell_killed_by_a_command_is_replaced(client: MuxClient) -> None:
    _warm(client, "true")
    killed = _run(client, f"for pid in $({SPARES}); do kill -9 $pid && echo $pid; done").output.split()
    assert killed, "no shell was waiting"
    assert all(_gone(int(pid), zombie_ok=False) for pid in killed)  # reaped by the helper
    after = [_run(client, PROBE) for _ in range(3)]
    assert [r.exit_code for r in after] == [0, 0, 0]
    assert after[-1].output.strip() == WARM


def test_a_working_directory_made_again_is_not_the_one_a_shell_waits_in(client: MuxClient, tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    _warm(client, "true", cwd=str(work))  # shells now wait in work
    remade = _run(client, f"rm -rf {work} && mkdir {work} && echo new > {work}/file", cwd=str(tmp_path), stdin=b"")
    assert remade.exit_code == 0, remade  # (stdin: cold, so the shells waiting in work are kept)
    inside = _run(client, "cat file; " + PROBE, cwd=str(work))
    assert inside.output == "new\n/bin/sh -c\n"
    assert _run(client, "cat file; " + PROBE, cwd=str(work)).output == "new\n" + WARM + "\n"


def test_commands_alternating_between_directories_each_find_a_shell(client: MuxClient, tmp_path: Path) -> None:
    dirs = [tmp_path / "a", tmp_path / "b"]
    for path in dirs:
        path.mkdir()
    answers = [_run(client, "pwd; " + PROBE, cwd=str(dirs[i % 2])).output.split("\n")[:2] for i in range(8)]
    assert [answer[0] for answer in answers] == [str(dirs[i % 2]) for i in range(8)]
    assert [answer[1] for answer in answers][2:] == [WARM] * 6
    assert len(_run(client, SPARES, cwd=str(dirs[0])).output.split()) <= 2


def test_a_different_environment_gets_its_own_shell(client: MuxClient) -> None:
    _warm(client, "true")
    first = _run(client, "echo $GREETING; " + PROBE, env={"GREETING": "hi"})
    again = _run(client, "echo $GREETING; " + PROBE, env={"GREETING": "hi"})
    other = _run(client, "echo $GREETING; " + PROBE, env={"GREETING": "ho"})
    assert (first.output, again.output, other.output) == (
        "hi\n/bin/sh -c\n", "hi\n" + WARM + "\n", "ho\n/bin/sh -c\n"
    )  # fmt: skip


def test_at_most_two_shells_wait_and_they_end_with_the_helper(client: MuxClient) -> None:
    for _ in range(10):
        _run(client, "true")
    spares = [int(pid) for pid in _run(client, SPARES).output.split()]
    assert 1 <= len(spares) <= 2
    stream = client._stream
    assert isinstance(stream, _PipeStream)
    assert stream.process.stdin is not None
    stream.process.stdin.close()  # the client is gone: the helper ends, and ends its shells
    assert stream.process.wait(10) == 0
    assert all(_gone(pid, zombie_ok=False) for pid in spares)


def test_a_killed_helper_leaves_no_waiting_shell_behind() -> None:
    """SIGKILL leaves the helper no say: its shells see their stdin end, and exit."""
    stream = _PipeStream()
    try:
        client = MuxClient(stream)
        for _ in range(3):  # two shells wait: the listing below runs in one of them
            _run(client, "true")
        spares = [int(pid) for pid in _run(client, SPARES).output.split()]
        assert spares
    finally:
        stream.close()  # SIGKILL
    assert all(_gone(pid, zombie_ok=True) for pid in spares)


def test_without_dash_every_command_runs_cold() -> None:
    """Where /bin/sh is not dash (bash reads a script from a pipe a byte at a time)."""
    stream = _PipeStream(_VARIANTS["cold"])
    try:
        client = MuxClient(stream)
        assert client.info["warm"] is False
        assert [_run(client, PROBE).output.strip() for _ in range(3)] == ["/bin/sh -c"] * 3
    finally:
        stream.close()


def _helper_under(tmp_path: Path, wrapper: str) -> _PipeStream:
    """The helper in a mount namespace of its own (as root), where dash's file is ``wrapper``: a
    bash script that may run dash itself as ``tmp_path/dash``, a copy."""
    needs(os.getuid() == 0 and shutil.which("unshare") is not None, "needs root and unshare (util-linux)")
    dash = os.path.realpath("/bin/sh")
    shutil.copy(dash, tmp_path / "dash")
    script = tmp_path / "sh"
    script.write_text("#!/bin/bash\n" + wrapper)
    script.chmod(0o755)
    stream = _PipeStream.__new__(_PipeStream)
    setup = f'mount --bind {script} {dash} && exec "$0" -c "$1"'
    stream.process = subprocess.Popen(
        ["unshare", "-m", "--propagation", "private", "sh", "-c", setup, sys.executable, SERVER_SOURCE],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    return stream


def test_a_shell_that_fails_the_probe_leaves_every_command_cold(tmp_path: Path) -> None:
    """/bin/sh resolves to dash by name, but bash runs (it refuses ``set +s`` and reads a script
    from a pipe a byte at a time): the probe finds out, once, and every command runs cold, with
    its own answer."""
    stream = _helper_under(tmp_path, 'exec -a sh /bin/bash "$@"\n')
    try:
        client = MuxClient(stream)
        assert client.info["warm"] is True  # by name, before any probe
        answers = [_run(client, "echo $((6 * 7)); " + WARM_ARGS) for _ in range(4)]
        assert [(a.output, a.exit_code) for a in answers] == [("42\n0\n", 0)] * 4  # never -s
        assert _run(client, SPARES).output == ""
    finally:
        stream.close()


def test_a_dash_that_reads_a_kib_at_a_time_fails_the_probe(tmp_path: Path) -> None:
    """As dash built with musl does (BUFSIZ 1024): the rest of a script after `exec </dev/null`
    would come from /dev/null. Here dash's script reaches it a KiB every 50 ms, so each of its
    reads gets at most that."""
    feeder = tmp_path / "feed.py"
    feeder.write_text(
        "import os, time\n"
        "while True:\n"
        "    block = os.read(0, 1024)\n"
        "    if not block:\n"
        "        break\n"
        "    os.write(1, block)\n"
        "    time.sleep(0.05)\n"
    )
    real = tmp_path / "dash"
    stream = _helper_under(
        tmp_path,
        f'if [ "$1" = -s ]; then {sys.executable} {feeder} | {{ exec {real} "$@"; }}; exit; fi\nexec {real} "$@"\n',
    )
    try:
        client = MuxClient(stream)
        answers = [_run(client, "echo one; echo two; " + WARM_ARGS) for _ in range(4)]
        assert [a.output for a in answers] == ["one\ntwo\n0\n"] * 4  # never -s
        assert _run(client, SPARES).output == ""
    finally:
        stream.close()


def test_a_probe_without_a_verdict_is_tried_again(tmp_path: Path) -> None:
    """The first shell dies by a signal before it answers the probe (a command's ``pkill sh``
    might do that): no verdict, so the next one is probed, passes, and commands run warm."""
    stream = _helper_under(
        tmp_path,
        f'if [ "$1" = -s ] && mkdir {tmp_path}/first 2>/dev/null; then kill -9 $$; fi\n'
        f'exec -a /bin/sh {tmp_path}/dash "$@"\n',
    )
    try:
        client = MuxClient(stream)
        answers = [_run(client, WARM_ARGS).output for _ in range(4)]
        assert (tmp_path / "first").is_dir()  # the first shell was killed
        assert answers[0] == "0\n", answers  # cold: nothing waited yet
        assert answers[-1] == "1\n", answers  # warm: the second probe passed
    finally:
        stream.close()


def test_a_malformed_environment_is_refused_and_the_helper_keeps_serving() -> None:
    """Only a client that is not `MuxClient` can send one: a mistake must still not kill the helper."""
    stream = _PipeStream()
    try:
        for ident, env in enumerate(["x", [["A", "B"]], {"A": 1}], start=1):
            payload = wire_spec({"command": "true", "env": env})
            assert _exchange(stream, b"R", ident, payload)[0] == b"E"
        assert _exchange(stream, b"P", 0, b"")[0] == b"H"
    finally:
        stream.close()


def _marked(client: MuxClient, marker: str) -> str:
    """What a command carrying the caller's ``marker`` says of it and of its shell."""
    return _run(client, "echo $SANDBOXES_EXEC_ID; " + PROBE, env={"SANDBOXES_EXEC_ID": marker}).output


def _unique() -> str:
    return uuid.uuid4().hex


def test_a_caller_marking_its_commands_runs_warm_with_the_markers_the_client_hands_out(client: MuxClient) -> None:
    """The service's way (`MuxClient.marker`): each marker is announced with an earlier command."""
    first = client.marker(_unique)
    assert _marked(client, first) == f"{first}\n/bin/sh -c\n"  # nothing waited for the first
    second = client.marker(_unique)
    assert _marked(client, second) == f"{second}\n{WARM}\n"  # announced by the first
    stray = _unique()
    assert _marked(client, stray) == f"{stray}\n/bin/sh -c\n"  # not handed out: cold
    third = client.marker(_unique)
    assert third not in (first, second, stray)
    assert _marked(client, third) == f"{third}\n{WARM}\n"  # announced by the second, and again by the stray
    assert len(_run(client, SPARES).output.split()) == 1  # (announced twice, one shell)
    fourth = client.marker(_unique)
    answer = _run(client, "echo $SANDBOXES_EXEC_ID; " + PROBE, env={"SANDBOXES_EXEC_ID": fourth}, stdin=b"")
    assert answer.output == f"{fourth}\n/bin/sh -c\n"  # with stdin: cold, but it announces the next
    fifth = client.marker(_unique)
    assert _marked(client, fifth) == f"{fifth}\n{WARM}\n"


def test_a_warm_command_dies_by_its_marker_killed_from_outside_the_helper(client: MuxClient) -> None:
    """As the local backend kills from the host, and another replica through its own helper:
    by the marker in the environment of every process of the command, its shell's included."""
    _marked(client, client.marker(_unique))
    marker = client.marker(_unique)
    started = threading.Event()
    seen = bytearray()
    answers: list[p.ExecuteResponse] = []
    command = PROBE + "; setsid sleep 60 & echo $!; sleep 60"
    env = {"SANDBOXES_EXEC_ID": marker}

    def saw(chunk: bytes, *_: object) -> None:
        seen.extend(chunk)
        if seen.count(b"\n") >= 2:  # the probe's line and the detached sleep's pid: all started
            started.set()

    def run() -> None:
        answers.append(_run(client, command, env=env, timeout=120, on_output=saw))

    waiter = threading.Thread(target=run)
    waiter.start()
    try:
        assert started.wait(10)
        assert kill_marked(marker)
    finally:
        waiter.join(20)
    assert not waiter.is_alive(), "the command outlived the kill of its marker"
    [answer] = answers
    lines = answer.output.split()
    assert answer.exit_code == 137, answer
    assert " ".join(lines[:2]) == WARM
    assert _gone(int(lines[2]), zombie_ok=False)


def test_a_marker_is_announced_only_while_nothing_else_runs(client: MuxClient) -> None:
    """Concurrent commands would take each other's announced markers: none is announced then."""
    made = iter(f"marker-{i}" for i in range(10))

    def new() -> str:
        return next(made)

    assert _marked(client, client.marker(new)) == "marker-0\n/bin/sh -c\n"  # it announced marker-1
    announced = client.marker(new)
    assert announced == "marker-1"
    up = threading.Event()
    options = {"env": {"TAG": "slow"}, "on_output": lambda *_: up.set()}
    slow = threading.Thread(target=_run, args=(client, "echo up; sleep 60"), kwargs=options)
    slow.start()
    try:
        assert up.wait(10)
        assert _marked(client, announced) == f"marker-1\n{WARM}\n"  # announces nothing: another runs
    finally:
        client.kill_tagged("TAG", "slow")
        slow.join(10)
    assert not slow.is_alive()
    assert _marked(client, client.marker(new)) == "marker-2\n/bin/sh -c\n"  # fresh; it announced marker-3
    assert _marked(client, client.marker(new)) == f"marker-3\n{WARM}\n"
