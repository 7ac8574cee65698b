"""What test modules share besides fixtures, importable by a name of its own: ``conftest`` is not
one (pytest imports every directory's conftest.py under that same name, so ``from conftest
import ...`` finds whichever was loaded last)."""

from __future__ import annotations

import contextlib
import os
import shutil
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest

__all__ = [
    "FORKING_TREES",
    "HAS_BWRAP",
    "IN_CI",
    "RETAKE_PIDS",
    "SESSION_OWNER",
    "assert_one_kill_ends_forking_trees",
    "assert_the_sh_kill_works_in_a_full_sandbox",
    "needs",
    "owner_leftovers",
]

IN_CI = os.environ.get("CI") == "true"
"""Set by .ci/run, where every dependency is installed: a missing one fails, never skips."""
HAS_BWRAP = shutil.which("bwrap") is not None
SESSION_OWNER = f"pytest-{uuid.uuid4().hex[:8]}"
"""Owner label of every sandbox this session creates; the session sweeps exactly these."""


def wait_for(condition: Callable[[], bool], what: str, limit: float = 20.0) -> None:
    """Until ``condition`` holds (looked at every 10 ms), failing with ``what`` after ``limit`` seconds."""
    deadline = time.monotonic() + limit
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.01)


@contextlib.contextmanager
def owner_leftovers(docker_client: Any, owner: str) -> Iterator[list[str]]:
    """For a run (a benchmark's) whose sandboxes' owner is ``owner``, which the session's sweep
    does not know: the names of the containers and volumes it left, listed once the block
    ended without an error; then every one of them removed, whatever the block did."""
    selector = {"label": f"io.sandboxes.owner={owner}"}
    left: list[str] = []
    try:
        yield left
        left += [c.name for c in docker_client.containers.list(all=True, filters=selector)]
        left += [v.name for v in docker_client.volumes.list(filters=selector)]
    finally:
        for container in docker_client.containers.list(all=True, filters=selector):
            container.remove(force=True, v=True)
        for volume in docker_client.volumes.list(filters=selector):
            volume.remove(force=True)


def needs(ready: bool, reason: str) -> None:
    """A precondition of a test: skipped on a developer's machine that lacks it, a failure in CI,
    where every test must run (a silent skip there would hide a missing install step).

    As a mark, for a test, a class or a module (``pytestmark``), checked when each test sets up
    (tests/conftest.py): ``@pytest.mark.needs(HAS_BWRAP, "bubblewrap is not installed")``.
    Never `pytest.skip`, ``skipif`` or ``importorskip`` for a dependency: they skip in CI too."""
    if not ready:
        if IN_CI:
            pytest.fail(f"CI must run this test: {reason}")
        pytest.skip(reason, allow_module_level=True)  # from a test, a fixture or a module's import


FORKING_TREES = (
    'f=\'i=0; while [ $i -lt 4000 ]; do sleep 60 & i=$((i + 1)); done; wait\'; sh -c "$f" & setsid sh -c "$f" & wait'
)
"""Two trees that keep forking for seconds, one of them out of the session (``setsid``);
bounded, so that a failed kill cannot take a shared machine's pids for long. In a sandbox with a
pids limit their loops end at the first fork that fails (a shell that cannot fork exits), and
``wait`` with them."""


RETAKE_PIDS = """
import os, time
end = time.monotonic() + 300
while time.monotonic() < end:
    try:
        child = os.fork()
    except OSError:
        time.sleep(0.002)
        continue
    if child == 0:
        time.sleep(max(0.0, end - time.monotonic()))
        os._exit(0)
"""
"""Python that takes every pid its sandbox may have for 5 minutes and keeps them: it forks again
whenever a fork fails, so a pid that frees up is taken back within milliseconds."""


def _count(sandbox: Any, script: str) -> int | None:
    """The number ``script`` prints; ``None`` when the sandbox could not even fork to count
    (the trees took every pid it may have: they forked plenty)."""
    output = sandbox.execute(script).output.strip()
    return int(output) if output.isdigit() else None


