"""The light path's HTTP for a plain ``http://`` service with no proxy in the environment:
one keep-alive connection of the standard library's `http.client`, the same requests as the
client's httpx sends (JSON encoded alike, the same headers, connect and read timeouts).

Anything else (``https://``, a ``*_proxy`` variable, which httpx honours) takes httpx, as does a
call whose connection could not be made: nothing was sent, so sending it again through httpx is
safe and fails, if it does, with the client's own words. A failure after the request may have
left is `ConnectionLost`, as through the client.
"""

from __future__ import annotations

import http.client
import json
import os
import socket
from collections.abc import Callable, Iterator, Mapping
from typing import Any
from urllib.parse import urlencode, urlsplit

from sandboxes.client.errors import ConnectionLost

__all__ = ["NotConnected", "PlainConnection", "PlainResponse", "usable"]


class NotConnected(Exception):
    """The connection could not be made: no byte of the request left."""


def usable(url: str) -> bool:
    """Whether `PlainConnection` serves ``url`` as httpx would: plain HTTP, no proxy variable."""
    return url.startswith("http://") and not any(name.lower().endswith("_proxy") for name in os.environ)


class PlainResponse:
    """An answer: its status and headers, its body read whole (`content`) or line by line."""

    def __init__(self, response: http.client.HTTPResponse, what: str, discard: Callable[[], None]) -> None:
        self._response = response
        self._what = what
        self._discard = discard
        self.status_code = response.status
        self.is_success = 200 <= response.status < 300
        self._content: bytes | None = None

    @property
    def content(self) -> bytes:
        if self._content is None:
            self._content = _reading(self._what, self._response.read)
        return self._content

    def iter_lines(self) -> Iterator[str]:
        while line := _reading(self._what, self._response.readline):
            yield line.decode("utf-8", "replace").rstrip("\r\n")

    def read(self) -> bytes:
        return self.content

    def close(self) -> None:
        """Done with it; a body left unread takes its connection with it (never reused)."""
        unread = not self._response.isclosed()
        self._response.close()
        if unread:
            self._discard()

    def as_httpx(self) -> Any:
        """The same answer as an `httpx.Response`, for `sandboxes.client.errors` to read."""
        import httpx

        return httpx.Response(self.status_code, headers=self._response.getheaders(), content=self.content)


def _reading(what: str, read: Any) -> bytes:
    try:
        data: bytes = read()
    except TimeoutError as exc:
        raise _lost(what, "ReadTimeout", exc) from exc
    except (http.client.HTTPException, OSError) as exc:
        kind = "RemoteProtocolError" if isinstance(exc, http.client.HTTPException) else "ReadError"
        raise _lost(what, kind, exc) from exc
    return data


def _lost(what: str, kind: str, exc: BaseException) -> ConnectionLost:
    detail = f"{kind}: {exc}" if str(exc) else kind
    return ConnectionLost(f"{what}: the connection failed, the outcome is unknown: {detail}")


class PlainConnection:
    """One persistent connection to the service, opened on first use, again after a close."""

    def __init__(self, base_url: str, headers: Mapping[str, str], connect_timeout: float) -> None:
        parts = urlsplit(base_url)
        self._host = parts.hostname or ""
        self._port = parts.port
        self._prefix = parts.path.rstrip("/")
        self._headers = {"accept": "*/*", **headers}
        self._connect_timeout = connect_timeout
        self._connection: http.client.HTTPConnection | None = None

    def close(self) -> None:
        if self._connection is not None:
            self._connection.close()
            self._connection = None

    def send(
        self, method: str, path: str, body: Any, params: Mapping[str, str] | None, read_timeout: float | None
    ) -> PlainResponse:
        """Send one request; `NotConnected` if no connection could be made (nothing was sent)."""
        target = self._prefix + path + (f"?{urlencode(params)}" if params else "")
        headers = dict(self._headers)
        content = None
        if body is not None:  # as httpx encodes ``json=``
            content = json.dumps(body, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode("utf-8")
            headers["content-type"] = "application/json"
        if content is not None or method in ("POST", "PUT", "PATCH"):
            headers["content-length"] = str(len(content or b""))
        connection = self._connected()
        assert connection.sock is not None
        connection.sock.settimeout(read_timeout)
        what = f"{method} {path}"
        try:
            connection.request(method, target, content, headers)
            response = connection.getresponse()
        except TimeoutError as exc:
            self.close()
            raise _lost(what, "ReadTimeout", exc) from exc
        except (http.client.HTTPException, OSError) as exc:
            self.close()
            kind = "RemoteProtocolError" if isinstance(exc, http.client.HTTPException) else "ReadError"
            raise _lost(what, kind, exc) from exc
        return PlainResponse(response, what, self.close)

    def _connected(self) -> http.client.HTTPConnection:
        if self._connection is not None and self._connection.sock is not None:
            return self._connection
        connection = http.client.HTTPConnection(self._host, self._port, timeout=self._connect_timeout)
        try:
            connection.connect()
        except OSError as exc:
            connection.close()
            raise NotConnected from exc
        connection.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._connection = connection
        return connection
