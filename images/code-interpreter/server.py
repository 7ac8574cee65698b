"""The code interpreter of the ``code-interpreter`` image: E2B's code-interpreter API over Jupyter
kernels, served inside the sandbox on 127.0.0.1:49999, where the service's port relay reaches it.

Routes (those `e2b_code_interpreter.Sandbox` calls): ``POST /execute`` answers one JSON object
per line as the code runs (``stdout``, ``stderr``, ``result`` with its rich formats, ``error``
with its traceback, ``number_of_executions``; a ``keepalive`` line while it is quiet), ``POST
/contexts``, ``GET /contexts``, ``DELETE /contexts/{id}``, ``POST /contexts/{id}/restart``,
``GET /health``. A context is one kernel, its state kept between executions; its executions run
one at a time. A client that leaves during an execution interrupts it.

Run by the template's start command as the sandbox's user, like any process of the sandbox:
it has no privilege the sandbox's commands do not have.
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import select
import socket
import threading
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from jupyter_client.blocking.client import BlockingKernelClient
from jupyter_client.manager import KernelManager
from jupyter_core.paths import jupyter_runtime_dir

__all__ = ["main"]

PORT = 49999
MAX_BODY = 16 << 20
"""The largest request body read (code and its env vars)."""
KEEPALIVE = 5.0
"""Seconds of quiet after which an execution sends a keepalive line."""
CHECK = 0.5
"""Seconds between two looks at whether the client of a quiet execution is still there."""
LANGUAGES = {"python": "python3", "python3": "python3"}
"""The languages a context may have, by the kernel that runs them."""
_FORMATS = {
    "text/plain": "text",
    "text/html": "html",
    "text/markdown": "markdown",
    "image/svg+xml": "svg",
    "image/png": "png",
    "image/jpeg": "jpeg",
    "application/pdf": "pdf",
    "text/latex": "latex",
    "application/json": "json",
    "application/javascript": "javascript",
    "e2b/data": "data",
    "e2b/chart": "chart",
}
"""A display's MIME types as E2B's results name them; other types go to ``extra``."""


class Gone(Exception):
    """The client of an execution left."""


class Context:
    """One kernel and its client; `lock` runs its executions one at a time."""

    def __init__(self, language: str, cwd: str) -> None:
        self.id = str(uuid.uuid4())
        self.language = language
        self.cwd = cwd
        self.lock = threading.Lock()
        # Unix sockets, not TCP ports: only the sandbox's own user reaches the kernel. Their path is
        # absolute: the kernel starts in the context's cwd, where a relative one would differ.
        sockets = os.path.join(jupyter_runtime_dir(), f"kernel-{self.id}")
        self.manager = KernelManager(kernel_name=LANGUAGES[language], transport="ipc", ip=sockets)
        self.manager.start_kernel(cwd=cwd)
        self.client: BlockingKernelClient = self.manager.blocking_client()
        self.client.start_channels()
        self.client.wait_for_ready(timeout=60)

    def describe(self) -> dict[str, str]:
        return {"id": self.id, "language": self.language, "cwd": self.cwd}

    def restart(self) -> None:
        with self.lock:
            self.manager.restart_kernel(now=True)
            self.client.wait_for_ready(timeout=60)

    def close(self) -> None:
        self.client.stop_channels()
        self.manager.shutdown_kernel(now=True)

    def execute(self, code: str, env: dict[str, str], client_gone: Any) -> Iterator[dict[str, Any]]:
        """The lines of one execution, as E2B's server streams them; `Gone` from ``client_gone``
        interrupts the kernel and ends it."""
        with self.lock:
            if env:
                self._quietly(_env_code(env))
            try:
                yield from self._run(code, client_gone)
            finally:
                if env:
                    self._quietly(_unset_code(env))

    def _run(self, code: str, client_gone: Any) -> Iterator[dict[str, Any]]:
        msg_id = self.client.execute(code, store_history=True, allow_stdin=False, stop_on_error=True)
        errored = False
        quiet = 0.0
        while True:
            try:
                message = self.client.get_iopub_msg(timeout=CHECK)
            except queue.Empty:
                try:
                    client_gone()
                except Gone:
                    self.manager.interrupt_kernel()
                    self._drain(msg_id)
                    raise
                quiet += CHECK
                if quiet >= KEEPALIVE:
                    quiet = 0.0
                    yield {"type": "keepalive"}
                continue
            quiet = 0.0
            if message.get("parent_header", {}).get("msg_id") != msg_id:
                continue
            kind, content = message["msg_type"], message["content"]
            if kind == "status" and content.get("execution_state") == "idle":
                return
            line = _line(kind, content, message)
            if line is None:
                continue
            if line["type"] == "error":
                if errored:
                    continue
                errored = True
            yield line

    def _drain(self, msg_id: str) -> None:
        """Read the interrupted execution's messages until its end, so none reaches the next."""
        while True:
            try:
                message = self.client.get_iopub_msg(timeout=30)
            except queue.Empty:
                return
            if (
                message.get("parent_header", {}).get("msg_id") == msg_id
                and message["msg_type"] == "status"
                and message["content"].get("execution_state") == "idle"
            ):
                return

    def _quietly(self, code: str) -> None:
        for _ in self._run(code, lambda: None):
            continue


