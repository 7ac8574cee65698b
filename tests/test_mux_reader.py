"""How the client reads the helper's stream (`sandboxes._mux._reader`): a big frame whose header
arrived alone (the helper writes a relay's header, then splices its payload) is completed by
one read of exactly its rest, which is handed on as it was read, not copied. The real helper,
over pipes; only the frame is staged, between two of its own (`_StagedStream`)."""

from __future__ import annotations

import threading
from collections import deque

from test_mux import _PipeStream

from sandboxes._helper.frames import HEADER, OUTPUT
from sandboxes._mux import Command, MuxClient
from sandboxes._mux._channel import open_channel


class _StagedStream(_PipeStream):
    """The real helper's pipes, plus pieces of a frame staged to arrive after its next read,
    one read each (cut to what the read asks for); the sizes the client asked for them."""

    def __init__(self) -> None:
        super().__init__()
        self.staged: deque[bytes] = deque()
        self.asked: list[int] = []
        self.handed: list[bytes] = []
        self._lock = threading.Lock()

    def recv(self, size: int) -> bytes:
        with self._lock:
            if self.staged:
                self.asked.append(size)
                piece = self.staged.popleft()
                if len(piece) > size:
                    self.staged.appendleft(piece[size:])
                    piece = piece[:size]
                self.handed.append(piece)
                return piece
        return super().recv(size)


def test_a_big_frame_whose_header_came_alone_is_read_in_one_piece_and_not_copied() -> None:
    stream = _StagedStream()
    mux = MuxClient(stream)
    got: list[bytes] = []
    echoed, arrived = threading.Event(), threading.Event()
    payload = bytes(range(256)) * 800  # 200 KiB: more than a read asks for by default

    def on_output(chunk: bytes, _stream: str) -> None:
        got.append(chunk)
        echoed.set()
        if sum(len(part) for part in got) >= 4 + len(payload):
            arrived.set()

    try:
        channel = open_channel(mux, Command("cat", timeout=30, output_limit=0), on_output=on_output)
        channel.write(b"a\n")  # started, and its echo read: the stream is quiet
        assert echoed.wait(10)
        with stream._lock:  # a header alone, then the payload, after the helper's next frame
            stream.staged.extend([HEADER.pack(OUTPUT, channel.ident, len(payload)), payload])
        channel.write(b"e\n")
        assert arrived.wait(10)
        big = [chunk for chunk in got if len(chunk) > 2]
        assert big == [payload]
        assert stream.asked[1:] == [len(payload)]  # after the header: exactly its rest, at once
        assert big[0] is stream.handed[-1]  # the read itself, handed on
        channel.kill()
        channel.wait(10)
    finally:
        mux.close()
        stream.close()
