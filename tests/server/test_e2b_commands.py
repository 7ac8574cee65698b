"""Commands as E2B runs them, through the real E2B SDK (sync and async) over the local jail and
Docker: stdin held open (``stdin=True``, then ``send_stdin``, ``stream_input``,
``close_stdin``), and what E2B's users complain of, fixed here: a kill leaves no process of the
command's tree (E2B#1034), a running command never vanishes from the list (#1031), a command is
reattached by pid however long after its start (#1074), and output keeps flowing after a
reattach (#1352)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import toy_backend
from e2b import AsyncSandbox, Sandbox, SandboxException, TimeoutException
from e2b_harness import opts, service_fixture
from service_harness import ManualClock, Running, running, settings_for
from support import HAS_BWRAP, needs

from sandboxes.server.settings import TenantPolicy

service = service_fixture("e2bcmd")

DEADLINE = 20.0
"""Seconds a test waits at most for a condition it polls."""


@pytest.fixture(scope="module")
def sandbox(service: Running) -> Iterator[Sandbox]:
    created = Sandbox.create(timeout=3600, **opts(service))  # the module's life, past the 300 s default
    yield created
    created.kill()


def _until(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + DEADLINE
    while not condition():
        assert time.monotonic() < deadline, f"not within {DEADLINE} s: {what}"
        time.sleep(0.05)


def test_stdin_is_fed_as_the_command_runs_and_closed(sandbox: Sandbox) -> None:
    mark = f"/tmp/stdin-{time.monotonic_ns()}"
    handle = sandbox.commands.run(f'read first; echo "$first" > {mark}; cat; echo end', background=True, stdin=True)
    sandbox.commands.send_stdin(handle.pid, "one\n")
    _until(lambda: sandbox.files.exists(mark), "the first line read by the running command")
    assert sandbox.files.read(mark) == "one\n"
    sandbox.commands.send_stdin(handle.pid, b"\x00two\n")
    sandbox.commands.stream_input(handle.pid, ["thr", b"ee\n"])
    handle.send_stdin("four\n")
    sandbox.commands.close_stdin(handle.pid)
    result = handle.wait()
    assert (result.stdout, result.exit_code) == ("\x00two\nthree\nfour\nend\n", 0)


def test_stdin_is_refused_for_a_command_started_without_it(sandbox: Sandbox) -> None:
    handle = sandbox.commands.run("sleep 30", background=True)
    try:
        with pytest.raises(SandboxException, match="has no open stdin"):
            sandbox.commands.send_stdin(handle.pid, "x")
        with pytest.raises(SandboxException, match="has no open stdin"):
            sandbox.commands.close_stdin(handle.pid)
    finally:
        assert handle.kill() is True
    assert sandbox.commands.run("cat", stdin=False).stdout == ""  # a closed stdin: cat ends at once


async def test_the_async_sdk_feeds_stdin_as_it_goes(service: Running) -> None:
    created = await AsyncSandbox.create(**opts(service))
    try:
        seen: list[str] = []
        changed = asyncio.Event()

        def heard(text: str) -> None:
            seen.append(text)
            changed.set()

        async def until_seen(text: str) -> None:
            async with asyncio.timeout(DEADLINE):
                while text not in "".join(seen):
                    changed.clear()
                    await changed.wait()

        script = "while read line; do echo got-$line; done; echo closed"
        handle = await created.commands.run(script, background=True, stdin=True, on_stdout=heard)
        await created.commands.send_stdin(handle.pid, "one\n")
        await until_seen("got-one\n")
        async with created.commands.stream_input(handle.pid) as stream:
            await stream.send("two\n")
            await stream.send(b"three\n")
            await until_seen("got-three\n")  # each chunk reaches the command while the stream is open
        await created.commands.close_stdin(handle.pid)
        result = await handle.wait()
        assert result.stdout == "got-one\ngot-two\ngot-three\nclosed\n"
    finally:
        await created.kill()


def test_a_sandbox_without_an_exec_helper_runs_the_command_with_its_stdin_closed(tmp_path: Path) -> None:
    settings = settings_for(tmp_path, templates={"default": {"backend": "toy", "default_timeout": 30}})
    assert isinstance(settings.templates["default"], toy_backend.ToyTemplate)
    with running(settings) as toy:
        created = Sandbox.create(**opts(toy))
        try:
            handle = created.commands.run("cat; echo ran", background=True, stdin=True)
            with pytest.raises(SandboxException, match="without an exec helper"):
                created.commands.send_stdin(handle.pid, "lost\n")
            assert handle.wait().stdout == "ran\n"
        finally:
            created.kill()


_COUNT = "for f in /proc/[0-9]*/cmdline; do tr '\\0' ' ' < $f; echo; done 2>/dev/null | grep -c '^sleep 310[1-9] $'"
"""How many of the tree's sleeps run, seen from inside the sandbox (this line is none of them)."""


