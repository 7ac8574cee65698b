"""A command's stdout read through the exec helper as a stream (`sandboxes._mux.SpooledOutput`,
a local jail's ``open_output_stream``): every byte, in order, however the reads are cut, its
stderr apart; a command further ahead of its reader than the bound is killed and the read that
finds it raises ``EFBIG``, never holding more."""

from __future__ import annotations

import errno
import hashlib
from collections.abc import Iterator

import pytest
from support import HAS_BWRAP, needs

from sandboxes._mux import MuxClient, SpooledOutput
from sandboxes.local import LocalSandbox


@pytest.fixture(scope="module")
def jail() -> Iterator[LocalSandbox]:
    needs(HAS_BWRAP, "bubblewrap is not installed")
    with LocalSandbox.create() as sandbox:
        yield sandbox


def _mux(jail: LocalSandbox) -> MuxClient:
    mux = jail.exec_helper()
    assert mux is not None
    return mux


def test_every_byte_arrives_in_order_and_stderr_apart(jail: LocalSandbox) -> None:
    stream = jail.open_output_stream("head -c 3000000 /dev/urandom | tee /tmp/sent; printf oops >&2")
    received = hashlib.sha256()
    try:
        while chunk := stream.recv(7777):
            received.update(chunk)
        assert stream.exit_code() == 0
    finally:
        stream.close()
    sent = jail.execute("sha256sum /tmp/sent", timeout=30)
    assert sent.output.split()[0] == received.hexdigest()
    assert stream.stderr == b"oops"


def test_a_command_too_far_ahead_of_its_reader_is_refused(jail: LocalSandbox) -> None:
    stream = SpooledOutput(_mux(jail), "head -c 3000000 /dev/zero", limit=1 << 20, timeout=60)
    try:
        assert stream.exit_code() == 0  # ended, none of it read: all of it ahead of the reader
        with pytest.raises(OSError) as refused:
            stream.recv(1 << 16)
        assert refused.value.errno == errno.EFBIG
    finally:
        stream.close()
