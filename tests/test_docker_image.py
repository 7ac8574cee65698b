"""The runtime image has what an agent reaches for first: pip and venv, offline from uploaded wheels."""

from __future__ import annotations

import io
import zipfile
from typing import Any

from support import SESSION_OWNER

from sandboxes.docker import DockerSandbox, DockerSandboxConfig

WHEEL = "tiny-0.1-py3-none-any.whl"


def tiny_wheel() -> bytes:
    """A pure-python wheel of one module, ``tiny``, made here: no index is reachable."""
    files = {
        "tiny.py": "ANSWER = 42\n",
        "tiny-0.1.dist-info/METADATA": "Metadata-Version: 2.1\nName: tiny\nVersion: 0.1\n",
        "tiny-0.1.dist-info/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    files["tiny-0.1.dist-info/RECORD"] = "".join(f"{name},,\n" for name in [*files, "tiny-0.1.dist-info/RECORD"])
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as wheel:
        for name, text in files.items():
            wheel.writestr(name, text)
    return buffer.getvalue()


def test_pip_and_venv_work_offline_as_the_sandbox_user(docker_client: Any, runtime_image: str) -> None:
    config = DockerSandboxConfig(image=runtime_image, owner=SESSION_OWNER)
    with DockerSandbox.create(config, client=docker_client) as sandbox:
        [uploaded] = sandbox.upload_files([(f"/workspace/{WHEEL}", tiny_wheel())])
        assert uploaded.error is None
        for command in (
            "python3 -m pip --version && pip --version",
            # A plain install: for the user, under /workspace/.local (the home is read-only).
            f"pip install -q --no-index /workspace/{WHEEL} && python3 -c 'import tiny; print(tiny.ANSWER)'",
            # /tmp is noexec: its venv's scripts run through its python.
            f"python3 -m venv /tmp/v && /tmp/v/bin/python -m pip install -q --no-index /workspace/{WHEEL}"
            " && /tmp/v/bin/python -c 'import tiny, sys; print(tiny.ANSWER, sys.prefix)'",
        ):
            response = sandbox.execute(command, timeout=120)
            assert (response.exit_code, response.error) == (0, None), (command, response.output)
        assert sandbox.execute("python3 -c 'import tiny; print(tiny.__file__)'").output.startswith(
            "/workspace/.local/lib/python3"
        )
        assert response.output == "42 /tmp/v\n"
