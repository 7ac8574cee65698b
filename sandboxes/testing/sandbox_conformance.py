"""Conformance for backends that run commands: `execute` semantics on top of the file suite."""

from __future__ import annotations

import asyncio
import shlex
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from sandboxes import protocol as p
from sandboxes.testing._answers import whole_text
from sandboxes.testing.conformance import BackendConformance
from sandboxes.testing.corpus import CANARY, HOSTILE_NAMES
from sandboxes.testing.pseudo_conformance import PseudoFiles


class SandboxConformance(BackendConformance, PseudoFiles):
    """Everything in `BackendConformance`, plus ``execute`` and the sandbox's pseudo-files."""

    @pytest.fixture
    def sandbox(self, backend: p.BackendProtocol) -> p.SandboxBackendProtocol:
        assert isinstance(backend, p.SandboxBackendProtocol)
        return backend

    def test_id_is_stable(self, sandbox: p.SandboxBackendProtocol) -> None:
        """One handle's id does not change as its transport starts. What the id means (the
        sandbox's, the same on every handle, another sandbox's differs) needs a second handle:
        `LifecycleConformance` and `ProviderConformance` check it."""
        first = sandbox.id
        assert isinstance(first, str)
        assert first.strip() == first != ""
        assert sandbox.execute("true").exit_code == 0  # starting a transport must not change it
        assert sandbox.id == first

    def test_execute_output_and_exit_code(self, sandbox: p.SandboxBackendProtocol) -> None:
        result = sandbox.execute("echo out; echo err >&2; exit 3")
        assert result.exit_code == 3
        assert result.error is None
        assert "out\n" in result.output
        assert "err\n" in result.output
        assert not result.truncated
        assert sandbox.execute("true").exit_code == 0

    def test_execute_reports_death_by_signal(self, sandbox: p.SandboxBackendProtocol) -> None:
        assert sandbox.execute("kill -9 $$").exit_code == 137

    def test_execute_stdin_env_cwd(self, sandbox: p.SandboxBackendProtocol, root: str) -> None:
        blob = bytes(range(256)) * 4096
        assert sandbox.execute("wc -c", stdin=blob).output.strip() == str(len(blob))
        assert sandbox.execute("cat", stdin="héllo\n").output == "héllo\n"
        weird = "spaces $(touch x) `y` 'q' \"d\"\nnewline"
        assert sandbox.execute('printf %s "$WEIRD"', env={"WEIRD": weird}).output == weird
        sandbox.write(f"{root}/marker", "m")
        assert sandbox.execute("pwd", cwd=root).output.strip() == root
        missing = sandbox.execute("pwd", cwd=f"{root}/no-such-dir")
        assert missing.error == p.FILE_NOT_FOUND
        assert missing.exit_code is None

    def test_file_ops_and_commands_see_the_same_files(self, sandbox: p.SandboxBackendProtocol, root: str) -> None:
        sandbox.write(f"{root}/from-api.txt", "api\n")
        assert sandbox.execute(f"cat {shlex.quote(root)}/from-api.txt").output == "api\n"
        made = sandbox.execute(f"printf 'shell\\n' > {shlex.quote(root)}/from-shell.txt")
        assert made.exit_code == 0
        assert whole_text(sandbox, f"{root}/from-shell.txt") == "shell\n"

    def test_output_is_capped_keeping_head_and_tail(self, sandbox: p.SandboxBackendProtocol) -> None:
        command = "echo START; head -c 3000000 /dev/zero | tr '\\0' x; echo; echo END"
        result = sandbox.execute(command, output_limit=100_000)
        assert result.truncated
        assert result.exit_code == 0
        assert result.output.startswith("START\n")
        assert result.output.rstrip().endswith("END")
        assert len(result.output) < 101_000

    def test_large_output_within_limit_is_complete(self, sandbox: p.SandboxBackendProtocol) -> None:
        result = sandbox.execute("head -c 5000000 /dev/zero | tr '\\0' y", output_limit=8_000_000)
        assert not result.truncated
        assert result.output == "y" * 5_000_000

    def test_timeout_kills_the_whole_process_tree(self, sandbox: p.SandboxBackendProtocol, root: str) -> None:
        sandbox.write(f"{root}/.keep", "")
        q = shlex.quote(root)
        beat = "i=0; while :; do i=$((i+1)); echo $i > {file}; sleep 0.1; done"
        command = (
            f"({beat.format(file=q + '/hb1')}) & "
            f"(sh -c {shlex.quote(beat.format(file=q + '/hb2'))} &) ; "
            f"if command -v setsid >/dev/null; then setsid sh -c {shlex.quote(beat.format(file=q + '/hb3'))} & "
            f"else ({beat.format(file=q + '/hb3')}) & fi; "
            "sleep 1000"
        )
        started = time.monotonic()
        result = sandbox.execute(command, timeout=2)
        assert result.error == p.TIMEOUT
        assert result.exit_code is None
        assert time.monotonic() - started < 30
        time.sleep(0.5)
        # The files existing proves each loop ran (_text fails otherwise); a loop killed between
        # `>` truncating its file and `echo` writing it leaves the file empty, which is fine.
        before = [whole_text(sandbox, f"{root}/hb{i}") for i in (1, 2, 3)]
        time.sleep(1.0)
        after = [whole_text(sandbox, f"{root}/hb{i}") for i in (1, 2, 3)]
        assert after == before, "a process of the timed-out command is still running"
        assert sandbox.execute("echo alive").output == "alive\n"

    def test_timeout_holds_when_stdin_is_left_unread(self, sandbox: p.SandboxBackendProtocol) -> None:
        """A command that never reads a big stdin still times out: feeding it must not hold up
        the watch on its clock."""
        started = time.monotonic()
        result = sandbox.execute("sleep 60", stdin=b"x" * (8 << 20), timeout=2)
        assert result.error == p.TIMEOUT
        assert result.exit_code is None
        assert time.monotonic() - started < 20
        assert sandbox.execute("echo alive").output == "alive\n"

    def test_background_processes_end_with_their_command(self, sandbox: p.SandboxBackendProtocol, root: str) -> None:
        """Nothing a command starts outlives it: long-lived processes are the service's background API."""
        sandbox.write(f"{root}/.keep", "")
        beats = [f"{shlex.quote(root)}/bg{n}" for n in (1, 2)]
        loops = [f"i=0; while :; do i=$((i+1)); echo $i > {beat}; sleep 0.1; done" for beat in beats]
        started = time.monotonic()
        # Both loops must have beaten before the command ends, so a loop that never started
        # cannot pass for one that was stopped.
        wait = f"until [ -s {beats[0]} ] && [ -s {beats[1]} ]; do sleep 0.01; done"
        immune = f"(trap '' HUP; exec sh -c {shlex.quote(loops[1])})"  # nohup's effect; busybox may lack nohup
        command = f"({loops[0]}) & {immune} >/dev/null 2>&1 & {wait}; echo started"
        result = sandbox.execute(command, timeout=30)
        assert result.exit_code == 0
        assert result.output == "started\n"
        assert time.monotonic() - started < 10
        paths = [f"{root}/bg{n}" for n in (1, 2)]
        time.sleep(0.5)  # the tree is killed as the command ends; let a kill in flight land
        before = [r.content for r in sandbox.download_files(paths)]
        assert all(content is not None for content in before)
        time.sleep(1.0)  # ten beats' time: a survivor would have written by now
        after = [r.content for r in sandbox.download_files(paths)]
        assert after == before, "a background process outlived its command"

    def test_concurrent_commands(self, sandbox: p.SandboxBackendProtocol) -> None:
        def run(i: int) -> p.ExecuteResponse:
            return sandbox.execute(f"echo start{i}; sleep 0.3; echo end{i}")

        with ThreadPoolExecutor(max_workers=6) as pool:
            results = list(pool.map(run, range(12)))
        assert [r.output for r in results] == [f"start{i}\nend{i}\n" for i in range(12)]
        assert all(r.exit_code == 0 for r in results)

    def test_async_execute(self, sandbox: p.SandboxBackendProtocol) -> None:
        async def scenario() -> list[p.ExecuteResponse]:
            return await asyncio.gather(*(sandbox.aexecute(f"echo {i}") for i in range(8)))

        assert [r.output for r in asyncio.run(scenario())] == [f"{i}\n" for i in range(8)]

    def test_hostile_names_never_run_as_commands(self, sandbox: p.SandboxBackendProtocol, root: str) -> None:
        for name in HOSTILE_NAMES:
            sandbox.write(f"{root}/{name}", "x")
            sandbox.ls(root)
            sandbox.grep("x", root, glob=name)
            sandbox.glob(name, root)
            sandbox.edit(f"{root}/{name}", "x", "y")
            sandbox.download_files([f"{root}/{name}"])
            sandbox.delete(f"{root}/{name}")
        found = sandbox.execute(f"ls -a . {shlex.quote(root)} /tmp 2>/dev/null | grep -c {CANARY}")
        assert found.output.strip() == "0"

    def test_replacing_a_file_keeps_its_mode_and_leaves_nothing_beside_it(
        self, sandbox: p.SandboxBackendProtocol, root: str
    ) -> None:
        """Writes go to a temporary file renamed over the target: the target keeps its mode,
        new files get the umask's, and no temporary file is left behind, on every write path."""
        big = bytes(range(256)) * 8192  # 2 MiB: over any backend's bulk-transfer threshold
        target = f"{root}/kept/mode.txt"
        assert sandbox.write(target, "one\n").error is None
        assert sandbox.execute(f"chmod 751 {shlex.quote(target)}").exit_code == 0
        assert sandbox.write(target, "two\n").error is None
        assert sandbox.edit(target, "two", "three").error is None
        assert sandbox.upload_files([(target, b"four\n")])[0].error is None
        assert sandbox.upload_files([(target, big), (f"{root}/kept/other.bin", big)])[0].error is None
        assert sandbox.download_files([target])[0].content == big
        stat = sandbox.execute(f"cd {shlex.quote(root)}/kept && stat -c '%a %n' * .[!.]* 2>/dev/null; umask")
        lines = stat.output.split("\n")
        umask = int(lines[-2], 8)
        assert lines[:-2] == ["751 mode.txt", f"{0o666 & ~umask:o} other.bin"]

    # ------------------------------------------------------------------ writes to special files

    def test_writes_to_a_fifo_are_refused_not_blocked(self, sandbox: p.SandboxBackendProtocol, root: str) -> None:
        """A write or upload (inline or bulk) whose target is a FIFO, or a symlink
        to one, answers ``invalid_argument`` at once, without opening it: nobody reads the FIFO,
        so a write into it would block until the operation's timeout."""
        fifo, link = f"{root}/special/fifo", f"{root}/special/link"
        special = shlex.quote(f"{root}/special")
        made = sandbox.execute(f"mkdir -p {special} && cd {special} && mkfifo fifo && ln -s fifo link && echo ok")
        assert made.output == "ok\n"
        big = b"x" * (2 << 20)  # over any backend's bulk-transfer threshold
        attempts = {
            "write": lambda: [sandbox.write(fifo, "one").error],
            "write through a link": lambda: [sandbox.write(link, "one").error],
            "upload": lambda: [r.error for r in sandbox.upload_files([(fifo, b"one")])],
            "uploads": lambda: [r.error for r in sandbox.upload_files([(fifo, b"one"), (link, b"two")])],
            "bulk upload": lambda: [r.error for r in sandbox.upload_files([(fifo, big)])],
        }
        with ThreadPoolExecutor(1) as pool:
            for name, attempt in attempts.items():
                future = pool.submit(attempt)
                try:
                    errors = future.result(timeout=20)
                except TimeoutError:
                    sandbox.execute(f"cat {special}/fifo > /dev/null", timeout=10)  # unblock it to end the test
                    pytest.fail(f"{name} into a FIFO blocked")
                assert set(errors) == {p.INVALID_ARGUMENT}, name
        assert sandbox.write(fifo, "one").message is not None
        kind = sandbox.execute(f"cd {special} && [ -p fifo ] && [ -L link ] && ls -A | wc -l")
        assert kind.output.strip() == "2", "the FIFO was replaced, or a temporary file was left beside it"