def _count_once_room(sandbox: Any, script: str) -> int:
    """`_count` once the sandbox can fork for it: right after a kill, the killed may still hold
    their pids while they exit and until init reaps them."""
    deadline = time.monotonic() + 10
    while (counted := _count(sandbox, script)) is None:
        assert time.monotonic() < deadline, "the sandbox could not fork for 10 s after the kill"
        time.sleep(0.05)
    return counted


def assert_one_kill_ends_forking_trees(sandbox: Any, kill: Callable[[str], object]) -> None:
    """Start `FORKING_TREES` in ``sandbox`` under a marker of the caller's (as the service does),
    wait until they have forked, ``kill(marker)`` once: no process may carry the marker after."""
    from sandboxes._helper._kill import MARKER_ENV

    token = uuid.uuid4().hex
    count = f"grep -lsxzF -e '{MARKER_ENV}={token}' /proc/[0-9]*/environ | wc -l"
    command = f"{FORKING_TREES}; exec sleep 1000"  # runs on when the trees' loops end: until the kill
    answers: list[object] = []
    runner = threading.Thread(
        target=lambda: answers.append(sandbox.execute(command, env={MARKER_ENV: token}, timeout=120))
    )
    runner.start()
    try:
        deadline = time.monotonic() + 30
        while (marked := _count(sandbox, count)) is not None and marked < 50:
            assert time.monotonic() < deadline, f"the trees did not start forking: {marked} marked, {answers}"
            time.sleep(0.05)
        kill(token)
        assert (left := _count_once_room(sandbox, count)) == 0, f"{left} marked processes left"
    finally:
        kill(token)
        runner.join(60)
    assert not runner.is_alive(), "the command outlived the kill of its tree"


_FULL_SANDBOX_KILL = r"""t=$1
settle() {
  n=0
  while [ "$n" -lt 10000 ]; do
    n=$((n + 1)) s=0
    for d in /proc/[0-9]*; do
      { read -r l < "$d/stat"; } 2>/dev/null || continue
      case $l in *") "?" $$ "*) case $l in *" (sleep) "*) ;; *) s=1 ;; esac ;; esac
    done
    [ "$s" = 0 ] && return
  done
}
for free in 0 1; do
  while command eval 'SANDBOXES_EXEC_ID=$t sleep 300 &' 2>/dev/null; do :; done
  settle
  command eval ': $(:)' 2>/dev/null && echo 'room left'
  [ "$free" = 0 ] || { kill -9 $!; wait $!; } 2>/dev/null
  kill_marked "$t"
  echo "kill=$?"
  wait
  echo "left=$(grep -lsxzF -e "SANDBOXES_EXEC_ID=$t" /proc/[0-9]*/environ | wc -l)"
done
"""
"""``kill_marked`` run by the shell that filled its sandbox's pids: marked children until a fork
fails, then the proof that none is possible (no ``room left``), the kill, and a count once the
killed are reaped (``wait``: a zombie keeps its pid). Twice: with no pid free, and with one (for
the scan's subshell, which then cannot fork its pipeline). ``settle`` waits, with built-ins
alone, until every child has exec'd its ``sleep``: a child forked but not yet exec'd still shows
this shell's environment, without the marker, and the kill would miss it."""


def assert_the_sh_kill_works_in_a_full_sandbox(sandbox: Any) -> None:
    """`sandboxes._helper._kill.KILL_MARKED_SH` in a sandbox with no pid left: its scan cannot fork, and
    a shell that cannot fork exits, yet the kill ends the tree and says so."""
    from sandboxes import _scripts
    from sandboxes._helper._kill import KILL_MARKED_SH

    script = _scripts.command(KILL_MARKED_SH + _FULL_SANDBOX_KILL, uuid.uuid4().hex)
    done = sandbox.execute(script, timeout=120)
    assert done.output.split() == ["kill=0", "left=0"] * 2, done.output