def _tree(ready: str) -> str:
    """A command whose tree has a child, a grandchild in a session of its own (``setsid``), an
    orphan (double fork), a ``nohup``'d child, one that ignores SIGTERM, one that dropped the
    marker the service's kill looks for (`sandboxes._helper._kill`), one that cleared its whole
    environment and one that forged a background job's marker, both in sessions of their own;
    once all nine sleeps run it creates ``ready``, then waits."""
    return (
        "sleep 3101 & "
        "setsid sh -c 'sleep 3102' & "
        "(sleep 3103 &) ; "
        "nohup sleep 3104 >/dev/null 2>&1 & "
        "sh -c 'trap \"\" TERM HUP INT; sleep 3105' & "
        "sleep 3106 & "
        "env -u SANDBOXES_EXEC_ID setsid sleep 3107 & "
        "env -i setsid sleep 3108 & "
        "env SANDBOXES_EXEC_ID=sandboxes-job-x setsid sleep 3109 & "
        f'until [ "$({_COUNT})" = 9 ]; do sleep 0.05; done; touch {ready}; wait'
    )


def _sleepers(sandbox: Sandbox) -> int:
    return int(sandbox.commands.run(f"{_COUNT} || true").stdout)


@pytest.mark.parametrize("stdin", [False, True], ids=["plain", "stdin"])
def test_a_kill_leaves_nothing_of_the_commands_tree_running(sandbox: Sandbox, stdin: bool) -> None:
    """E2B#1034: ``commands.kill(pid)`` (SendSignal SIGKILL) kills every process the command
    started, wherever it went (a new session, an orphan, nohup, SIGTERM ignored, its marker
    dropped), whether its stdin is held open or not."""
    ready = f"/tmp/tree-{time.monotonic_ns()}"
    handle = sandbox.commands.run(_tree(ready), background=True, timeout=0, stdin=stdin)
    _until(lambda: sandbox.files.exists(ready), "the command's nine sleeps running")
    assert sandbox.commands.kill(handle.pid) is True
    assert _sleepers(sandbox) == 0
    assert handle.pid not in [process.pid for process in sandbox.commands.list()]


def test_the_sdks_timeout_kills_the_whole_tree_too(sandbox: Sandbox) -> None:
    ready = f"/tmp/tree-{time.monotonic_ns()}"
    with pytest.raises(TimeoutException):
        sandbox.commands.run(_tree(ready), timeout=3)
    assert sandbox.files.exists(ready), "the tree never ran whole before the timeout"
    _until(lambda: _sleepers(sandbox) == 0, "no sleep of the timed-out command left")


_TICKS = "i=0; while :; do echo tick-$i; i=$((i+1)); sleep 0.1; done"
"""A command that prints a numbered line every 100 ms until killed."""


