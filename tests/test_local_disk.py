"""LocalSandbox's disk bound for commands (`sandboxes.local._disk`): started by root, a sandbox
that owns its root keeps it and its /tmp in a loop-mounted image of ``disk`` bytes, so commands
cannot write past it; elsewhere the bound stays per file, and says so."""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from support import HAS_BWRAP, needs

from sandboxes.lifecycle import CreateOptions
from sandboxes.local import LocalSandbox, LocalSandboxConfig, _disk
from sandboxes.local.provider import LocalProvider

DISK = 64 << 20


def _loop_images() -> str:
    """Every attached loop device's backing file (a deleted one included)."""
    return subprocess.run(["losetup", "-l", "-n", "-O", "BACK-FILE"], check=True, capture_output=True, text=True).stdout


def _mounted(path: Path) -> bool:
    return f" {path} " in Path("/proc/self/mountinfo").read_text()


def _assert_released(root: Path) -> None:
    image = _disk.image_of(root)
    assert not image.exists()
    assert str(image) not in _loop_images()
    assert not _mounted(root)
    assert not _mounted(image.with_name(image.name + ".d"))
    assert not root.exists()


@pytest.fixture
def bounded(tmp_path: Path) -> Iterator[LocalSandbox]:
    needs(HAS_BWRAP, "bubblewrap (bwrap) is not installed")
    needs(_disk.available() is None, f"sandbox disk images unavailable: {_disk.available()} (CI runs as root)")
    config = LocalSandboxConfig(root_dir=tmp_path / "root", isolation="bwrap", disk=DISK)
    sandbox = LocalSandbox.create(config)
    yield sandbox
    sandbox.destroy()


def test_commands_cannot_write_past_the_disk_bound(bounded: LocalSandbox) -> None:
    root = bounded.root
    for target in (f"{root}/big", "/tmp/big"):
        big = bounded.execute(f"dd if=/dev/zero of={target} bs=1M count=200", timeout=60)
        assert big.exit_code != 0, big
        assert "No space left on device" in big.output, big
        bounded.execute("rm -f /tmp/big")  # each target on its own fills the image
    filled = bounded.execute(f"dd if=/dev/zero of={root}/a bs=1M count=200; dd if=/dev/zero of=/tmp/b bs=1M count=200")
    assert filled.output.count("No space left on device") == 2, filled
    used = bounded.execute(f"du -s -B1 {root} /tmp | cut -f1").output.split()
    assert sum(int(size) for size in used) <= DISK, used
    bounded.execute(f"rm -f {root}/a /tmp/b")
    assert bounded.write(f"{root}/note.txt", "kept").error is None
    assert bounded.execute(f"cat {root}/note.txt; echo t > /tmp/t; cat /tmp/t").output == "keptt\n"
    assert (root / "note.txt").read_text() == "kept"  # the caller sees the same files on the host
    assert not (root / "lost+found").exists()
    image = _disk.image_of(root)
    assert str(image) in _loop_images()
    bounded.destroy()
    _assert_released(root)


def test_two_handles_on_one_sandbox_have_their_own_tmp(bounded: LocalSandbox) -> None:
    assert bounded.execute("echo mine > /tmp/a").exit_code == 0
    other = LocalSandbox(config=bounded.config)  # attached: the same image, another jail
    try:
        assert other.execute("test -e /tmp/a").exit_code == 1
        assert other.execute(f"echo shared > {bounded.root}/b; echo theirs > /tmp/c").exit_code == 0
    finally:
        other.close()
    mine = bounded.execute(f"cat /tmp/a {bounded.root}/b; test -e /tmp/c")
    assert (mine.output, mine.exit_code) == ("mine\nshared\n", 1)


