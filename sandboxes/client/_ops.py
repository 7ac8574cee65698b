"""Every call of the v1 API as an `Op`: route, body, answer parser and retry class.

Which calls are idempotent is decided here and nowhere else: reads, listings, searches,
downloads, GETs, DELETEs, renew and a create with an ``Idempotency-Key`` may be sent twice;
execute, write, edit, delete of a file, upload, process start and a create without a key may
not.
"""

from __future__ import annotations

import base64
from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import quote

from sandboxes import api
from sandboxes import protocol as p
from sandboxes.client import _wire as w

_SANDBOXES = f"{api.API_PREFIX}/sandboxes"
IDEMPOTENCY_HEADER = "Idempotency-Key"


def _sandbox(sandbox_id: str) -> str:
    return f"{_SANDBOXES}/{quote(sandbox_id, safe='')}"


# ---------------------------------------------------------------------- lifecycle


def create(
    template: str,
    env: Mapping[str, str] | None,
    ttl: float | None,
    labels: Mapping[str, str] | None,
    idempotency_key: str | None = None,
    volumes: Sequence[api.VolumeMount] = (),
    auto_resume: bool = False,
    snapshot: str | None = None,
    egress_allow: Sequence[str] | None = None,
    on_timeout: str = "delete",
) -> w.Op[api.SandboxInfo]:
    """With ``idempotency_key`` every retry is sent with the same key, so the service answers
    the sandbox the first attempt made (`sandboxes.server.idempotency`)."""
    fields: dict[str, Any] = {"template": template, "env": dict(env or {}), "ttl": ttl, "labels": dict(labels or {})}
    if volumes:
        fields["volumes"] = list(volumes)
    if auto_resume:  # only when asked: the same create hashes the same for an older service
        fields["auto_resume"] = True
    if snapshot is not None:
        fields["snapshot"] = snapshot
    if on_timeout != "delete":  # only when asked, as ``auto_resume``
        fields["on_timeout"] = on_timeout
    if egress_allow is not None:  # only when given: ``[]`` is a list too (nothing allowed)
        fields["egress_allow"] = list(egress_allow)
    body = w.model_json(api.CreateSandbox, **fields)
    if egress_allow is None:
        body.pop("egress_allow", None)
    if on_timeout == "delete":
        body.pop("on_timeout", None)
    if idempotency_key is None:
        return w.Op("POST", _SANDBOXES, w.sandbox_info, json=body)
    headers = {IDEMPOTENCY_HEADER: idempotency_key}
    return w.Op("POST", _SANDBOXES, w.sandbox_info, json=body, idempotent=True, headers=headers)


def list_sandboxes() -> w.Op[list[api.SandboxInfo]]:
    return w.Op("GET", _SANDBOXES, w.sandbox_list, idempotent=True)


def get(sandbox_id: str) -> w.Op[api.SandboxInfo]:
    return w.Op("GET", _sandbox(sandbox_id), w.sandbox_info, idempotent=True)


def renew(sandbox_id: str, ttl: float) -> w.Op[api.SandboxInfo]:
    body = w.model_json(api.RenewSandbox, ttl=ttl)
    return w.Op("POST", f"{_sandbox(sandbox_id)}/renew", w.sandbox_info, json=body, idempotent=True)


def preview_token(sandbox_id: str, port: int, ttl: float) -> w.Op[api.PreviewToken]:
    """Not repeated: each call mints a token of its own."""
    body = w.model_json(api.PreviewTokenRequest, ttl=ttl)
    return w.Op("POST", f"{_sandbox(sandbox_id)}/ports/{int(port)}/tokens", w.preview_token, json=body)


def metrics(sandbox_id: str) -> w.Op[api.SandboxMetrics]:
    return w.Op("GET", f"{_sandbox(sandbox_id)}/metrics", w.sandbox_metrics, idempotent=True)


_VOLUMES = f"{api.API_PREFIX}/volumes"


def create_volume(name: str, size_limit: int | None, template: str) -> w.Op[api.VolumeInfo]:
    body = w.model_json(api.CreateVolume, name=name, size_limit=size_limit, template=template)
    return w.Op("POST", _VOLUMES, w.volume_info, json=body)


def list_volumes() -> w.Op[list[api.VolumeInfo]]:
    return w.Op("GET", _VOLUMES, w.volume_list, idempotent=True)


def delete_volume(name: str) -> w.Op[None]:
    return w.Op("DELETE", f"{_VOLUMES}/{quote(name, safe='')}", w.no_content, idempotent=True, gone_is_done=True)


def pause(sandbox_id: str, ttl: str, mode: str = "freeze", memory: bool = False) -> w.Op[api.SandboxInfo]:
    """Not repeated: a second pause of a paused sandbox answers ``paused``. ``memory`` is sent
    only when asked for, so a service older than it still takes the body."""
    body = w.model_json(api.PauseSandbox, ttl=ttl, mode=mode, memory=memory)
    if not memory:
        del body["memory"]
    return w.Op("POST", f"{_sandbox(sandbox_id)}/pause", w.sandbox_info, json=body)


