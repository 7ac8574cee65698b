"""The client decodes the service's answers with the types `sandboxes.api` declares for each
route, the ones the service describes them with: what the service serialises comes back equal,
fields a newer service adds are ignored, and an ``error`` outside the protocol's vocabulary is
refused rather than passed on as one of its codes."""

from __future__ import annotations

import base64
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from sandboxes import api
from sandboxes import protocol as p
from sandboxes.client import InvalidRequest
from sandboxes.client import _wire as w
from sandboxes.client.errors import error_from_response
from sandboxes.server.responses import to_json

_INFO = p.FileInfo("/w/a.txt", False, 3, "2026-01-01T00:00:00Z")
ANSWERS: list[tuple[str, Any, Callable[[httpx.Response], Any]]] = [
    ("ls", p.LsResult(entries=[_INFO, p.FileInfo("/w/d/", True)]), w.ls_result),
    ("read", p.ReadResult(file_data=p.FileData("x\n"), total_lines=1, start_line=1, end_line=1), w.read_result),
    ("write", p.WriteResult(path="/w/a.txt"), w.write_result),
    ("edit", p.EditResult(p.STRING_NOT_FOUND, "not there"), w.edit_result),
    ("delete", p.DeleteResult(path="/w/a.txt"), w.delete_result),
    ("grep", p.GrepResult(matches=[p.GrepMatch("/w/a.txt", 1, "x")]), w.grep_result),
    ("glob", p.GlobResult(matches=[_INFO], truncated=True), w.glob_result),
    ("upload", [p.FileUploadResponse("/w/a"), p.FileUploadResponse("/x", p.INVALID_PATH, "no")], w.upload_results),
]


def _answer(data: Any) -> httpx.Response:
    return httpx.Response(200, content=data if isinstance(data, bytes) else to_json(data))


@pytest.mark.parametrize(("op", "result", "decode"), ANSWERS, ids=[op for op, _, _ in ANSWERS])
def test_what_the_service_serialises_the_client_decodes_equal(
    op: str, result: Any, decode: Callable[[httpx.Response], Any]
) -> None:
    assert decode(_answer(result)) == result


def test_downloads_commands_and_processes_decode_to_the_protocols_values() -> None:
    items = [
        api.DownloadItem(path="/w/a", content_b64=base64.b64encode(b"\x00\x01").decode()),
        api.DownloadItem(path="/w/b", error=p.FILE_NOT_FOUND, message="gone"),
    ]
    assert w.download_results(_answer(items)) == [
        p.FileDownloadResponse("/w/a", b"\x00\x01"),
        p.FileDownloadResponse("/w/b", None, p.FILE_NOT_FOUND, "gone"),
    ]
    result = api.ExecuteResult(output="", exit_code=None, error=p.TIMEOUT, message="killed", duration_ms=5.0)
    expected = p.ExecuteResponse("", None, error=p.TIMEOUT, message="killed", duration_ms=5.0)
    assert w.execute_result(_answer(result)) == expected
    status = w.process_status(_answer(api.ProcessInfo(id="j", status="timeout", result=result)))
    assert status == w.ProcessStatus("j", "timeout", "", expected)


def test_fields_a_newer_service_adds_are_ignored() -> None:
    assert w.ls_result(_answer({"entries": [], "cursor": "next"})) == p.LsResult(entries=[])
    answer = {"output": "hi\n", "exit_code": 0, "stdout": "hi\n"}
    assert w.execute_result(_answer(answer)) == p.ExecuteResponse("hi\n", 0)
    info = {"id": "s", "template": "default", "backend": "docker", "created_at": 1.0, "expires_at": None, "new": 1}
    assert w.sandbox_info(_answer(info)).id == "s"


@pytest.mark.parametrize(
    ("decode", "answer"),
    [
        (w.ls_result, {"error": "disk_on_fire", "message": "?"}),
        (w.read_result, {"error": "disk_on_fire"}),
        (w.execute_result, {"output": "", "exit_code": None, "error": "disk_on_fire"}),
        (w.upload_results, [{"path": "/w/a", "error": "disk_on_fire"}]),
        (w.download_results, [{"path": "/w/a", "error": "disk_on_fire"}]),
    ],
    ids=["ls", "read", "execute", "upload", "download"],
)
def test_an_error_outside_the_protocols_vocabulary_is_refused(
    decode: Callable[[httpx.Response], Any], answer: Any
) -> None:
    with pytest.raises(InvalidRequest, match="unexpected answer"):
        decode(_answer(answer))


def test_an_error_body_decodes_with_its_model_and_an_unknown_code_still_reads() -> None:
    known = error_from_response(httpx.Response(404, content=to_json(api.ErrorBody(error="not_found", message="no"))))
    assert (known.code, known.message) == ("not_found", "no")
    unknown = error_from_response(httpx.Response(418, json={"error": "teapot", "message": "short and stout"}))
    assert (unknown.code, unknown.message) == ("teapot", "short and stout")