def _env_code(env: dict[str, str]) -> str:
    return "import os as __e2b_os\n" + "\n".join(f"__e2b_os.environ[{k!r}] = {v!r}" for k, v in env.items())


def _unset_code(env: dict[str, str]) -> str:
    return "import os as __e2b_os\n" + "\n".join(f"__e2b_os.environ.pop({k!r}, None)" for k in env)


def _line(kind: str, content: dict[str, Any], message: dict[str, Any]) -> dict[str, Any] | None:
    """One iopub message as E2B's output line; ``None`` for what E2B does not stream."""
    if kind == "stream":
        name = content.get("name")
        if name not in ("stdout", "stderr"):
            return None
        return {"type": name, "text": content.get("text", ""), "timestamp": _timestamp(message["header"].get("date"))}
    if kind in ("execute_result", "display_data"):
        return _result(content.get("data", {}), is_main=kind == "execute_result")
    if kind == "error":
        return {
            "type": "error",
            "name": content.get("ename", ""),
            "value": content.get("evalue", ""),
            "traceback": "".join(content.get("traceback", [])),
        }
    if kind == "execute_input":
        return {"type": "number_of_executions", "execution_count": content.get("execution_count")}
    return None


def _timestamp(value: object) -> str:
    """A message's date as envd's ISO 8601 (jupyter_client parses it into a datetime)."""
    isoformat = getattr(value, "isoformat", None)
    return str(isoformat()) if callable(isoformat) else str(value or "")


def _result(data: dict[str, Any], *, is_main: bool) -> dict[str, Any]:
    result: dict[str, Any] = {"type": "result", "is_main_result": is_main}
    extra: dict[str, Any] = {}
    for mime, value in data.items():
        name = _FORMATS.get(mime)
        if name is None:
            extra[mime] = value
        else:
            result[name] = value
    text = result.get("text")
    if isinstance(text, str) and len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"":
        result["text"] = text[1:-1]  # a string's repr shows as the string, as E2B's server does
    if extra:
        result["extra"] = extra
    return result


class Interpreter:
    """The contexts: one default per language, made when first asked, and those made on request."""

    def __init__(self, cwd: str) -> None:
        self.cwd = cwd
        self.contexts: dict[str, Context] = {}
        self.defaults: dict[str, str] = {}
        self.lock = threading.Lock()

    def default(self, language: str) -> Context:
        with self.lock:
            found = self.defaults.get(language)
            if found is not None and found in self.contexts:
                return self.contexts[found]
            context = Context(language, self.cwd)
            self.contexts[context.id] = context
            self.defaults[language] = context.id
            return context

    def create(self, language: str, cwd: str) -> Context:
        context = Context(language, cwd)
        with self.lock:
            self.contexts[context.id] = context
        return context

    def remove(self, context_id: str) -> bool:
        with self.lock:
            context = self.contexts.pop(context_id, None)
        if context is None:
            return False
        context.close()
        return True


