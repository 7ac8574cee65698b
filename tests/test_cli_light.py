"""The CLI's light path (`sandboxes.cli._fast`, `sandboxes.cli._decode`) held to the client's
pydantic models, the one source of truth for the wire: its mirrors state the same fields, its
request bodies are the models' dumps, its configuration the client's defaults, and an answer it
does not vouch for is judged by the models. Its reading of real answers is checked against the
models in tests/test_cli_remote.py (it needs the service)."""

from __future__ import annotations

import dataclasses
import functools
import operator
import os
import types
import typing
from typing import Any

import pytest

from sandboxes import api
from sandboxes import protocol as p
from sandboxes.cli import _decode as d
from sandboxes.cli import _fast, _plain
from sandboxes.client import _ops
from sandboxes.client import _wire as w
from sandboxes.client.errors import InvalidRequest

_SWAPPED: dict[Any, Any] = {api.ExecuteResult: p.ExecuteResponse, api.SandboxInfo: d.SandboxInfo}
"""A mirror reads a nested model as the dataclass the client turns it into."""


def _swap(kind: Any) -> Any:
    if kind in _SWAPPED:
        return _SWAPPED[kind]
    args = typing.get_args(kind)
    origin = typing.get_origin(kind)
    if not args or origin is typing.Literal:
        return kind
    swapped = tuple(_swap(arg) for arg in args)
    if origin in (typing.Union, types.UnionType):
        return functools.reduce(operator.or_, swapped)
    return origin[swapped]


@pytest.mark.parametrize(
    ("mirror", "model"),
    [(d.SandboxInfo, api.SandboxInfo), (d.SandboxList, api.SandboxList), (d.StreamEvent, api.StreamEvent),
     (d.ProcessInfo, api.ProcessInfo)],
)  # fmt: skip
def test_each_mirror_states_its_model(mirror: type, model: Any) -> None:
    """The same fields in the same order, of the same types, required alike, with the same
    defaults: a field added to the model fails here until the mirror has it."""
    hints = typing.get_type_hints(mirror)
    fields = {field.name: field for field in dataclasses.fields(mirror)}
    assert list(fields) == list(model.model_fields)
    for name, info in model.model_fields.items():
        field = fields[name]
        required = field.default is dataclasses.MISSING and field.default_factory is dataclasses.MISSING
        assert required == info.is_required(), name
        assert hints[name] == _swap(info.annotation), name
        if not required:
            default = field.default_factory() if field.default_factory is not dataclasses.MISSING else field.default
            assert default == info.get_default(call_default_factory=True), name


def test_the_execute_result_and_request_fields_are_the_models() -> None:
    assert tuple(api.ExecuteResult.model_fields) == d.EXECUTE_RESULT_FIELDS
    for op, names in d.REQUEST_FIELDS.items():
        assert names == tuple(getattr(api, f"{op.capitalize()}Request").model_fields), op


@pytest.mark.parametrize(
    "options",
    [
        {"timeout": None, "stdin": None, "env": None, "cwd": None},
        {"timeout": 2.5, "stdin": b"in\x00put", "env": {"A": "1", "B": ""}, "cwd": "/tmp/x y"},
        {"timeout": 0.0, "stdin": b"", "env": {}, "cwd": "rel\udcff"},
    ],
)
def test_the_execute_body_is_the_models_dump(options: dict[str, Any]) -> None:
    assert d.execute_body("echo 'hi' \udcff", **options) == _ops.execute_body(
        "echo 'hi' \udcff", output_limit=None, **options
    )


