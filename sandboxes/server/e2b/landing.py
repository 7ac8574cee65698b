"""The service's atomic writes as an E2B watch reports them: envd writes a file in place, so its
watchers see ``create``, ``chmod`` and ``write`` of the file itself, where the service writes
``.sandboxes-write.<token>`` beside it and renames that over it. `Landings` hides the temporary
file's events and reports its rename onto the file as envd's three."""

from __future__ import annotations

from collections.abc import Iterator

__all__ = ["TEMP_PREFIX", "Landings"]

TEMP_PREFIX = ".sandboxes-write."
"""How the service's temporary files are named (`sandboxes._calls`, the exec helper)."""
MAX_PENDING = 1024
"""Directories held at once whose temporary file was renamed and whose target is not seen yet."""


class Landings:
    """One watch's events rewritten: each (kind, name) fed gives the events envd would send."""

    def __init__(self, root: str = "", include_entry: bool = False) -> None:
        self._pending: set[str] = set()
        self.root = root
        """The watched directory (absolute), which the events' names are relative to."""
        self.include_entry = include_entry
        """Whether the watch's events carry their file's ``EntryInfo`` (envd 0.6.3's ``include_entry``)."""

    def feed(self, kind: str, name: str) -> Iterator[tuple[str, str]]:
        """The events for the watch's next (``kind``, ``name``), ``name`` relative to it: none for
        a temporary file; the landing's three for the ``create`` that follows its rename."""
        directory, _, base = name.rpartition("/")
        if base.startswith(TEMP_PREFIX):
            if kind == "rename":
                if len(self._pending) >= MAX_PENDING:
                    self._pending.clear()
                self._pending.add(directory)
            return
        if kind == "create" and directory in self._pending:
            self._pending.discard(directory)
            yield from (("create", name), ("chmod", name), ("write", name))
            return
        yield kind, name
