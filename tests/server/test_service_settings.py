"""Configuration: defaults, a config file (TOML or JSON) under SANDBOXES_* variables under
explicit values, and the refusals that keep a misconfigured service from starting."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from sandboxes.server.auth import hash_key
from sandboxes.server.settings import ServiceSettings, parse_memory


@pytest.fixture(autouse=True)
def _clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    for name in list(os.environ):
        if name.startswith("SANDBOXES_"):
            monkeypatch.delenv(name)


def test_config_file_then_environment_then_arguments(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    digest = hash_key("k")
    config = tmp_path / "service.toml"
    config.write_text(
        f"""
port = 9000
owner = "from-file"
sweep_interval = 3
[api_keys]
"{digest}" = "alice"
[templates.default]
backend = "docker"
cpus = 2
[tenants.alice]
max_sandboxes = 3
"""
    )
    monkeypatch.setenv("SANDBOXES_CONFIG_FILE", str(config))
    monkeypatch.setenv("SANDBOXES_OWNER", "from-env")
    monkeypatch.setenv("SANDBOXES_DEFAULT_POLICY__RATE", "7")
    settings = ServiceSettings(port=9100)
    assert settings.port == 9100  # argument over file
    assert settings.owner == "from-env"  # environment over file
    assert settings.sweep_interval == 3  # file over default
    assert settings.api_keys == {digest: "alice"}
    assert settings.templates["default"].backend == "docker"
    assert settings.templates["default"].cpus == 2
    assert settings.policy_for("alice").max_sandboxes == 3
    assert settings.policy_for("someone").rate == 7


def test_json_config_file_and_templates_from_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = tmp_path / "service.json"
    config.write_text(json.dumps({"max_ttl": 60, "insecure": True}))
    monkeypatch.setenv("SANDBOXES_TEMPLATES", json.dumps({"py": {"image": "python:3", "backend": "docker"}}))
    settings = ServiceSettings(config_file=config)
    assert settings.max_ttl == 60
    assert settings.templates["py"].image == "python:3"


@pytest.mark.parametrize(
    ("options", "fragment"),
    [
        ({"api_keys": {"plain-key": "alice"}}, "SHA-256"),
        ({"templates": {}}, "at least one template"),
        ({"templates": {"t": {"isolation": "none"}}}, "insecure"),
        ({"templates": {"t": {"memory": "lots"}}}, "memory size"),
        ({"unknown_option": 1}, "unknown_option"),
    ],
)
def test_invalid_settings_are_refused(options: dict[str, object], fragment: str) -> None:
    with pytest.raises(ValidationError, match=fragment):
        ServiceSettings(**options)  # type: ignore[arg-type]


def test_unisolated_templates_need_insecure() -> None:
    settings = ServiceSettings(insecure=True, templates={"t": {"isolation": "none"}})  # type: ignore[dict-item]
    assert settings.templates["t"].isolation == "none"


def test_memory_sizes() -> None:
    assert parse_memory("512m") == 512 << 20
    assert parse_memory("2g") == 2 << 30
    assert parse_memory("1.5G") == 3 << 29
    assert parse_memory("1024") == 1024
    assert parse_memory("64MiB") == 64 << 20


def test_key_tools_print_hashes_not_keys() -> None:
    hashed = subprocess.run(
        [sys.executable, "-m", "sandboxes.server", "--hash-key"], input="secret\n", capture_output=True, text=True
    )
    assert hashed.stdout.strip() == hash_key("secret")
    made = subprocess.run(
        [sys.executable, "-m", "sandboxes.server", "--new-key", "carol"], capture_output=True, text=True
    )
    key = made.stdout.split("): ")[1].split()[0]
    assert f'"{hash_key(key)}" = "carol"' in made.stdout


@pytest.mark.parametrize(
    "config",
    [
        {"max_process_output_bytes": 1 << 20},
        {"default_policy": {"max_process_output": "1m"}},
        {"tenants": {"alice": {"max_process_output": "2m"}}},
    ],
)
def test_the_unshipped_output_budgets_are_unknown_settings(tmp_path: Path, config: dict[str, Any]) -> None:
    """The in-memory budgets for background output never shipped in a release: a config file
    naming them is refused like any other unknown setting, saying which."""
    file = tmp_path / "service.json"
    file.write_text(json.dumps({"insecure": True, **config}))
    with pytest.raises(ValidationError, match="max_process_output"):
        ServiceSettings(config_file=file, data_dir=tmp_path)
