"""Sparse, endless and special files made in a sandbox (`sandboxes.base`: ``read`` and
``download_files`` on the helper's native ops and on the scripts): what they cost the caller is
bounded by the bounds, not by what the sandbox made; pseudo-files are read to their end within
them, devices and FIFOs are refused."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from support import HAS_BWRAP, needs

from sandboxes import _scripts
from sandboxes import protocol as p
from sandboxes.base import READ_SCAN_BYTES
from sandboxes.local import LocalSandbox, LocalSandboxConfig

GROWTH = 256 << 20
"""The most a caller's peak memory may grow by for any of these files."""


def reset_peak(pid: int | str = "self") -> int:
    """Reset the process's peak resident size (``VmHWM``) to its current one; that size, in bytes."""
    Path(f"/proc/{pid}/clear_refs").write_text("5")
    return peak(pid)


def peak(pid: int | str = "self") -> int:
    """The process's peak resident size since the last `reset_peak`, in bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM in /proc/PID/status")


@pytest.fixture(scope="module", params=["native", "scripts"])
def sandbox(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalSandbox]:
    """A jailed local sandbox with its exec helper, file ops done natively or by the scripts,
    holding a 1 GiB sparse file, 64 MiB of newlines, a FIFO and a link to an endless file."""
    needs(HAS_BWRAP, "bubblewrap (bwrap) is not installed: the isolated LocalSandbox is not testable")
    root = tmp_path_factory.mktemp("hostile")
    with LocalSandbox(config=LocalSandboxConfig(root_dir=root, isolation="bwrap")) as sb:
        sb.native_file_ops = request.param == "native"
        made = sb.execute(
            "truncate -s 1G sparse && head -c 67108864 /dev/zero | tr '\\0' '\\n' > newlines"
            " && mkfifo fifo && ln -s /proc/self/pagemap endless && printf 'a\\nb\\n' > small",
            timeout=60,
        )
        assert made.exit_code == 0, made
        yield sb


def test_read_of_a_file_of_newlines_is_paginated(sandbox: LocalSandbox) -> None:
    reset_peak()
    start = peak()
    result = sandbox.read(f"{sandbox.root}/newlines", limit=10)
    assert result.error is None, result
    assert result.file_data is not None
    assert result.file_data.content == "\n" * 10
    assert (result.start_line, result.end_line, result.next_offset) == (1, 10, 10)
    assert peak() - start < GROWTH


def test_read_of_a_big_sparse_file_answers_at_once_with_bounded_memory(sandbox: LocalSandbox) -> None:
    reset_peak()
    start, began = peak(), time.monotonic()
    result = sandbox.read(f"{sandbox.root}/sparse", limit=10)
    assert result.error == p.FILE_TOO_LARGE, result
    assert time.monotonic() - began < 10
    assert peak() - start < GROWTH


def test_read_past_what_read_looks_at_is_cut_in_the_sandbox(sandbox: LocalSandbox) -> None:
    """A window past the first `READ_SCAN_BYTES` (one byte a line here) is found in the sandbox,
    with the file's number of lines; memory stays bounded."""
    reset_peak()
    start = peak()
    lines = 64 << 20
    result = sandbox.read(f"{sandbox.root}/newlines", offset=lines - 5, limit=10)
    assert result.error is None, result
    assert result.file_data is not None
    assert result.file_data.content == "\n" * 5
    assert (result.total_lines, result.end_line, result.next_offset) == (lines, lines, None)
    inside = sandbox.read(f"{sandbox.root}/newlines", offset=READ_SCAN_BYTES - 20, limit=10)
    assert (inside.error, inside.next_offset) == (None, READ_SCAN_BYTES - 10)
    assert peak() - start < GROWTH


def test_download_past_the_bound_is_refused_without_pulling_the_file(sandbox: LocalSandbox) -> None:
    reset_peak()
    start = peak()
    [big, small] = sandbox.download_files([f"{sandbox.root}/sparse", f"{sandbox.root}/small"])
    assert (big.error, big.content) == (p.FILE_TOO_LARGE, None), big.message
    assert (small.error, small.content) == (None, b"a\nb\n")
    assert peak() - start < GROWTH
    assert sandbox.download_files_within([f"{sandbox.root}/small"], 3)[0].error == p.FILE_TOO_LARGE


@pytest.mark.parametrize("name", ["/dev/zero", "fifo"])
def test_devices_and_fifos_are_refused(sandbox: LocalSandbox, name: str) -> None:
    """A FIFO would block and ``/dev/zero`` never ends: each answers ``invalid_argument``, at once."""
    path = name if name.startswith("/") else f"{sandbox.root}/{name}"
    reset_peak()
    start, began = peak(), time.monotonic()
    [answer] = sandbox.download_files([path])
    assert (answer.error, answer.content) == (p.INVALID_ARGUMENT, None), answer
    assert time.monotonic() - began < 10
    assert peak() - start < GROWTH


@pytest.mark.parametrize("name", ["/proc/self/pagemap", "endless"])
def test_an_endless_pseudo_file_is_bounded(sandbox: LocalSandbox, name: str) -> None:
    """``/proc/self/pagemap`` says it is empty and reads ~256 GB (through a link too): at most
    the bound of it is taken, at once, with bounded memory, whatever it answers."""
    path = name if name.startswith("/") else f"{sandbox.root}/{name}"
    reset_peak()
    start, began = peak(), time.monotonic()
    [answer] = sandbox.download_files_within([path], 1 << 20)
    assert answer.error in (None, p.FILE_TOO_LARGE, p.PERMISSION_DENIED), answer
    assert answer.content is None or len(answer.content) <= 1 << 20
    assert time.monotonic() - began < 10
    assert peak() - start < GROWTH


def test_a_pseudo_file_is_read_to_its_end(sandbox: LocalSandbox) -> None:
    """``/proc/self/status`` says it is empty: it is the reader's whole status, or too large
    past a bound smaller than it."""
    [status] = sandbox.download_files(["/proc/self/status"])
    assert status.error is None, status
    assert status.content is not None
    assert status.content.startswith(b"Name:\t"), status
    assert b"\nVmHWM:\t" in status.content or b"\nPid:\t" in status.content
    [cut] = sandbox.download_files_within(["/proc/self/status"], 64)
    assert (cut.error, cut.content) == (p.FILE_TOO_LARGE, None), cut


def test_a_window_past_the_scan_of_a_pseudo_file_is_too_large(sandbox: LocalSandbox) -> None:
    """`_scripts.READ_LINES` counts a file's lines, reading it whole: it comes only after more
    than its last argument's bytes were read, so a file whose size says no more (a pseudo-file)
    answers 17 (too large) rather than being counted; a regular file is counted as before."""
    pseudo = sandbox.execute(_scripts.command(_scripts.READ_LINES, "/proc/self/status", "1", "2", "100"))
    assert pseudo.exit_code == _scripts.EXIT_TOO_LARGE, pseudo
    regular = sandbox.execute(_scripts.command(_scripts.READ_LINES, f"{sandbox.root}/small", "2", "1", "2"))
    assert (regular.exit_code, regular.output) == (0, "2\nYgo=\n"), regular
