"""Structured logs: one JSON object per line, carrying the request id of the request that
caused it, so a client's ``X-Request-ID`` finds every line about its request."""

from __future__ import annotations

import contextvars
import itertools
import json
import logging
import os
import secrets
import sys
import threading
import time
from typing import Any

REQUEST_ID: contextvars.ContextVar[str | None] = contextvars.ContextVar("sandboxes_request_id", default=None)

_ID_PREFIX = secrets.token_hex(6)
_ID_COUNTER = itertools.count(1)


def unique_id() -> str:
    """32 hex digits, unique within this service process and across its restarts (a random
    prefix drawn once, then a counter); not secret, and nothing it is used for needs it to be.

    Not ``uuid4`` on the request path: each call reads the kernel's random source, and the
    event-loop thread, having released the interpreter lock for that system call, then waits
    to get it back behind the worker threads, twice per execute (request id and kill marker),
    on the thread that bounds throughput."""
    return f"{_ID_PREFIX}{next(_ID_COUNTER):020x}"


_RANDOM = bytearray()
"""Bytes of the kernel's random source read ahead for `random_id` (forgotten in a fork's child)."""
_RANDOM_BATCH = 4096
_RANDOM_LOCK = threading.Lock()
os.register_at_fork(after_in_child=_RANDOM.clear)


def random_id() -> str:
    """16 random hex digits (64 bits of the kernel's random source), taken from bytes read a
    batch at a time: as with `unique_id`, a read of the random source per call (``uuid4``)
    made the event loop, which draws one on every create, wait for the interpreter lock."""
    with _RANDOM_LOCK:
        if len(_RANDOM) < 8:
            _RANDOM[:] = os.urandom(_RANDOM_BATCH)
        drawn = bytes(_RANDOM[-8:])
        del _RANDOM[-8:]
    return drawn.hex()


_STANDARD = set(logging.makeLogRecord({}).__dict__) | {"message", "asctime", "taskName", "color_message"}


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": round(record.created, 6),
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        request_id = REQUEST_ID.get()
        if request_id is not None:
            entry["request_id"] = request_id
        for key, value in record.__dict__.items():
            if key not in _STANDARD and not key.startswith("_"):
                entry[key] = value
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


def configure(level: str) -> None:
    """Send every log (ours, uvicorn's) to stderr as JSON lines."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        logger = logging.getLogger(name)
        logger.handlers[:] = []
        logger.propagate = True
    logging.getLogger("uvicorn.access").disabled = True  # the service logs each request itself