def resume(sandbox_id: str) -> w.Op[api.SandboxInfo]:
    return w.Op("POST", f"{_sandbox(sandbox_id)}/resume", w.sandbox_info, idempotent=True)


def delete(sandbox_id: str) -> w.Op[None]:
    return w.Op("DELETE", _sandbox(sandbox_id), w.no_content, idempotent=True, gone_is_done=True)


def health(path: str = "/healthz", *, retry: bool = True) -> w.Op[Any]:
    return w.Op("GET", path, _json_or_text, idempotent=True, retry=retry)


def _json_or_text(response: Any) -> Any:
    try:
        return response.json()
    except ValueError:
        return response.text


# ---------------------------------------------------------------------- commands


def execute_body(
    command: str,
    *,
    timeout: float | None,
    stdin: bytes | str | None,
    env: Mapping[str, str] | None,
    cwd: str | None,
    output_limit: int | None,
) -> dict[str, Any]:
    data = stdin.encode("utf-8") if isinstance(stdin, str) else stdin
    return w.model_json(
        api.ExecuteRequest,
        command=command,
        timeout=timeout,
        stdin_b64=None if data is None else base64.b64encode(data).decode("ascii"),
        env=dict(env or {}),
        cwd=cwd,
        output_limit=output_limit,
    )


def execute(config: w.ClientConfig, sandbox_id: str, body: dict[str, Any]) -> w.Op[p.ExecuteResponse]:
    return w.Op(
        "POST",
        f"{_sandbox(sandbox_id)}/execute",
        w.execute_result,
        json=body,
        read_timeout=w.execute_timeout(config, body.get("timeout")),
        recover=w.failed_execution,
    )


def execute_stream(config: w.ClientConfig, sandbox_id: str, body: dict[str, Any]) -> w.Op[None]:
    """The request only: the answer is read line by line by the caller."""
    return w.Op(
        "POST",
        f"{_sandbox(sandbox_id)}/execute/stream",
        w.no_content,
        json=body,
        read_timeout=w.execute_timeout(config, body.get("timeout")),
    )


def attach_stream(sandbox_id: str, command_id: str, offset: int) -> w.Op[None]:
    """The request only, like `execute_stream`: a streamed command followed again from byte
    ``offset`` of its output."""
    path = f"{_sandbox(sandbox_id)}/execute/{quote(command_id, safe='')}/stream"
    return w.Op("GET", path, w.no_content, params={"offset": str(offset)}, idempotent=True)


def kill_stream(sandbox_id: str, command_id: str) -> w.Op[p.ExecuteResponse]:
    """Kill a streamed command's process tree; its final response once it ended."""
    path = f"{_sandbox(sandbox_id)}/execute/{quote(command_id, safe='')}"
    return w.Op("DELETE", path, w.execute_result, idempotent=True)


def start_process(sandbox_id: str, body: dict[str, Any]) -> w.Op[w.ProcessStatus]:
    return w.Op("POST", f"{_sandbox(sandbox_id)}/processes", w.process_status, json=body)


def poll_process(sandbox_id: str, process_id: str) -> w.Op[w.ProcessStatus]:
    path = f"{_sandbox(sandbox_id)}/processes/{quote(process_id, safe='')}"
    return w.Op("GET", path, w.process_status, idempotent=True)


def kill_process(sandbox_id: str, process_id: str) -> w.Op[w.ProcessStatus]:
    path = f"{_sandbox(sandbox_id)}/processes/{quote(process_id, safe='')}"
    return w.Op("DELETE", path, w.process_status, idempotent=True)


# ---------------------------------------------------------------------- file operations


def _files(sandbox_id: str, op: str) -> str:
    return f"{_sandbox(sandbox_id)}/files/{op}"


def ls(sandbox_id: str, path: str) -> w.Op[p.LsResult]:
    body = w.model_json(api.LsRequest, path=path)
    return w.Op(
        "POST", _files(sandbox_id, "ls"), w.ls_result, json=body, idempotent=True, recover=_as_result(p.LsResult)
    )


def read(sandbox_id: str, file_path: str, offset: int, limit: int) -> w.Op[p.ReadResult]:
    body = w.model_json(api.ReadRequest, file_path=file_path, offset=offset, limit=limit)
    return w.Op(
        "POST", _files(sandbox_id, "read"), w.read_result, json=body, idempotent=True, recover=_as_result(p.ReadResult)
    )


def write(sandbox_id: str, file_path: str, content: str) -> w.Op[p.WriteResult]:
    body = w.model_json(api.WriteRequest, file_path=file_path, content=content)
    return w.Op("POST", _files(sandbox_id, "write"), w.write_result, json=body, recover=_as_result(p.WriteResult))


