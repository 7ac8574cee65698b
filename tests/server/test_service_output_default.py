"""One default output limit, one meaning: a command that prints 5 MB without naming an
``output_limit`` answers the same through the library and through the service (whose
``max_output_bytes`` only caps what a request may ask)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from service_harness import KEYS, Running, running, settings_for

from sandboxes._output import DEFAULT_OUTPUT_LIMIT
from sandboxes.client import SandboxClient
from sandboxes.local import LocalSandbox

_PRINTED = 5_000_000
_COMMAND = f"head -c {_PRINTED} /dev/zero | tr '\\0' a"


@pytest.fixture
def service(tmp_path: Path) -> Iterator[Running]:
    settings = settings_for(tmp_path)
    assert settings.max_output_bytes > _PRINTED  # so the service's ceiling is not what cuts it
    with running(settings) as svc:
        yield svc


def test_the_same_command_answers_the_same_from_the_library_and_the_service(
    jail: LocalSandbox, service: Running
) -> None:
    direct = jail.execute(_COMMAND)
    with SandboxClient(service.url, KEYS["alice"]) as client, client.create("default") as remote:
        served = remote.execute(_COMMAND)
    assert (served.exit_code, served.truncated, served.output) == (direct.exit_code, direct.truncated, direct.output)
    assert direct.exit_code == 0
    assert direct.truncated
    assert DEFAULT_OUTPUT_LIMIT <= len(direct.output) < DEFAULT_OUTPUT_LIMIT + 100  # the kept halves and a marker
