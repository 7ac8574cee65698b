"""The exec helper as shipped into a sandbox: one script assembled from the files beside this
one (`SERVER_SOURCE`, carrying `NATIVE_SOURCE` as a string), and how python3 runs it
(`PYTHON_FLAGS`).

Apart from the client (`sandboxes._mux.client`) because it is what runs in the sandbox, not what
talks to it: every transport that starts a helper takes its source and flags from here (through
`sandboxes._mux`), and which files make the script, in which order, is decided in one place. The
parts share one global namespace and run top to bottom, so a part comes after those whose names
it uses while it is being run, and `_server`, which ends by calling its ``main()``, comes last.
"""

from __future__ import annotations

import binascii
import zlib
from pathlib import Path

__all__ = ["COMPACT_SOURCE", "NATIVE_SOURCE", "PYTHON_FLAGS", "SERVER_SOURCE"]

_HERE = Path(__file__).parent


def _joined(*paths: Path) -> str:
    return "\n".join(path.read_text(encoding="utf-8") for path in paths)


NATIVE_SOURCE = _joined(
    _HERE / "_search.py", _HERE / "_listing.py", _HERE / "_files.py", _HERE / "_uploads.py", _HERE / "_reads.py"
)
"""The helper's file ops without a process: its reads and writes (`_files`, `_uploads`,
`_reads`), its searches (`_search`), its listings and deletes (`_listing`). Shipped inside
`SERVER_SOURCE` as a string, compiled by the helper once it idles or at its first file op
(`_server._load_native`): they are 45% of the helper's source, and compiling them cost every
helper's start 3.5 ms (of 7.6 in the runtime image) before its first command."""

SERVER_SOURCE = f"_NATIVE_SOURCE = {NATIVE_SOURCE!r}\n" + _joined(
    _HERE.parent / "_kill.py", _HERE / "_reap.py", _HERE / "_spawn.py", _HERE / "_command.py", _HERE / "_server.py"
)
"""Shipped as ``python3 -I -S -u -c SERVER_SOURCE`` (`PYTHON_FLAGS`): nothing is installed in the
sandbox. One script: the helper (`_server`), a command's life in it (`_command`), how it starts
commands' shells, cold or ahead of time (`_spawn`), how it finds what commands left behind
(`_reap`), the one process-tree kill every backend uses (`sandboxes._kill`), and `NATIVE_SOURCE`
as a string."""

_PACKED = binascii.b2a_base64(zlib.compress(SERVER_SOURCE.encode("utf-8"), 9), newline=False).decode("ascii")
COMPACT_SOURCE = f"import zlib,binascii;exec(zlib.decompress(binascii.a2b_base64({_PACKED!r})))"
"""`SERVER_SOURCE` compressed behind a one-line bootstrap, for a transport that passes the script
inside a shell command (SSH): no quote in it to escape, and well under the kernel's limit on one
argument (``MAX_ARG_STRLEN``, 128 KiB) that the whole script quoted twice no longer is."""

PYTHON_FLAGS = ("-I", "-S", "-u")
"""How python3 runs the helper: unbuffered, isolated (``-I``), without `site` (``-S``). Without
``-I``, ``python3 -c`` puts its working directory first on ``sys.path`` and follows
``PYTHONPATH``: a command that wrote ``json.py`` into the workspace (the helper's cwd) shadowed
the stdlib, the helper died at its start, and the sandbox fell back to one exec per command for
good (Docker: 35 ms a command instead of ~1.5). Without ``-S``, `site` adds the image's
site-packages and runs their ``.pth`` files: code the helper (the standard library alone) never
needs, ~0.5 ms of its start in the runtime image (``python3 -I -c pass`` alone: 8.1 ms, 6.3 with
``-S``; most of what `site` imports, the helper imports anyway)."""
