"""Names and contents that have broken sandboxes before: shell metacharacters, option-like
names, newlines, unicode, and binary bytes. Every backend must store and return them intact."""

from __future__ import annotations

HOSTILE_NAMES: tuple[str, ...] = (
    "plain.txt",
    "with space.txt",
    "  leading and trailing  ",
    "single'quote",
    'double"quote',
    "back\\slash",
    "$(touch PWNED)",
    "`touch PWNED`",
    "${IFS}dollar",
    "semi;colon&amp|pipe",
    "star*and?question[x]",
    "-n",
    "--help",
    "-rf",
    "new\nline",
    "tab\there",
    "carriage\rreturn",
    "colon:12:colon",
    "unicode-ünïcødé-日本語-🦀",
    "brace{a,b}",
    "percent%s%n",
    "~tilde",
    ".hidden",
    "!bang",
    "#hash",
    "a" * 200,
)
"""File names (single path components). ``PWNED`` is the canary: if any backend ever runs a
name as a command, a file of that name appears and the suite fails."""

CANARY = "PWNED"

BINARY_SAMPLES: tuple[bytes, ...] = (
    bytes(range(256)),
    b"\x00",
    b"\xff\xfe\x00\x00garbage\x80\x81",
    b"text then NUL\x00 then text\n",
    b"\r\n\r\n\x00",
)
