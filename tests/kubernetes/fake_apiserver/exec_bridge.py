"""The FAKE API server's exec subresource: a WebSocket speaking ``v5.channel.k8s.io`` or
``v4.channel.k8s.io`` (channel byte 0 stdin, 1 stdout, 2 stderr, 3 error as a metav1.Status, 4
resize, v5's 255 close), bridged to ``docker exec`` over its hijacked socket, streaming both ways
with backpressure (a frame is read only once the previous one was written). A test double only.

When the client goes away first, the exec'd process is killed with SIGKILL by its host pid (the
engine has no API to kill an exec). Its children survive, as they can on a real cluster. So it
is when the fake drops a stream itself (`Kubelet.exec_drops`, as a restarting API server or a
broken connection does): the stream closes mid-command with code 1011 and no exit status."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import struct
from collections import Counter
from typing import Any

from starlette.responses import JSONResponse
from starlette.websockets import WebSocket, WebSocketDisconnect

from sandboxes.docker._io import read_ahead

from .kubelet import Kubelet
from .store import ApiError

__all__ = ["SUPPORTED_PROTOCOLS", "serve_exec"]

SUPPORTED_PROTOCOLS = ("v5.channel.k8s.io", "v4.channel.k8s.io")
_TRUE = {"1", "t", "T", "true", "TRUE", "True"}
_FRAME = struct.Struct(">BxxxL")


async def serve_exec(
    websocket: WebSocket, kubelet: Kubelet, protocols: tuple[str, ...], requests: Counter[str]
) -> None:
    """Serve one exec stream in the first of the client's subprotocols that ``protocols`` has
    (a server of ``v4`` only refuses a client offering ``v5`` alone, so it falls back)."""
    ns, name = websocket.path_params["namespace"], websocket.path_params["name"]
    query = websocket.query_params
    offered = websocket.scope.get("subprotocols") or []
    try:
        protocol = next((p for p in offered if p in protocols), None)
        if protocol is None:
            raise ApiError(
                400,
                "BadRequest",
                f"unable to upgrade connection: requested protocol(s) are not "
                f"supported: {offered}; supports {list(protocols)}",
            )
        command = query.getlist("command")
        flags = {k: query.get(k, "false") in _TRUE for k in ("stdin", "stdout", "stderr", "tty")}
        if not command:
            raise ApiError(400, "BadRequest", "you must specify at least 1 command")
        if not (flags["stdin"] or flags["stdout"] or flags["stderr"]):
            raise ApiError(400, "BadRequest", "you must specify at least one of stdin, stdout, stderr")
        cid = _running_container(kubelet, ns, name, query.get("container"))
        api = kubelet.docker.api
        exec_id = (
            await kubelet.blocking(
                api.exec_create,
                cid,
                command,
                stdin=flags["stdin"],
                stdout=flags["stdout"],
                stderr=flags["stderr"],
                tty=flags["tty"],
            )
        )["Id"]
        holder = await kubelet.blocking(api.exec_start, exec_id, socket=True, tty=flags["tty"])
    except ApiError as error:
        await websocket.send_denial_response(JSONResponse(error.status(), status_code=error.code))
        return
    raw: socket.socket = getattr(holder, "_sock", holder)
    first = read_ahead(holder, raw)  # what docker-py's reader took with the headers
    raw.setblocking(False)
    await websocket.accept(subprotocol=protocol)
    requests["exec"] += 1
    drop = asyncio.Event()
    kubelet.exec_drops.add((ns, name, drop))
    pump_out = asyncio.ensure_future(_docker_to_client(websocket, raw, flags["tty"], first))
    pump_in = asyncio.ensure_future(_client_to_docker(websocket, raw, protocol == SUPPORTED_PROTOCOLS[0]))
    dropper = asyncio.ensure_future(drop.wait())
    try:
        done, _ = await asyncio.wait({pump_out, pump_in, dropper}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        kubelet.exec_drops.discard((ns, name, drop))
    dropped = dropper in done
    client_gone = dropped or pump_in in done or (pump_out in done and pump_out.exception() is not None)
    for task in (pump_in, pump_out, dropper):
        task.cancel()
    inspect = await kubelet.blocking(api.exec_inspect, exec_id)
    # The engine reports an exit a moment after the stream's end, and a start (and its pid) a
    # moment after the attach: wait until the process has ended, or (client gone) has a pid to kill.
    for _ in range(1000):
        if (inspect["Running"] and inspect["Pid"] and client_gone) or (
            not inspect["Running"] and inspect["ExitCode"] is not None
        ):
            break
        await asyncio.sleep(0.01)
        inspect = await kubelet.blocking(api.exec_inspect, exec_id)
    if inspect["Running"] and inspect.get("Pid"):
        with contextlib.suppress(ProcessLookupError):
            os.kill(inspect["Pid"], signal.SIGKILL)
    _close_engine_connection(holder, raw)
    if dropped:
        with contextlib.suppress(Exception):
            await websocket.close(1011)
    if client_gone:
        return
    with contextlib.suppress(Exception):
        await websocket.send_bytes(b"\x03" + json.dumps(_exit_status(command, inspect)).encode())
        await websocket.close(1000)


def _close_engine_connection(holder: Any, raw: socket.socket) -> None:
    """Shut the exec's engine connection down now: closing ``raw`` alone leaves its descriptor
    open while docker-py's reader (``holder``) still refers to it, until the garbage collector
    frees that; meanwhile the engine, stuck writing the output nobody reads, handles no other
    event of the container, so none of its later execs ends."""
    with contextlib.suppress(OSError):
        raw.shutdown(socket.SHUT_RDWR)
    with contextlib.suppress(OSError):
        raw.close()
    with contextlib.suppress(Exception):
        holder.close()


def _running_container(kubelet: Kubelet, ns: str, name: str, container: str | None) -> str:
    pod = kubelet.store.get(ns, name)
    names = [c["name"] for c in pod["spec"]["containers"]]
    if container and container not in names:
        raise ApiError(400, "BadRequest", f"container {container} is not valid for pod {name}")
    phase = pod.get("status", {}).get("phase")
    if phase in ("Succeeded", "Failed"):
        raise ApiError(400, "BadRequest", f"cannot exec into a container in a completed pod; current phase is {phase}")
    if not pod["spec"].get("nodeName"):
        raise ApiError(400, "BadRequest", f"pod {name} does not have a host assigned")
    cid = kubelet.containers.get((ns, name))
    running = any("running" in cs["state"] for cs in pod["status"].get("containerStatuses") or [])
    if not cid or not running:
        raise ApiError(400, "BadRequest", f'unable to upgrade connection: container not found ("{names[0]}")')
    return cid


def _exit_status(command: list[str], inspect: dict[str, Any]) -> dict[str, Any]:
    code = inspect.get("ExitCode")
    if code == 0:
        return {"metadata": {}, "status": "Success"}
    return {
        "metadata": {},
        "status": "Failure",
        "message": f"command terminated with non-zero exit code: error executing command {command}, exit code {code}",
        "reason": "NonZeroExitCode",
        "details": {"causes": [{"reason": "ExitCode", "message": str(code)}]},
    }


async def _client_to_docker(websocket: WebSocket, raw: socket.socket, v5: bool) -> None:
    loop = asyncio.get_running_loop()
    while True:
        message = await websocket.receive()
        if message["type"] == "websocket.disconnect":
            raise WebSocketDisconnect(message.get("code", 1000))
        data = message.get("bytes") or (message.get("text") or "").encode()
        if not data:
            continue
        if data[0] == 0:
            await loop.sock_sendall(raw, data[1:])
        elif data[0] == 255 and v5 and data[1:2] == b"\x00":
            with contextlib.suppress(OSError):
                raw.shutdown(socket.SHUT_WR)


async def _docker_to_client(websocket: WebSocket, raw: socket.socket, tty: bool, first: bytes) -> None:
    loop = asyncio.get_running_loop()
    buffer = b""
    while True:
        chunk, first = first or await loop.sock_recv(raw, 65536), b""
        if not chunk:
            return
        if tty:
            await websocket.send_bytes(b"\x01" + chunk)
            continue
        buffer += chunk
        while len(buffer) >= _FRAME.size:
            kind, size = _FRAME.unpack_from(buffer)
            if len(buffer) < _FRAME.size + size:
                break
            payload, buffer = buffer[_FRAME.size : _FRAME.size + size], buffer[_FRAME.size + size :]
            if payload and kind in (1, 2):
                await websocket.send_bytes(bytes([kind]) + payload)
