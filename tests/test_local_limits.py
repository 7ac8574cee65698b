"""LocalSandbox's resource limits (`sandboxes.local._limits`): memory, processes, CPU and disk
bounded by a cgroup, or by rlimits where no cgroup can be written, and the cgroup removed with
the sandbox."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from support import HAS_BWRAP, needs

from sandboxes import protocol as p
from sandboxes._helper._spawn import SPARES
from sandboxes.local import LocalSandbox, LocalSandboxConfig
from sandboxes.local._limits import USAGE_FRESH, UsageCount, disk_usage

LIMITS = {"memory": 256 << 20, "pids": 64, "cpus": 0.5, "disk": 16 << 20}


@pytest.fixture(scope="module")
def limited_sandbox(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalSandbox]:
    needs(HAS_BWRAP, "bubblewrap (bwrap) is not installed")
    config = LocalSandboxConfig(root_dir=tmp_path_factory.mktemp("limited"), isolation="bwrap", **LIMITS)
    with LocalSandbox(config=config) as sandbox:
        yield sandbox


def test_a_memory_hog_is_killed_and_reported(limited_sandbox: LocalSandbox) -> None:
    hog = limited_sandbox.execute("python3 -c \"b = b'x' * (1 << 30); print(len(b))\"", timeout=60)
    assert hog.exit_code != 0
    assert str(1 << 30) not in hog.output
    if limited_sandbox._cgroup is not None:  # the kernel says who killed it only with a cgroup
        assert hog.error == p.OUT_OF_MEMORY, hog
    assert limited_sandbox.execute("echo alive").output == "alive\n"


def test_a_fork_bomb_stops_at_the_process_limit(limited_sandbox: LocalSandbox) -> None:
    bomb = limited_sandbox.execute("for i in $(seq 300); do sleep 5 & done; echo all-forked", timeout=30)
    assert "all-forked" not in bomb.output
    assert "fork" in bomb.output.lower()
    cgroup = limited_sandbox._cgroup
    if cgroup is not None:  # none of the bomb's processes outlives it (the jail's helper remains,
        current = Path(cgroup.pids_view[0]) / "pids.current"  # with the shells waiting for commands)
        deadline = time.monotonic() + 10
        while int(current.read_text()) > 3 + SPARES:
            assert time.monotonic() < deadline, f"{current.read_text()} processes left after the bomb"
            time.sleep(0.01)
    assert limited_sandbox.execute("echo alive").output == "alive\n"
    assert subprocess.run(["true"], check=False).returncode == 0  # the host still forks


@pytest.mark.alone  # spinners that other tests' workers starve of CPU never reach the quota
def test_cpu_bandwidth_is_bounded(limited_sandbox: LocalSandbox) -> None:
    needs(limited_sandbox._cgroup is not None, "no writable cgroup here (CI runs as root: it has one)")
    assert limited_sandbox._cgroup is not None
    # Each spinner burns 0.6 s of CPU, not of wall time: on a loaded machine a wall-clock spinner
    # may get too little CPU to reach the budget, and nothing is throttled (seen in CI runs).
    spin = "python3 -c 'import time\nwhile time.process_time() < 0.6: pass'"
    before = limited_sandbox._cgroup.throttled_periods()
    ran = limited_sandbox.execute(f"{spin} & {spin} & wait", timeout=60)
    assert ran.exit_code == 0
    # 1.2 s of CPU on a budget of half a CPU takes at least 2.4 s, however idle the machine, and
    # the kernel holds the spinners back period after period
    assert ran.duration_ms is not None
    assert ran.duration_ms >= 2000
    assert limited_sandbox._cgroup.throttled_periods() - before > 5


def test_writes_past_the_disk_bound_answer_no_space(limited_sandbox: LocalSandbox) -> None:
    root = limited_sandbox.root
    too_big = limited_sandbox.write(f"{root}/too-big", "x" * (LIMITS["disk"] + 1))
    assert too_big.error == p.NO_SPACE
    first, second = limited_sandbox.upload_files([(f"{root}/a", b"a" * (10 << 20)), (f"{root}/b", b"b" * (10 << 20))])
    assert first.error is None
    assert second.error == p.NO_SPACE
    assert limited_sandbox.download_files([f"{root}/a"])[0].content == b"a" * (10 << 20)
    assert limited_sandbox.download_files([f"{root}/b"])[0].error == p.FILE_NOT_FOUND
    big = limited_sandbox.execute(f"head -c {LIMITS['disk'] * 2} /dev/zero > {root}/by-command")
    assert big.exit_code != 0
    assert (root / "by-command").stat().st_size <= LIMITS["disk"]
    limited_sandbox.delete(f"{root}/a")
    limited_sandbox.delete(f"{root}/by-command")
    assert limited_sandbox.write(f"{root}/fits", "x" * (1 << 20)).error is None


def test_the_cgroup_goes_with_the_sandbox(tmp_path: Path) -> None:
    with LocalSandbox(config=LocalSandboxConfig(root_dir=tmp_path / "r", isolation="bwrap", **LIMITS)) as sandbox:
        cgroup = sandbox._cgroup
        needs(cgroup is not None, "no writable cgroup here (CI runs as root: it has one)")
        assert cgroup is not None
        sandbox.execute("true")
        assert all(directory.is_dir() for directory in cgroup.directories)
    assert not any(directory.exists() for directory in cgroup.directories)


def test_without_a_cgroup_rlimits_bound_memory_and_processes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Where cgroups cannot be written (not root, no delegation), rlimits stand in."""
    monkeypatch.setattr("sandboxes.local.sandbox.Cgroup.create", classmethod(lambda cls, *args, **kwargs: None))
    with LocalSandbox(config=LocalSandboxConfig(root_dir=tmp_path / "r", isolation="bwrap", **LIMITS)) as sandbox:
        assert sandbox._cgroup is None
        hog = sandbox.execute("python3 -c \"b = b'x' * (1 << 30); print(len(b))\"", timeout=60)
        assert hog.exit_code != 0
        assert str(1 << 30) not in hog.output
        bomb = sandbox.execute("for i in $(seq 300); do sleep 5 & done; echo all-forked", timeout=30)
        assert "all-forked" not in bomb.output
        assert sandbox.execute("echo alive").output == "alive\n"


def test_writes_walk_the_tree_once_a_second_not_once_each(limited_sandbox: LocalSandbox) -> None:
    """Without an image of its own, a sandbox's usage is counted by walking its trees: at most
    once every `USAGE_FRESH` seconds, its own writes added between walks, so the bound still
    refuses a write past it without walking again."""
    root, now, walks = limited_sandbox.root, [0.0], []

    def walk() -> int:
        walks.append(now[0])
        return disk_usage(root)

    limited_sandbox._usage = UsageCount(walk, clock=lambda: now[0])
    for n in range(4):
        assert limited_sandbox.write(f"{root}/w{n}", "x" * (3 << 20)).error is None
    assert walks == [0.0]
    assert limited_sandbox.write(f"{root}/w5", "x" * (5 << 20)).error == p.NO_SPACE  # 17 MiB past 16
    now[0] = USAGE_FRESH
    limited_sandbox.execute(f"rm -f {root}/w*")  # seen by the next walk
    assert limited_sandbox.write(f"{root}/w5", "x" * (5 << 20)).error is None
    assert walks == [0.0, USAGE_FRESH]
    limited_sandbox.execute(f"rm -f {root}/w*")
