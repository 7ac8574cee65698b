"""Pseudo-files every sandbox must read (`PseudoFiles`, part of `SandboxConformance`): a regular
file of ``/proc`` or ``/sys`` says a size of 0 (or a page) whatever it holds, and is read to its
end within the bounds of any read; a device or a FIFO is refused at once, never opened."""

from __future__ import annotations

import shlex
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from sandboxes import protocol as p

__all__ = ["PseudoFiles"]

BOOT_ID = "/proc/sys/kernel/random/boot_id"
STATUS = "/proc/self/status"
REFUSED_WITHIN = 20.0
"""Seconds in which a refusal of a device or a FIFO must come (a blocked read never would)."""


class PseudoFiles:
    """``read`` and ``download_files`` of pseudo-files and special files; the ``sandbox`` and
    ``root`` fixtures are `SandboxConformance`'s."""

    def test_pseudo_files_are_read_to_their_end(self, sandbox: p.SandboxBackendProtocol) -> None:
        """``boot_id`` (which says it is empty) reads as ``cat`` prints it, by download and by
        read; ``/proc/self/status`` (empty too) is the reader's whole status."""
        printed = sandbox.execute(f"cat {BOOT_ID}")
        assert printed.exit_code == 0, printed
        assert len(printed.output.strip()) == 36, printed
        [boot_id, status] = sandbox.download_files([BOOT_ID, STATUS])
        assert (boot_id.error, boot_id.content) == (None, printed.output.encode()), boot_id
        assert status.error is None, status
        assert status.content is not None
        assert status.content.startswith(b"Name:\t"), status.content[:100]
        assert b"\nPid:\t" in status.content, status.content
        assert status.content.endswith(b"\n"), status.content
        read = sandbox.read(BOOT_ID)
        assert read.error is None, read
        assert read.file_data is not None
        assert read.file_data.content == printed.output
        read = sandbox.read(STATUS, limit=3)
        assert read.error is None, read
        assert read.file_data is not None
        assert read.file_data.content.startswith("Name:\t"), read

    def test_devices_and_fifos_are_refused_at_once(self, sandbox: p.SandboxBackendProtocol, root: str) -> None:
        """``/dev/zero`` and ``/dev/urandom`` never end and a FIFO nobody writes never starts:
        each answers ``invalid_argument``, by download and by read, without blocking."""
        made = sandbox.execute(f"mkdir -p {shlex.quote(root)} && mkfifo {shlex.quote(root)}/fifo && echo ok")
        assert made.output == "ok\n", made
        paths = ["/dev/zero", "/dev/urandom", f"{root}/fifo"]
        with ThreadPoolExecutor(1) as pool:
            began = time.monotonic()
            downloads = pool.submit(sandbox.download_files, paths)
            reads = pool.submit(lambda: [sandbox.read(path).error for path in paths])
            try:
                found, errors = downloads.result(REFUSED_WITHIN), reads.result(REFUSED_WITHIN)
            except TimeoutError:
                sandbox.execute(f"cat {shlex.quote(root)}/fifo > /dev/null", timeout=10)  # unblock it to end the test
                pytest.fail("a read of a device or a FIFO blocked")
        assert [(r.error, r.content) for r in found] == [(p.INVALID_ARGUMENT, None)] * 3, found
        assert errors == [p.INVALID_ARGUMENT] * 3
        assert all("not a regular file" in (r.message or "") for r in found), found
        assert time.monotonic() - began < REFUSED_WITHIN

    def test_a_pseudo_file_is_read_within_its_bounds(self, sandbox: p.SandboxBackendProtocol) -> None:
        """``/proc/self/status`` says 0 bytes and holds about a kilobyte: a read of one line is
        its first line alone; and where the handle takes a per-call byte bound
        (``download_files_within``: a sandbox, not a client of the service, whose bound is the
        service's), under 64 bytes it is ``file_too_large`` with no content, as a big regular
        file is."""
        first = sandbox.read(STATUS, limit=1)
        assert first.error is None, first
        assert first.file_data is not None
        assert first.file_data.content.startswith("Name:\t"), first
        assert "\n" not in first.file_data.content.rstrip("\n"), first
        within = getattr(sandbox, "download_files_within", None)
        if within is None:
            return
        [status, boot_id] = within([STATUS, BOOT_ID], 64)
        assert (status.error, status.content) == (p.FILE_TOO_LARGE, None), status
        assert "larger than 64 bytes" in (status.message or ""), status
        assert boot_id.error is None, boot_id
        assert boot_id.content is not None
        assert len(boot_id.content) == 37, boot_id