def test_a_destroyed_disk_is_released_while_other_jails_run(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A jail started while another sandbox's image was mounted does not keep it busy."""
    caplog.set_level(logging.WARNING, logger=_disk.__name__)
    needs(HAS_BWRAP, "bubblewrap (bwrap) is not installed")
    needs(_disk.available() is None, f"sandbox disk images unavailable: {_disk.available()} (CI runs as root)")
    with LocalProvider(tmp_path / "base", isolation="bwrap", disk=DISK) as provider:
        first, second = provider.create(), provider.create()
        try:
            assert first.execute("echo one").output == "one\n"
            assert second.execute("echo two").output == "two\n"  # its jail started after first's mount
            root = first.root
            first.destroy()
            _assert_released(root)
            assert "stays attached" not in caplog.text
            assert provider.attach(second.id).execute("echo still").output == "still\n"
        finally:
            second.destroy()
        _assert_released(second.root)
        assert os.listdir(tmp_path / "base") == []


def test_a_sandbox_attached_again_keeps_its_files_in_its_image(tmp_path: Path) -> None:
    needs(HAS_BWRAP, "bubblewrap (bwrap) is not installed")
    needs(_disk.available() is None, f"sandbox disk images unavailable: {_disk.available()} (CI runs as root)")
    provider = LocalProvider(tmp_path / "base", isolation="bwrap", disk=DISK)
    sandbox = provider.create()
    sandbox.execute(f"echo kept > {sandbox.root}/f")
    sandbox.close()
    subprocess.run(["umount", str(sandbox.root)], check=True)  # as after a reboot
    again = provider.attach(sandbox.id)
    try:
        assert again.execute(f"cat {again.root}/f").output == "kept\n"
        assert "No space left" in again.execute(f"dd if=/dev/zero of={again.root}/big bs=1M count=200").output
    finally:
        again.destroy()
    _assert_released(again.root)


def test_a_sweep_after_a_restart_reaps_an_expired_sandbox_and_its_image(tmp_path: Path) -> None:
    needs(HAS_BWRAP, "bubblewrap (bwrap) is not installed")
    needs(_disk.available() is None, f"sandbox disk images unavailable: {_disk.available()} (CI runs as root)")
    base = tmp_path / "base"
    sandbox = LocalProvider(base, isolation="bwrap", disk=DISK).create(CreateOptions(ttl=60))
    sandbox.execute("echo x > f")
    sandbox.close()  # as if its process died: the image stays mounted for whoever attaches next
    assert _mounted(sandbox.root)
    report = LocalProvider(base, isolation="bwrap", disk=DISK).sweep(now=time.time() + 120)
    assert report.removed == [str(sandbox.root)], report
    _assert_released(sandbox.root)
    assert os.listdir(base) == []


def test_without_loop_devices_the_bound_is_per_file_and_said(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    needs(HAS_BWRAP, "bubblewrap (bwrap) is not installed")
    monkeypatch.setattr(_disk, "available", lambda: "no /dev/loop-control (loop devices unavailable)")
    monkeypatch.setattr(_disk, "_warned", [])
    config = LocalSandboxConfig(root_dir=tmp_path / "root", isolation="bwrap", disk=DISK)
    with caplog.at_level(logging.WARNING, logger=_disk.__name__), LocalSandbox.create(config) as sandbox:
        assert "no /dev/loop-control" in caplog.text
        assert not _disk.image_of(sandbox.root).exists()
        # each file is bounded, the total is not
        one = sandbox.execute(f"head -c {DISK * 2} /dev/zero > {sandbox.root}/one")
        assert one.exit_code != 0
        two = sandbox.execute(f"head -c {DISK - 1} /dev/zero > {sandbox.root}/a; head -c {DISK - 1} /dev/zero > /tmp/b")
        assert two.exit_code == 0, two


def test_an_image_that_cannot_be_made_leaves_nothing_and_falls_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    needs(HAS_BWRAP, "bubblewrap (bwrap) is not installed")
    needs(_disk.available() is None, f"sandbox disk images unavailable: {_disk.available()} (CI runs as root)")
    real_run = _disk._run

    def failing_mount(*argv: str) -> None:
        if argv[0] == "mount" and "--bind" in argv:
            raise OSError("mount --bind failed: refused by the test")
        real_run(*argv)

    monkeypatch.setattr(_disk, "_run", failing_mount)
    monkeypatch.setattr(_disk, "_warned", [])
    config = LocalSandboxConfig(root_dir=tmp_path / "root", isolation="bwrap", disk=DISK)
    with caplog.at_level(logging.WARNING, logger=_disk.__name__), LocalSandbox.create(config) as sandbox:
        assert "refused by the test" in caplog.text
        assert sorted(os.listdir(tmp_path)) == ["root"]
        assert str(_disk.image_of(sandbox.root)) not in _loop_images()
        assert sandbox.execute("echo ok > f; cat f").output == "ok\n"


_CREATE_AND_WAIT = """
import sys
from sandboxes.local import LocalSandbox
sandbox = LocalSandbox.create()
print(sandbox.root, flush=True)
sys.stdin.read()  # until killed
"""


def test_an_image_left_by_a_killed_process_is_reclaimed_at_the_next_start(tmp_path: Path) -> None:
    """A process killed (-9) while it holds a sandbox of ``LocalSandbox.create()`` leaves its
    image mounted; the next `LocalProvider` to start releases it, and not a live one's."""
    needs(HAS_BWRAP, "bubblewrap (bwrap) is not installed")
    needs(_disk.available() is None, f"sandbox disk images unavailable: {_disk.available()} (CI runs as root)")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path.cwd()), os.environ.get("PYTHONPATH", "")])}
    with subprocess.Popen(
        [sys.executable, "-c", _CREATE_AND_WAIT], stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env
    ) as child:
        assert child.stdout is not None
        root = Path(child.stdout.readline().decode().strip())
        live = LocalSandbox.create()
        try:
            assert _mounted(root), f"{root} was not mounted by its sandbox"
            child.kill()
            child.wait(30)
            assert _mounted(root), "the image was released though its process was killed"
            LocalProvider(tmp_path / "base")
            _assert_released(root)
            assert not root.with_name(root.name + ".sandbox-lock").exists()
            assert _mounted(live.root), "a live sandbox's image was reclaimed"
        finally:
            child.kill()
            live.destroy()
            _disk.release(root)
            shutil.rmtree(root, ignore_errors=True)
        _assert_released(live.root)


def test_a_write_on_an_image_is_bounded_by_its_filesystem_not_a_walk_of_the_tree(
    bounded: LocalSandbox, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The image's filesystem is the bound: file operations answer ``no_space`` from it, never
    walk the sandbox's tree to count what it holds (a cost that grew with the tree)."""

    def walked(*tops: Path) -> int:
        raise AssertionError(f"the tree was walked: {tops}")

    monkeypatch.setattr("sandboxes.local.sandbox.disk_usage", walked)
    root = bounded.root
    assert bounded.write(f"{root}/small.txt", "kept").error is None
    assert bounded.write(f"{root}/too-big", "x" * (DISK + 1)).error == "no_space"
    first, second = bounded.upload_files([(f"{root}/a", b"a" * (40 << 20)), (f"{root}/b", b"b" * (40 << 20))])
    assert (first.error, second.error) == (None, "no_space")
    assert bounded.download_files([f"{root}/a"])[0].content == b"a" * (40 << 20)
    assert sorted(os.listdir(root)) == ["a", "small.txt"]  # nothing half-written is left
    assert bounded.read(f"{root}/small.txt").file_data is not None
