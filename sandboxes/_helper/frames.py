"""The exec helper's frames, as both sides know them: the header (1 byte kind, 4 bytes command
id, 4 bytes payload length, big endian; then the payload) and every kind, by name. Imported by
the helper (`_server` and its modules) and by its client (`sandboxes._mux`), so that a kind is
spelled once. What each means, both ways, is `_server`'s docstring.
"""

import struct

HEADER = struct.Struct(">cII")

# client -> helper
PING = b"P"
"""Answered by `HELLO`; the helper never speaks first."""
RUN = b"R"
"""Run a command: its spec, `marshal`'d (with ``watch``: a file watch instead, `_watch`)."""
STDIN = b"I"
"""Bytes for a command's stdin, or a file op's upload."""
CLOSE_STDIN = b"C"
"""The end of a command's stdin, or of a file op's bytes."""
KILL = b"K"
"""Kill a command (its timeout, the client's), or abort a file op."""
KILL_MARKED = b"M"
"""Kill every process of the sandbox carrying a marker (``{name, value}``, `marshal`'d)."""
FILE_OP = b"F"
"""A file op without a process (``{"op": [name, args...]}``, `marshal`'d)."""
RESIZE = b"Z"
"""A terminal's new size (``{cols, rows}``, `marshal`'d) for a command started on one (``pty``
in its spec: `_pty`); nothing for another command."""
GRANT = b"G"
"""A relayed connection's bytes taken (4 bytes, big endian): from the client, what its consumer
took of the helper's O frames; from the helper, what it wrote to the socket of the client's I
frames, and first the window the client may send ahead once connected (`_relay`)."""
CLIENT_KINDS = PING + RUN + STDIN + CLOSE_STDIN + KILL + KILL_MARKED + FILE_OP + RESIZE + GRANT
"""Every kind a client sends: anything else is a corrupt stream."""

# helper -> client
HELLO = b"H"
"""The answer to `PING`: the helper's facts, as JSON."""
ACCEPTED = b"A"
"""A command or file op is taken (queued before it starts; its absence proves nothing)."""
OUTPUT = b"O"
"""Bytes of a command's stdout, or of a file op's answer."""
STDERR = b"S"
"""Bytes of a command's stderr (its stdout's are `OUTPUT`'s), in the order the helper read them
among its stdout's: the client merges them so for a merged answer."""
EXIT = b"X"
"""The end of a command or file op: JSON ``{code, timed_out}``."""
ERROR = b"E"
"""A request the helper could not run: its reason, as text."""
NOT_NATIVE = b"N"
"""A file op the helper hands back: nothing was done, the client runs the script."""
HELPER_KINDS = HELLO + ACCEPTED + OUTPUT + STDERR + EXIT + ERROR + NOT_NATIVE + GRANT
"""Every kind a helper sends: anything else is a corrupt (or forged) stream."""
