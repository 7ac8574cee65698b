"""The OpenAPI document tells the truth about the service: what it accepts, what it refuses and
every status it answers. Checked by schemathesis, a client no one here wrote, against the
service on the Docker backend, and by the cases it once found, one test each."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any, get_args

import httpx
import pytest
from service_harness import KEYS, UNTHROTTLED, Running, alice_fixtures, running, settings_for
from support import SESSION_OWNER

from sandboxes.api import ServiceErrorCode
from sandboxes.docker import DockerTemplate
from sandboxes.protocol import ErrorCode

CONFIG = Path(__file__).with_name("schemathesis.toml")
HOOKS = Path(__file__).with_name("schemathesis_hooks.py")
SCHEMATHESIS = Path(sys.executable).with_name("schemathesis")
BUDGET = 75
"""Seconds schemathesis may generate cases for (its ``--max-time``)."""


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    with running(settings_for(tmp_path_factory.mktemp("openapi"))) as svc:
        yield svc


client, sandbox = alice_fixtures()


def _document(client: httpx.Client) -> dict[str, Any]:
    document: dict[str, Any] = client.get("/v1/openapi.json").json()
    return document


@pytest.mark.parametrize(
    "body",
    [
        {"command": "true", "timeout": False},
        {"command": "true", "output_limit": True},
        {"command": "true", "timeout": "5"},
        {"command": 5},
    ],
    ids=["bool-timeout", "bool-output-limit", "string-timeout", "number-command"],
)
def test_a_json_value_of_another_type_than_the_document_states_is_refused(
    client: httpx.Client, sandbox: dict[str, Any], body: dict[str, Any]
) -> None:
    response = client.post(f"/v1/sandboxes/{sandbox['id']}/execute", json=body)
    assert response.status_code == 422, response.text
    assert response.json()["error"] == "invalid_request"


def test_an_integer_written_with_a_zero_fraction_is_an_integer(client: httpx.Client, sandbox: dict[str, Any]) -> None:
    response = client.post(f"/v1/sandboxes/{sandbox['id']}/execute", json={"command": "echo hi", "output_limit": 100.0})
    assert response.status_code == 200, response.text
    assert response.json()["output"] == "hi\n"


def test_a_method_not_allowed_names_every_method_the_path_serves(client: httpx.Client) -> None:
    for path, allowed in [
        ("/v1/sandboxes", "GET, POST"),
        ("/v1/sandboxes/x", "DELETE, GET"),
        ("/v1/sandboxes/x/processes/y", "DELETE, GET"),
        ("/v1/sandboxes/x/archive", "GET, PUT"),
        ("/v1/sandboxes/x/execute/y", "DELETE"),
        ("/v1/sandboxes/x/execute/stream", "POST"),  # not a command named "stream"
    ]:
        response = client.options(path)
        assert response.status_code == 405, (path, response.text)
        assert response.headers["allow"] == allowed, path


def test_the_document_lists_this_services_templates(client: httpx.Client) -> None:
    template = _document(client)["components"]["schemas"]["CreateSandbox"]["properties"]["template"]
    assert template["enum"] == ["big", "default"]


def test_every_route_documents_its_failures(client: httpx.Client) -> None:
    for path, operations in _document(client)["paths"].items():
        for method, operation in operations.items():
            documented = set(operation["responses"])
            assert {"401", "422", "429", "503"} <= documented, (method, path, documented)
            if "{sandbox_id}" in path:
                assert "404" in documented, (method, path)
    create_responses = _document(client)["paths"]["/v1/sandboxes"]["post"]["responses"]
    assert {"403", "429"} <= set(create_responses)


def test_file_operations_document_their_results(client: httpx.Client) -> None:
    paths = _document(client)["paths"]
    read = paths["/v1/sandboxes/{sandbox_id}/files/read"]["post"]["responses"]["200"]["content"]["application/json"]
    assert read["schema"] == {"$ref": "#/components/schemas/ReadResult"}


def test_every_route_declares_its_answer(client: httpx.Client) -> None:
    """Each operation's success states its body's schema (or that it has none), so a client
    generated from the document decodes every answer, file operations' included."""
    for path, operations in _document(client)["paths"].items():
        for method, operation in operations.items():
            success = {status: answer for status, answer in operation["responses"].items() if status.startswith("2")}
            assert len(success) == 1, (method, path, success)
            ((status, answer),) = success.items()
            if status == "204":
                assert "content" not in answer, (method, path)
                continue
            schemas = [media.get("schema") for media in answer["content"].values()]
            assert all(schemas), (method, path, answer)