def _ticks_after(handle: Any, count: int) -> list[int]:
    """The numbers of the next ``count`` ticks ``handle`` receives, then it is let go of."""
    numbers: list[int] = []
    for stdout, _, _ in handle:
        numbers += [int(line.removeprefix("tick-")) for line in (stdout or "").split()]
        if len(numbers) >= count:
            break
    handle.disconnect()
    return numbers


def test_output_keeps_flowing_after_each_reattach(service: Running, sandbox: Sandbox) -> None:
    """E2B#1352: a command reattached by pid (``commands.connect``) keeps sending its output,
    the second time as the first, also to a connection made by another SDK object."""
    handle = sandbox.commands.run(_TICKS, background=True, timeout=0)
    handle.disconnect()
    try:
        first = _ticks_after(sandbox.commands.connect(handle.pid, timeout=0), 3)
        elsewhere = Sandbox.connect(sandbox.sandbox_id, **opts(service))
        second = _ticks_after(elsewhere.commands.connect(handle.pid, timeout=0), 3)
        third = _ticks_after(sandbox.commands.connect(handle.pid, timeout=0), 3)
        assert len(first) >= 3
        assert first[-1] < second[0] <= second[-1] < third[0], (first, second, third)
        assert handle.pid in [process.pid for process in sandbox.commands.list()]
        held = service.app.state.e2b.commands.find(sandbox.sandbox_id, handle.pid)
        _until(lambda: not held.listeners, "every connection that left no longer listening")
    finally:
        assert sandbox.commands.kill(handle.pid) is True


async def test_the_async_sdk_reattaches_twice_and_output_flows(service: Running) -> None:
    created = await AsyncSandbox.create(**opts(service))
    try:
        handle = await created.commands.run(_TICKS, background=True, timeout=0)
        await handle.disconnect()
        for _ in range(2):
            seen: list[str] = []
            changed = asyncio.Event()

            def heard(text: str, seen: list[str] = seen, changed: asyncio.Event = changed) -> None:
                seen.append(text)
                changed.set()

            again = await created.commands.connect(handle.pid, timeout=0, on_stdout=heard)
            async with asyncio.timeout(DEADLINE):
                while "".join(seen).count("\n") < 3:
                    changed.clear()
                    await changed.wait()
            await again.disconnect()
        assert await created.commands.kill(handle.pid) is True
    finally:
        await created.kill()


def test_a_running_command_stays_listed_and_reattachable_however_long_after_its_start(tmp_path: Path) -> None:
    """E2B#1031 and #1074: a command started in the background is listed, from any connection,
    for as long as it runs, and reattached by pid after its starting connection left and hours
    passed on the service's clock (its sweeps run): no timer or cache expiry drops it."""
    needs(HAS_BWRAP, "bubblewrap is not installed")
    clock = ManualClock()
    with running(settings_for(tmp_path, max_ttl=86_400), clock=clock) as timed:
        created = Sandbox.create(timeout=86_400, **opts(timed))
        try:
            gate = f"/tmp/gate-{time.monotonic_ns()}"
            handle = created.commands.run(_GATED.format(gate=gate), background=True, timeout=0)
            assert next(iter(handle)) == ("first\n", None, None)
            handle.disconnect()
            for _ in range(8):  # sixteen hours, a sweep after each two
                clock.advance(7200)
                timed.sweep()
                other = Sandbox.connect(created.sandbox_id, **opts(timed))
                assert handle.pid in [process.pid for process in other.commands.list()]
            again = Sandbox.connect(created.sandbox_id, **opts(timed)).commands.connect(handle.pid, timeout=0)
            created.files.write(gate, "")
            result = again.wait()
            assert (result.stdout, result.exit_code) == ("second\n", 0)
            assert handle.pid not in [process.pid for process in created.commands.list()]
        finally:
            created.kill()


_GATED = "echo first; while [ ! -e {gate} ]; do sleep 0.05; done; echo second"
"""Says ``first``, waits for the test to create ``gate`` (the command polls), says ``second``."""