def edit(sandbox_id: str, file_path: str, old: str, new: str, replace_all: bool) -> w.Op[p.EditResult]:
    body = w.model_json(api.EditRequest, file_path=file_path, old_string=old, new_string=new, replace_all=replace_all)
    return w.Op("POST", _files(sandbox_id, "edit"), w.edit_result, json=body, recover=_as_result(p.EditResult))


def delete_file(sandbox_id: str, file_path: str) -> w.Op[p.DeleteResult]:
    body = w.model_json(api.DeleteRequest, file_path=file_path)
    return w.Op("POST", _files(sandbox_id, "delete"), w.delete_result, json=body, recover=_as_result(p.DeleteResult))


def grep(
    sandbox_id: str, pattern: str, path: str | None, glob: str | None, max_count: int | None
) -> w.Op[p.GrepResult]:
    body = w.model_json(api.GrepRequest, pattern=pattern, path=path, glob=glob, max_count=max_count)
    return w.Op(
        "POST", _files(sandbox_id, "grep"), w.grep_result, json=body, idempotent=True, recover=_as_result(p.GrepResult)
    )


def glob(sandbox_id: str, pattern: str, path: str | None) -> w.Op[p.GlobResult]:
    body = w.model_json(api.GlobRequest, pattern=pattern, path=path)
    return w.Op(
        "POST", _files(sandbox_id, "glob"), w.glob_result, json=body, idempotent=True, recover=_as_result(p.GlobResult)
    )


def upload(sandbox_id: str, files: list[tuple[str, bytes]]) -> w.Op[list[p.FileUploadResponse]]:
    items = [{"path": path, "content_b64": base64.b64encode(data).decode("ascii")} for path, data in files]
    body = w.model_json(api.UploadRequest, files=items)

    def each(code: p.ErrorCode, message: str) -> list[p.FileUploadResponse]:
        return [p.FileUploadResponse(path, code, message) for path, _ in files]

    return w.Op("POST", _files(sandbox_id, "upload"), w.upload_results, json=body, recover=each)


def download(sandbox_id: str, paths: list[str]) -> w.Op[list[p.FileDownloadResponse]]:
    body = w.model_json(api.DownloadRequest, paths=paths)

    def each(code: p.ErrorCode, message: str) -> list[p.FileDownloadResponse]:
        return [p.FileDownloadResponse(path, None, code, message) for path in paths]

    return w.Op("POST", _files(sandbox_id, "download"), w.download_results, json=body, idempotent=True, recover=each)


def _as_result(kind: Any) -> Any:
    def report(code: p.ErrorCode, message: str) -> Any:
        return kind(error=code, message=message)

    return report


# ---------------------------------------------------------------------- archives


def upload_archive(sandbox_id: str, directory: str) -> w.Op[None]:
    """The request line only; the tar stream is the body, passed by the caller."""
    return w.Op("PUT", f"{_sandbox(sandbox_id)}/archive", w.no_content, params={"path": directory})


def download_archive(sandbox_id: str, path: str) -> w.Op[None]:
    return w.Op("GET", f"{_sandbox(sandbox_id)}/archive", w.no_content, params={"path": path}, idempotent=True)


# ---------------------------------------------------------------------- file watches


def watch(sandbox_id: str, path: str, recursive: bool, timeout: float | None = None) -> w.Op[None]:
    """The request only: its NDJSON lines are read by the caller (`sandboxes.client._watches`)."""
    params = {"path": path, "recursive": "true" if recursive else "false"}
    if timeout is not None:
        params["timeout"] = repr(float(timeout))
    return w.Op("GET", f"{_sandbox(sandbox_id)}/watch", w.no_content, params=params, idempotent=True)


def create_watcher(sandbox_id: str, path: str, recursive: bool) -> w.Op[api.WatcherInfo]:
    body = w.model_json(api.CreateWatcher, path=path, recursive=recursive)
    return w.Op("POST", f"{_sandbox(sandbox_id)}/watchers", w.Answer(api.WatcherInfo), json=body)


def watcher_events(sandbox_id: str, watcher_id: str) -> w.Op[api.WatcherEvents]:
    """Not idempotent: an answer lost on the way took its events with it; a retry would hide that."""
    path = f"{_sandbox(sandbox_id)}/watchers/{quote(watcher_id, safe='')}/events"
    return w.Op("GET", path, w.Answer(api.WatcherEvents))


def remove_watcher(sandbox_id: str, watcher_id: str) -> w.Op[None]:
    path = f"{_sandbox(sandbox_id)}/watchers/{quote(watcher_id, safe='')}"
    return w.Op("DELETE", path, w.no_content, idempotent=True, gone_is_done=True)
