"""Where threads (checkpoints) and ``/memories/`` (the store) are kept: SQLite or PostgreSQL.

SQLite is the default: one file, nothing to run, enough for one process at a time
(``langgraph-checkpoint-sqlite``). PostgreSQL is for a shared deployment where several
processes or machines serve the same threads (``langgraph-checkpoint-postgres``). Either way
`open_persistence` yields a checkpointer and a store with their tables created.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.store.base import BaseStore

__all__ = ["Persistence", "open_persistence", "open_postgres", "open_sqlite"]


@dataclass(frozen=True)
class Persistence:
    checkpointer: BaseCheckpointSaver[Any]
    store: BaseStore


@contextlib.contextmanager
def open_sqlite(path: str | Path) -> Iterator[Persistence]:
    """Checkpoints and store in one SQLite file (created with its parents if missing)."""
    from langgraph.checkpoint.sqlite import SqliteSaver
    from langgraph.store.sqlite import SqliteStore

    target = str(path)
    if target != ":memory:":
        Path(target).parent.mkdir(parents=True, exist_ok=True)
    with SqliteSaver.from_conn_string(target) as saver, SqliteStore.from_conn_string(target) as store:
        saver.setup()
        store.setup()
        yield Persistence(saver, store)


@contextlib.contextmanager
def open_postgres(dsn: str) -> Iterator[Persistence]:
    """Checkpoints and store in a PostgreSQL database (``postgresql://...``); tables made if missing."""
    from langgraph.checkpoint.postgres import PostgresSaver
    from langgraph.store.postgres import PostgresStore

    with PostgresSaver.from_conn_string(dsn) as saver, PostgresStore.from_conn_string(dsn) as store:
        saver.setup()
        store.setup()
        yield Persistence(saver, store)


@contextlib.contextmanager
def open_persistence(target: str | Path) -> Iterator[Persistence]:
    """A ``postgresql://`` / ``postgres://`` URL, or else a SQLite file path."""
    if isinstance(target, str) and target.startswith(("postgresql://", "postgres://")):
        with open_postgres(target) as persistence:
            yield persistence
    else:
        with open_sqlite(target) as persistence:
            yield persistence