def assert_command_marker_never_waits_for_the_helper_lock(
    sandbox: Any, also: Callable[[], object] | None = None
) -> None:
    """`sandboxes.base.MarksAhead.command_marker` is asked on the service's event loop, for a
    speed-up only: it answers while another thread holds the sandbox's helper lock, as a
    helper's start does for up to its hello's timeout (20 s). A helper is running, so the
    answer goes through it. ``also``: another question that must not wait either."""
    assert sandbox.execute("true").exit_code == 0
    held, release = threading.Event(), threading.Event()

    driver = getattr(sandbox, "helper_driver", None)  # Docker's and Kubernetes': the lock is the driver's
    lock = sandbox._mux_lock if driver is None else driver.lock

    def hold() -> None:
        with lock:
            held.set()
            release.wait(30)

    holder = threading.Thread(target=hold)
    holder.start()
    try:
        assert held.wait(10)
        for name, ask in [("command_marker", lambda: sandbox.command_marker(lambda: "fresh")), ("also", also)]:
            if ask is None:
                continue
            answered: list[object] = []
            asker = threading.Thread(target=lambda ask=ask, to=answered: to.append(ask()), daemon=True)
            asker.start()
            asker.join(5)
            assert answered, f"{name} waited for the helper lock"
    finally:
        release.set()
        holder.join()


SHADOWING_MODULES = ("json", "select", "signal", "struct")
"""Stdlib modules the exec helper imports, as files a command might write into its workspace."""


def write_shadowing_modules(sandbox: Any, directory: str) -> None:
    """``json.py`` and the like in ``directory`` (the helper's working directory), each of which
    ends whatever imports it: a helper started there must not import them
    (`sandboxes._mux.PYTHON_FLAGS`)."""
    for name in SHADOWING_MODULES:
        written = sandbox.write(f"{directory}/{name}.py", f"raise SystemExit('the workspace shadowed {name}')\n")
        assert written.error is None, written


def assert_a_failed_helper_start_is_tried_again_later(
    sandbox: Any, monkeypatch: pytest.MonkeyPatch, *, question_fails: bool = False
) -> None:
    """A helper start that fails as a passing failure would (its python is there) is neither
    given up for the sandbox's life nor retried at every command: the commands meanwhile run
    the transport's slow way, and the one after `sandboxes._mux.HelperStarts`' wait gets a live
    helper. The sandbox has no helper running yet. ``question_fails``: the question whether
    python is there fails too, as its exec does under a full pids limit (the runtime's status
    126): that cannot tell, so it is no reason to give up either."""
    from sandboxes._mux import MuxBroken

    assert not sandbox.helper_alive
    if question_fails:
        refused = (126, "OCI runtime exec failed: exec failed: read init-p: connection reset by peer")
        real_small = sandbox._run_small
        monkeypatch.setattr(sandbox, "_run_small", lambda *a, **k: refused)
    driver = getattr(sandbox, "helper_driver", None)  # Docker's and Kubernetes' start the driver's way
    starts, start_name = (sandbox._starts, "_start_helper") if driver is None else (driver.starts, "start_helper")
    real = getattr(sandbox, start_name)
    tried: list[int] = []

    def start() -> object:
        tried.append(1)
        if len(tried) == 1:
            raise MuxBroken("exec helper did not say hello within 20s")  # what a passing failure says
        return real()

    monkeypatch.setattr(sandbox, start_name, start)
    assert sandbox.execute("echo alone").output == "alone\n"  # its transport's slow way
    assert not sandbox.helper_alive
    assert sandbox.execute("echo alone again").output == "alone again\n"
    assert len(tried) == 1, "retried before its retry_after"
    assert not starts.unavailable, "given up for good, with python there"
    if question_fails:
        monkeypatch.setattr(sandbox, "_run_small", real_small)
    starts.expire()  # as if its retry_after had passed
    assert sandbox.execute("echo back").output == "back\n"
    assert sandbox.helper_alive
    assert len(tried) == 2