@pytest.mark.parametrize(
    "options",
    [
        {"timeout": float("inf"), "stdin": None, "env": None, "cwd": None},
        {"timeout": -1.0, "stdin": None, "env": None, "cwd": None},
        {"timeout": None, "stdin": None, "env": {"A=B": "1"}, "cwd": None},
        {"timeout": None, "stdin": None, "env": {"A": "nul\x00"}, "cwd": None},
        {"timeout": None, "stdin": None, "env": None, "cwd": "/a\x00b"},
    ],
)
def test_an_execute_body_the_model_refuses_is_left_to_it(options: dict[str, Any]) -> None:
    with pytest.raises(d.Unsure):
        d.execute_body("true", **options)
    with pytest.raises(InvalidRequest):
        _ops.execute_body("true", output_limit=None, **options)


@pytest.mark.parametrize(
    ("op", "values"),
    [("ls", ("/w",)), ("read", ("/w/f", 3, 10)), ("write", ("/w/f", "text\n")), ("grep", ("x", None, "*.py", 5)),
     ("grep", ("x", "/w", None, None)), ("glob", ("*.txt", None))],
)  # fmt: skip
def test_a_file_body_is_the_models_dump(op: str, values: tuple[Any, ...]) -> None:
    model = getattr(api, f"{op.capitalize()}Request")
    assert d.file_body(op, *values) == w.model_json(model, **dict(zip(d.REQUEST_FIELDS[op], values, strict=True)))


def test_the_light_configuration_is_the_clients_for_the_cli() -> None:
    """The client's defaults, one retry (`sandboxes.cli.remote.connect`), the same httpx settings."""
    light = _fast.LightConfig("http://127.0.0.1:1/", "key")
    full = w.ClientConfig(url="http://127.0.0.1:1/", api_key="key", retries=1)
    for field in dataclasses.fields(light):
        assert getattr(light, field.name) == getattr(full, field.name), field.name
    assert (light.base_url(), light.headers()) == (full.base_url(), full.headers())
    for read in (w.DEFAULT_READ, None, 12.0):
        assert light.httpx_timeout(read) == full.httpx_timeout(read)
    assert {f.name for f in dataclasses.fields(light)} == set(w.ClientConfig.model_fields) - {
        "inline_upload_bytes", "max_batch_bytes", "max_download_bytes", "max_batch_download_bytes",
    }  # fmt: skip


@pytest.mark.parametrize(
    "raw",
    [
        b'{"output": "x", "exit_code": "0"}',  # a string for a number: the model takes it
        b'{"output": "x", "exit_code": 2.0, "duration_ms": 5}',
        b'{"output": "x", "exit_code": 0, "error": "what"}',  # an unknown code: the model refuses
        b'{"exit_code": 0}',
        b'{"output": "\\udcff", "exit_code": 0}',  # a lone surrogate: the model's parser refuses
        b"[1]",
        b"not json",
    ],
)
def test_an_answer_the_light_path_does_not_vouch_for_is_the_models(raw: bytes) -> None:
    def full() -> Any:
        return w.execute_response(w._EXECUTE.decode(raw))

    with pytest.raises(d.Unsure):
        d.strictly(p.ExecuteResponse, raw)
    outcomes = []
    for decode in (full, lambda: _fast._EXECUTE(raw)):
        try:
            outcomes.append(decode())
        except InvalidRequest as exc:
            outcomes.append(str(exc))
    assert outcomes[0] == outcomes[1]


def test_plain_http_serves_only_what_httpx_would_serve_alike(monkeypatch: pytest.MonkeyPatch) -> None:
    """http.client for a plain http:// service alone: https (its CA settings) and any proxy
    variable (httpx honours them, with their exceptions) leave the call to httpx."""
    for name in [name for name in os.environ if name.lower().endswith("_proxy")]:
        monkeypatch.delenv(name)
    assert _plain.usable("http://127.0.0.1:8080")
    assert not _plain.usable("https://127.0.0.1:8080")
    for name in ("HTTP_PROXY", "https_proxy", "ALL_PROXY", "no_proxy"):
        with monkeypatch.context() as env:
            env.setenv(name, "http://127.0.0.1:3128")
            assert not _plain.usable("http://127.0.0.1:8080"), name