def test_a_helper_that_breaks_as_stdin_opens_fails_the_start_and_frees_its_slot(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The start answers ``unavailable`` and the tenant's one command slot is free again (the
    next command runs at once, not after ``command_slot_wait`` nor refused)."""
    needs(HAS_BWRAP, "bubblewrap is not installed")
    from sandboxes._mux import MuxBroken
    from sandboxes.server.e2b import stdin as e2b_stdin

    def broken(*args: object, **kwargs: object) -> None:
        raise MuxBroken("the stream broke while the request was written")

    monkeypatch.setattr(e2b_stdin, "open_channel", broken)
    tenants = {"alice": TenantPolicy(max_commands=1)}
    with running(settings_for(tmp_path, tenants=tenants, command_slot_wait=0)) as one_slot:
        created = Sandbox.create(**opts(one_slot))
        try:
            with pytest.raises(SandboxException, match="exec helper broke"):
                created.commands.run("cat", background=True, stdin=True)
            assert created.commands.run("echo next").stdout == "next\n"
        finally:
            created.kill()


def test_the_command_is_the_process_as_envd_starts_it(sandbox: Sandbox) -> None:
    """``/bin/bash -l -c CMD`` is exec'd: no shell of the service's waits above it."""
    parent = sandbox.commands.run("cat /proc/$PPID/comm").stdout.strip()
    assert parent not in {"sh", "dash", "bash"}, parent


PROFILE = 'echo >>"$HOME/read"; export FROM_PROFILE={}; PATH="$HOME/bin:$PATH"\n'
"""A login file that counts its reads, exports a variable and puts a directory on PATH."""


def _profiled_home(sandbox: Sandbox) -> dict[str, str]:
    home = sandbox.commands.run("pwd").stdout.strip() + f"/home-{time.monotonic_ns()}"
    sandbox.files.write(f"{home}/.profile", PROFILE.format("one"))
    sandbox.files.write(f"{home}/bin/from-path", "#!/bin/sh\necho found on the login PATH\n")
    sandbox.commands.run(f"chmod +x {home}/bin/from-path")
    return {"HOME": home}


def _reads(sandbox: Sandbox, envs: dict[str, str]) -> int:
    return len(sandbox.files.read(f"{envs['HOME']}/read").splitlines())


def test_the_login_files_reach_every_command_and_a_change_reaches_the_next(sandbox: Sandbox) -> None:
    """Commands run in login shells started ahead of them (after one like them): what the login
    files set reaches each, and a login file changed while such a shell waits is read again."""
    envs = _profiled_home(sandbox)
    runs = [sandbox.commands.run("echo $FROM_PROFILE; from-path", envs=envs).stdout for _ in range(4)]
    assert runs == ["one\nfound on the login PATH\n"] * 4
    _until(lambda: _reads(sandbox, envs) > 4, "a login shell waiting for the next command")
    sandbox.files.write(f"{envs['HOME']}/.profile", PROFILE.format("two"))  # the same size
    assert sandbox.commands.run("echo $FROM_PROFILE", envs=envs).stdout == "two\n"
    assert sandbox.commands.run("echo $FROM_PROFILE", envs=envs).stdout == "two\n"


async def test_the_async_sdk_sees_the_login_files_and_their_change(service: Running, sandbox: Sandbox) -> None:
    envs = _profiled_home(sandbox)
    connected = await AsyncSandbox.connect(sandbox.sandbox_id, **opts(service))
    runs = [(await connected.commands.run("echo $FROM_PROFILE", envs=envs)).stdout for _ in range(3)]
    assert runs == ["one\n"] * 3
    _until(lambda: _reads(sandbox, envs) > 3, "a login shell waiting for the next command")
    await connected.files.write(f"{envs['HOME']}/.profile", PROFILE.format("two"))
    assert (await connected.commands.run("echo $FROM_PROFILE; from-path", envs=envs)).stdout == (
        "two\nfound on the login PATH\n"
    )
