"""The request of a file watch through the exec helper (`watch_spec`), for
`sandboxes._mux._channel.open_channel`: what the helper then sends is `sandboxes._helper._watch`'s
docstring."""

from __future__ import annotations

from sandboxes._mux._shipped import sources_of

__all__ = ["watch_spec"]


def watch_spec(path: str, *, recursive: bool = False, **bounds: float) -> dict[str, object]:
    """The ``spec`` of a channel that watches the directory ``path`` (``bounds``: the helper's
    ``max_watches``, ``max_events``, ``max_entries``, ``poll_interval``), its modules with it
    (`sandboxes._mux._shipped.ON_DEMAND`)."""
    return {"watch": {"path": path, "recursive": recursive, **bounds}, "sources": sources_of("_watch", "_snapshots")}