class Handler(BaseHTTPRequestHandler):
    """E2B's code-interpreter routes; every answer is JSON or plain text."""

    protocol_version = "HTTP/1.1"
    interpreter: Interpreter

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: the sandbox's job keeps no log of requests."""

    def do_GET(self) -> None:
        if self.path == "/health":
            self._send(200, "OK")
        elif self.path == "/contexts":
            with self.interpreter.lock:
                contexts = [context.describe() for context in self.interpreter.contexts.values()]
            self._send(200, contexts)
        else:
            self._send(404, f"no route {self.path}")

    def do_DELETE(self) -> None:
        context_id = self._context_path()
        if context_id is None or not self.interpreter.remove(context_id):
            self._send(404, f"Context {context_id} not found")
        else:
            self._send(200, None)

    def do_POST(self) -> None:
        try:
            body = self._body()
        except ValueError as bad:
            self._send(400, str(bad))
            return
        if self.path == "/execute":
            self._execute(body)
        elif self.path == "/contexts":
            language = _language(body.get("language"))
            if language is None:
                self._send(400, f"language {body.get('language')!r} is not available here (python only)")
                return
            self._send(200, self.interpreter.create(language, str(body.get("cwd") or self.interpreter.cwd)).describe())
        elif self.path.startswith("/contexts/") and self.path.endswith("/restart"):
            context = self.interpreter.contexts.get(self.path[len("/contexts/") : -len("/restart")])
            if context is None:
                self._send(404, "Context not found")
                return
            context.restart()
            self._send(200, None)
        else:
            self._send(404, f"no route {self.path}")

    def _execute(self, body: dict[str, Any]) -> None:
        code, context_id, language = body.get("code"), body.get("context_id"), body.get("language")
        env = body.get("env_vars") or {}
        if not isinstance(code, str) or not isinstance(env, dict):
            self._send(400, "code is a string, env_vars a table of strings")
            return
        if context_id and language:
            self._send(400, "Only one of context_id or language can be provided")
            return
        if context_id:
            context = self.interpreter.contexts.get(str(context_id))
            if context is None:
                self._send(404, f"Context {context_id} not found")
                return
        else:
            chosen = _language(language)
            if chosen is None:
                self._send(400, f"language {language!r} is not available here (python only)")
                return
            context = self.interpreter.default(chosen)
        self.send_response(200)
        self.send_header("Content-Type", "application/x-ndjson")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        try:
            for line in context.execute(code, {str(k): str(v) for k, v in env.items()}, self._gone):
                self._chunk((json.dumps(line) + "\n").encode())
            self._chunk(b"")
        except (Gone, OSError):
            self.close_connection = True

    def _gone(self) -> None:
        """`Gone` when the client closed its connection (its socket reads as ended)."""
        sock: socket.socket = self.connection
        readable, _, _ = select.select([sock], [], [], 0)
        if readable:
            try:
                if not sock.recv(1, socket.MSG_PEEK):
                    raise Gone
            except OSError as exc:
                raise Gone from exc

    def _chunk(self, data: bytes) -> None:
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()

    def _body(self) -> dict[str, Any]:
        length = int(self.headers.get("Content-Length") or 0)
        if length > MAX_BODY:
            raise ValueError(f"a request body is at most {MAX_BODY} bytes")
        data = self.rfile.read(length) if length else b"{}"
        parsed = json.loads(data or b"{}")
        if not isinstance(parsed, dict):
            raise ValueError("the body is a JSON object")
        return parsed

    def _context_path(self) -> str | None:
        prefix = "/contexts/"
        rest = self.path[len(prefix) :]
        return rest if self.path.startswith(prefix) and "/" not in rest else None

    def _send(self, status: int, payload: object) -> None:
        if isinstance(payload, str):
            data, kind = payload.encode(), "text/plain; charset=utf-8"
        else:
            data, kind = json.dumps(payload).encode(), "application/json"
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


def _language(value: object) -> str | None:
    if value is None or value == "":
        return "python"
    return str(value).lower() if str(value).lower() in LANGUAGES else None


def main() -> None:
    """Serve until killed, the default Python context started first."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=PORT)
    parser.add_argument("--cwd", default=os.environ.get("HOME") or os.getcwd())
    options = parser.parse_args()
    os.makedirs(jupyter_runtime_dir(), mode=0o700, exist_ok=True)  # the kernels' sockets
    interpreter = Interpreter(options.cwd)
    interpreter.default("python")  # the first run_code finds a kernel ready
    Handler.interpreter = interpreter
    server = ThreadingHTTPServer((options.host, options.port), Handler)
    server.daemon_threads = True
    server.serve_forever()


if __name__ == "__main__":
    main()
