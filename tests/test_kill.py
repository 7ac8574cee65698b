"""The one process-tree kill (`sandboxes._helper._kill`), both forms, on this host: a tree that keeps
forking under its marker, and one that also left the session (``setsid``), are wholly dead after
ONE call. A single scan of /proc (what the service's local backend did) leaves the children born
while it read; these tests fail with it."""

from __future__ import annotations

import os
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from support import wait_for

from sandboxes._helper._kill import KILL_MARKED_SH, MARKER_ENV, any_marked, kill_marked

FORKER = "i=0; while [ $i -lt 4000 ]; do sleep 60 & i=$((i + 1)); done; wait"
"""Forks as fast as a shell can, for seconds; bounded (4000 children, each gone within a minute)
so that a kill that fails cannot take this shared machine's pids."""


def marked(token: str) -> list[int]:
    """Live (not zombie) processes carrying ``MARKER_ENV=token``."""
    needle = f"\0{MARKER_ENV}={token}\0".encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as fh:
                if needle in b"\0" + fh.read() + b"\0":
                    found.append(int(entry))
        except OSError:
            continue
    return found


@pytest.fixture
def forking_trees() -> Iterator[str]:
    """Two trees under one fresh marker, both still forking: one in its own session, one that
    left it with ``setsid``. Whatever is left is killed afterwards, whatever the test said."""
    token = uuid.uuid4().hex
    env = {**os.environ, MARKER_ENV: token}
    leaders = [
        subprocess.Popen(["/bin/sh", "-c", FORKER], env=env, start_new_session=True),
        subprocess.Popen(["/bin/sh", "-c", f"setsid /bin/sh -c '{FORKER}' & wait"], env=env, start_new_session=True),
    ]
    try:
        wait_for(lambda: len(marked(token)) > 200, "the trees did not start forking")
        yield token
    finally:
        kill_marked(token)
        for leader in leaders:
            leader.wait(timeout=30)


def kill_in_python(token: str) -> None:
    assert kill_marked(token) is True


def kill_in_sh(token: str) -> None:
    subprocess.run(["/bin/sh", "-c", KILL_MARKED_SH + 'kill_marked "$1"', "sh", token], check=True, timeout=120)


@pytest.mark.parametrize("kill", [kill_in_python, kill_in_sh], ids=["python", "sh"])
def test_one_kill_leaves_no_marked_process_of_a_tree_that_keeps_forking(
    forking_trees: str, kill: Callable[[str], None]
) -> None:
    kill(forking_trees)
    assert marked(forking_trees) == []


def test_the_sh_form_skips_its_own_shell_even_when_the_shell_carries_the_marker() -> None:
    """A ``docker exec`` shell started with the marker keeps it in /proc/<pid>/environ after an
    ``unset`` (and so do the subshells it forks): the kill must end, and not kill itself."""
    token = uuid.uuid4().hex
    script = KILL_MARKED_SH + f'unset {MARKER_ENV}; kill_marked "$1"; echo survived'
    done = subprocess.run(
        ["/bin/sh", "-c", script, "sh", token],
        env={**os.environ, MARKER_ENV: token},
        capture_output=True,
        timeout=60,
    )
    assert (done.returncode, done.stdout) == (0, b"survived\n")


def test_an_empty_marker_is_refused() -> None:
    with pytest.raises(ValueError, match="empty marker"):
        kill_marked("")
    assert subprocess.run(["/bin/sh", "-c", KILL_MARKED_SH + 'kill_marked ""'], timeout=10).returncode == 1


def test_any_marked_finds_a_marked_process_among_many_markers_in_one_scan() -> None:
    """The exec helper's one scan for the commands that ended in a turn (`any_marked`): true
    while one process carries one of the markers, false once it is gone, and never for a
    marker nobody carries."""
    marker = f"any-marked-{uuid.uuid4().hex}"
    other = f"any-marked-{uuid.uuid4().hex}"
    child = subprocess.Popen(["sleep", "60"], env={**os.environ, MARKER_ENV: marker})
    try:
        assert any_marked([other, marker])
        assert not any_marked([other, ""])
    finally:
        child.kill()
        child.wait()
    assert not any_marked([other, marker])


def test_a_process_in_the_middle_of_an_exec_is_read_with_its_environment() -> None:
    """Between an exec's new memory and its environment, ``/proc/<pid>/environ`` reads empty
    (a third of the reads here, before): the orphan sweep took such a process for one that
    dropped every marker and killed it. `_kill._environ` waits its exec out: every read of a
    live process exec'ing in a chain finds its marker."""
    from sandboxes._helper import _kill

    env = {**os.environ, "SANDBOXES_TEST_MARK": "kept"}
    chain = "exec sh -c 'exec sh -c \"exec sh -c true\"'"
    reads = missed = 0
    for _ in range(100):
        process = subprocess.Popen(["sh", "-c", chain], env=env)
        while process.poll() is None:
            environ = _kill._environ(process.pid)
            if environ == b"\0\0" and _ended(process.pid):
                continue  # ended meanwhile: no environment to read
            if not environ:
                continue  # gone
            reads += 1
            missed += b"\0SANDBOXES_TEST_MARK=kept\0" not in environ
        process.wait()
    assert reads > 1000, reads  # the chain was looked at throughout, execs included
    assert missed == 0, f"{missed} of {reads} reads of a live process found no marker"


def _ended(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return True
    return stat[stat.rindex(b")") + 2 :].split()[0] in (b"Z", b"X")


def test_a_process_that_emptied_its_environment_is_not_waited_for() -> None:
    """``env -i``: an environment that is empty for good (its end is real) reads at once."""
    from sandboxes._helper import _kill

    process = subprocess.Popen(["env", "-i", "sleep", "30"])
    try:
        deadline = time.monotonic() + 10
        while _kill._environ(process.pid) != b"\0\0":  # until it is sleep, env-less
            assert time.monotonic() < deadline
        started = time.monotonic()
        assert _kill._environ(process.pid) == b"\0\0"
        assert time.monotonic() - started < _kill._EXEC_WAIT
    finally:
        process.kill()
        process.wait()


def test_a_process_unreadable_for_a_whole_wait_is_not_waited_for_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """Some processes read as an exec in progress for good: this CI machine's pid 1 (a VM's
    init: refused, its environment's end 0). After one whole `_kill._EXEC_WAIT`, the same
    process (pid and start time) reads at once: each host-side scan paid the wait, and a local
    jail's command cost 77 ms instead of ~12-17. Another process under the same pid is waited for."""
    from sandboxes._helper import _kill

    reads: list[int] = []
    started = {"at": b"100"}

    def refused(pid: int) -> bytes | None:
        reads.append(pid)
        return None

    monkeypatch.setattr(_kill, "_STUCK", set())
    monkeypatch.setattr(_kill, "_read_environ", refused)
    monkeypatch.setattr(_kill, "_env_end", lambda pid: b"0")
    monkeypatch.setattr(_kill, "_start_time", lambda pid: started["at"])
    assert _kill._environ(4242) == b""
    assert len(reads) > 2  # waited, reading again
    reads.clear()
    assert _kill._environ(4242) == b""
    assert reads == [4242]  # once: not waited for
    started["at"] = b"200"  # the pid reused by another process
    assert _kill._environ(4242) == b""
    assert len(reads) > 2
