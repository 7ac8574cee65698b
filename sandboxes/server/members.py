"""The members of a tar stream going out (``GET /archive``), read from their headers as the
stream passes, so that no member bigger than a bound leaves the service, whoever made the tar
(the service, or ``tar`` in the sandbox, whose output is hostile).

`MemberBound` reads each 512-byte header block: its checksum (a block that is not a header is
a stream out of step, refused), its type and size, a pax extended header's ``size`` record,
which overrides the next member's, and skips the member's data by that size. Linear in the
stream: each byte is looked at once, and a header's own data (pax records, GNU long names) is
held only up to `META_MAX` bytes.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable

from sandboxes.server.errors import ServiceError
from sandboxes.server.streams import Emit

__all__ = ["META_MAX", "MemberBound", "bounded_members", "started"]

BLOCK = 512
META_MAX = 1 << 20
"""Largest pax header or GNU long name a stream may carry."""
_META = frozenset(b"xgLK")
"""Header types whose data describes the next member (pax, pax global, GNU long name, link)."""
_CONTENT = frozenset(b"0\x0078S")
"""Header types whose data is a file's content (regular, old regular, contiguous, GNU sparse)."""


class MemberBound:
    """Fed a tar stream in order, refuses it (`ServiceError` ``too_large``) at the header of the
    first member of more than ``limit`` bytes, before any of its data."""

    def __init__(self, limit: int, what: str) -> None:
        self._limit = limit
        self._what = what
        self._header = bytearray()
        self._skip = 0
        self._meta: bytearray | None = None
        self._meta_size = 0
        self._next_size: int | None = None

    def feed(self, data: bytes) -> None:
        view, at = memoryview(data), 0
        while at < len(view):
            if self._skip:
                taken = min(self._skip, len(view) - at)
                if self._meta is not None and len(self._meta) < self._meta_size:
                    self._meta += view[at : at + min(taken, self._meta_size - len(self._meta))]
                self._skip -= taken
                at += taken
                if not self._skip and self._meta is not None:
                    self._end_meta()
                continue
            taken = min(BLOCK - len(self._header), len(view) - at)
            self._header += view[at : at + taken]
            at += taken
            if len(self._header) == BLOCK:
                self._read_header(bytes(self._header))
                self._header.clear()

    def _read_header(self, header: bytes) -> None:
        if header == bytes(BLOCK):  # the end-of-archive blocks
            return
        if _checksum(header) != _number(header[148:156]):
            raise ServiceError("backend_unavailable", f"the archive of {self._what} came back garbled")
        kind, size = header[156], _number(header[124:136])
        if kind in _META:
            if size > META_MAX:
                raise ServiceError("too_large", f"the archive of {self._what} has a header of {size} bytes")
            self._meta, self._meta_size = bytearray(), size
        else:
            size = self._next_size if self._next_size is not None else size
            self._next_size = None
            if kind in _CONTENT and size > self._limit:
                raise ServiceError(
                    "too_large",
                    f"the archive of {self._what} holds a file of {size} bytes, over the "
                    f"{self._limit} a file may have (max_archive_file_bytes); archive less, or split it",
                )
        self._skip = -(-size // BLOCK) * BLOCK
        if not self._skip and self._meta is not None:
            self._end_meta()

    def _end_meta(self) -> None:
        """A meta header's data is in: a pax header's ``size`` applies to the next member."""
        assert self._meta is not None
        size = _pax_size(bytes(self._meta))
        if size is not None:
            self._next_size = size
        self._meta = None


def bounded_members(produce: Callable[[Emit], None], limit: int, what: str) -> Callable[[Emit], None]:
    """``produce`` (a tar stream's producer) whose stream is cut, with ``too_large``, at the
    header of the first member bigger than ``limit`` bytes."""

    def bounded(emit: Emit) -> None:
        bound = MemberBound(limit, what)

        def checked(chunk: bytes) -> None:
            bound.feed(chunk)
            emit(chunk)

        produce(checked)

    return bounded


async def started(chunks: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    """``chunks`` with its first chunk already pulled: a refusal there (the first member's)
    raises here, while the request can still be answered with an error."""
    first = await anext(chunks, None)
    return _from(first, chunks)


async def _from(first: bytes | None, rest: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    if first is None:
        return
    yield first
    async for chunk in rest:
        yield chunk


def _checksum(header: bytes) -> int:
    return sum(header[:148]) + 8 * 0x20 + sum(header[156:])


def _number(field: bytes) -> int:
    """A header's numeric field: octal text, or base-256 (GNU) when its first bit is set."""
    if field[0] & 0x80:
        return int.from_bytes(bytes([field[0] & 0x7F]) + field[1:], "big")
    text = field.split(b"\0", 1)[0].strip(b" ")
    try:
        return int(text or b"0", 8)
    except ValueError:
        return -1  # never a checksum; as a size, refused by the checksum first


def _pax_size(records: bytes) -> int | None:
    """The ``size`` of pax records (``LEN key=value\\n`` each), if one says it."""
    at, size = 0, None
    while at < len(records):
        space = records.find(b" ", at, at + 20)
        if space < 0 or not records[at:space].isdigit():
            break
        length = int(records[at:space])
        if length <= space - at:
            break
        key, _, value = records[space + 1 : at + length - 1].partition(b"=")
        if key == b"size" and value.isdigit():
            size = int(value)
        at += length
    return size
