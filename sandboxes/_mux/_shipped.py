"""The exec helper as shipped into a sandbox: the sources of `sandboxes._helper`'s modules behind
a one-line bootstrap (`SERVER_SOURCE`), and how python3 runs it (`PYTHON_FLAGS`).

Apart from the client (`sandboxes._mux.client`) because it is what runs in the sandbox, not what
talks to it: every transport that starts a helper (Docker, Kubernetes, Local, SSH) takes its
source and flags from here (through `sandboxes._mux`). The bootstrap unpacks the sources and
installs `sandboxes._helper._boot`'s importer, which compiles a module only when it is first
imported: the file ops (`_files` and its imports) once the helper idles or at its first file op.
"""

from __future__ import annotations

import binascii
import functools
import marshal
import zlib
from collections.abc import Mapping
from pathlib import Path

from sandboxes import _helper

__all__ = [
    "HELPER_SOURCES",
    "ON_DEMAND",
    "ON_DEMAND_OPS",
    "PYTHON_FLAGS",
    "SERVER_SOURCE",
    "SHIPPED_PACKAGE",
    "bootstrap",
    "program",
    "sources_of",
]

_HERE = Path(_helper.__file__).parent

SHIPPED_PACKAGE = "sandboxes_helper"
"""The name the helper's package has in the sandbox: none of the host's, so that a helper run
in-process by a test does not meet the host's `sandboxes`."""

HELPER_SOURCES = {path.stem: path.read_text(encoding="utf-8") for path in sorted(_HERE.glob("*.py"))}
"""Every module of `sandboxes._helper`, by name (``__init__`` the package's own), as shipped."""

ON_DEMAND = (
    "_archive",
    "_watch",
    "_snapshots",
    "_pty",
    "_relay",
    "_record",
    "_listdir",
    "_usage",
    "_untar",
    "_tar",
    "_xattrs",
)
"""Modules left out of the bootstrap: they come with each request that needs them (`sources_of`),
so that a capability few sandboxes use does not lengthen every start."""

ON_DEMAND_OPS = {"list_dir": ("_listdir",), "metrics": ("_usage",), "e2b_metadata": ("_xattrs",)}
"""The native file ops whose modules are `ON_DEMAND`: the first such op a helper gets carries
them (`sandboxes._mux.client.MuxClient.run_native`)."""


@functools.cache
def sources_of(*names: str) -> str:
    """The ``sources`` of a request that needs the `ON_DEMAND` modules ``names`` (the helper's
    ``_loop.add_sources`` adds them to what its importer serves)."""
    unknown = set(names) - set(ON_DEMAND)
    if unknown:
        raise ValueError(f"not modules shipped on demand: {sorted(unknown)}")
    packed = zlib.compress(marshal.dumps({name: HELPER_SOURCES[name] for name in names}, 4), 9)
    return binascii.b2a_base64(packed, newline=False).decode("ascii")


@functools.cache
def program(name: str) -> str:
    """One line of Python that runs the `ON_DEMAND` module ``name`` as a program of its own (its
    ``__main__``; it imports nothing of the helper), for ``python3 -c`` in the sandbox."""
    if name not in ON_DEMAND:
        raise ValueError(f"not a module shipped on demand: {name}")
    text = binascii.b2a_base64(zlib.compress(HELPER_SOURCES[name].encode("utf-8"), 9), newline=False).decode("ascii")
    return f"import zlib,binascii;exec(zlib.decompress(binascii.a2b_base64({text!r})))"


def bootstrap(sources: Mapping[str, str]) -> str:
    """One line of Python that runs the helper made of ``sources`` (`HELPER_SOURCES` or a
    variant of it): no quote in it to escape, compressed to a fraction of the sources."""
    boot = sources["_boot"]
    modules = {name: source for name, source in sources.items() if name != "_boot" and name not in ON_DEMAND}
    packed = zlib.compress(marshal.dumps((boot, modules), 4), 9)
    text = binascii.b2a_base64(packed, newline=False).decode("ascii")
    return (
        "import zlib,binascii,marshal;"
        f"b,s=marshal.loads(zlib.decompress(binascii.a2b_base64({text!r})));"
        f"exec(b);install(s,{SHIPPED_PACKAGE!r}).main()"
    )


SERVER_SOURCE = bootstrap(HELPER_SOURCES)
"""Shipped as ``python3 -I -S -u -c SERVER_SOURCE`` (`PYTHON_FLAGS`) by Docker and Local, inside
a shell command by SSH, through stdin by Kubernetes: nothing is installed in the sandbox."""

PYTHON_FLAGS = ("-I", "-S", "-u")
"""How python3 runs the helper: unbuffered, isolated (``-I``), without `site` (``-S``). Without
``-I``, ``python3 -c`` puts its working directory first on ``sys.path`` and follows
``PYTHONPATH``: a command that wrote ``json.py`` into the workspace (the helper's cwd) shadowed
the stdlib, the helper died at its start, and the sandbox fell back to one exec per command for
good. Without ``-S``, `site` adds the image's site-packages and runs their ``.pth`` files: code
the helper (the standard library alone) never needs."""