def test_error_codes_are_the_vocabulary_not_any_string(client: httpx.Client) -> None:
    """``error`` of an `ErrorBody`, a command's result and a download item is one of the
    protocol's codes (or, for an `ErrorBody`, of the service's), as the document states."""
    schemas = _document(client)["components"]["schemas"]
    protocol_codes = set(get_args(ErrorCode))

    def codes(schema: dict[str, Any]) -> set[str]:
        found = set(schema.get("enum", []))
        for part in schema.get("anyOf", []):
            found |= codes(schemas[part["$ref"].rsplit("/", 1)[1]] if "$ref" in part else part)
        return found

    assert codes(schemas["ErrorBody"]["properties"]["error"]) == protocol_codes | set(get_args(ServiceErrorCode))
    for model in ("ExecuteResult", "DownloadItem", "ReadResult", "FileUploadResponse"):
        assert codes(schemas[model]["properties"]["error"]) == protocol_codes, model


def test_what_the_schema_refuses_is_in_the_schema(client: httpx.Client) -> None:
    """Names the service refuses (an empty environment variable name, a label with a space, a
    TTL under a second, a relative archive path) are refused by the document too, so a client
    generating from it never sends them believing them valid."""
    document = _document(client)
    schemas = document["components"]["schemas"]
    create_schema = schemas["CreateSandbox"]["properties"]
    assert create_schema["env"]["additionalProperties"] is False
    assert create_schema["labels"]["additionalProperties"] is False
    assert create_schema["ttl"]["anyOf"][0]["minimum"] == 1
    archive = document["paths"]["/v1/sandboxes/{sandbox_id}/archive"]["get"]["parameters"]
    path = next(parameter for parameter in archive if parameter["name"] == "path")
    assert path["schema"]["pattern"] == r"^/[^\x00]*$"  # absolute, and no NUL (no path holds one)
    tokens = document["paths"]["/v1/sandboxes/{sandbox_id}/ports/{port}/tokens/{token_id}"]["delete"]
    token_id = next(parameter for parameter in tokens["parameters"] if parameter["name"] == "token_id")
    assert token_id["schema"]["pattern"] == "^[0-9a-f]{24}$"  # a token id the service refuses is not valid


@pytest.fixture(scope="module")
def docker_service(
    docker_client: Any, runtime_image: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Running]:
    labels = {"io.sandboxes.test-session": SESSION_OWNER}
    template = DockerTemplate(backend="docker", image=runtime_image, cpus=0.5, memory="256m", labels=labels)
    settings = settings_for(
        tmp_path_factory.mktemp("openapi-docker"),
        owner=f"{SESSION_OWNER}-openapi-{uuid.uuid4().hex[:6]}",
        templates={"default": template},
        tenants=UNTHROTTLED,
    )
    with running(settings, docker_client=docker_client) as svc:
        yield svc


@pytest.mark.slow
def test_schemathesis_finds_nothing_against_the_service_on_docker(docker_service: Running, tmp_path: Path) -> None:
    """Every phase (examples, coverage, fuzzing, stateful) and every check (each is on unless
    the config file turns it off for a stated reason; ``--checks`` would override that file),
    for a bounded time with a fixed seed, so a failure here replays."""
    command = [
        str(SCHEMATHESIS),
        "--no-color",
        "--config-file",
        str(CONFIG),
        "run",
        f"{docker_service.url}/v1/openapi.json",
        "--header",
        f"Authorization: Bearer {KEYS['alice']}",
        "--max-time",
        str(BUDGET),
        "--seed",
        "20261128",
        "--request-timeout",
        "30",
    ]
    environment = {**os.environ, "SCHEMATHESIS_HOOKS": str(HOOKS)}
    run = subprocess.run(command, capture_output=True, text=True, timeout=BUDGET * 4, cwd=tmp_path, env=environment)
    assert run.returncode == 0, run.stdout[-20000:] + run.stderr[-5000:]


def test_the_document_and_a_body_route_build_without_a_warning(tmp_path: Path) -> None:
    """The service's log carries no pydantic warning about the ``body`` parameters' alias at the
    document's first build or a body route's first request (a fresh process: warnings show once)."""
    program = (
        "import pathlib, sys\n"
        "from fastapi.testclient import TestClient\n"
        "from sandboxes.server.app import create_app\n"
        "from sandboxes.server.settings import ServiceSettings\n"
        "app = create_app(ServiceSettings(data_dir=pathlib.Path(sys.argv[1]), insecure=True))\n"
        "app.openapi()\n"
        "with TestClient(app) as client:\n"
        "    print(client.post('/v1/sandboxes', json={'template': 'nope'}).status_code)\n"
    )
    done = subprocess.run(
        [sys.executable, "-W", "default", "-c", program, str(tmp_path)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "422"
    assert "Warning" not in done.stderr, done.stderr
