"""E2B's ``base`` template as E2B runs it, on Docker with the ``sandboxes/e2b`` image
(``images/e2b``): commands run through ``bash -l -c`` as ``user`` (uid 1000), in and with a
home of ``/home/user``, where relative paths of the files API land too; no sudo, no root."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from e2b import CommandExitException, Sandbox
from e2b_harness import CLEANUP, opts
from service_harness import Running, running, settings_for
from support import SESSION_OWNER

from sandboxes.docker import DockerTemplate

E2B_IMAGE = "sandboxes/e2b:latest"


@pytest.fixture(scope="module")
def e2b_image(docker_client: Any) -> str:
    try:
        docker_client.images.get(E2B_IMAGE)
    except Exception:
        pytest.fail(f"{E2B_IMAGE} is missing: build it with `bash images/build.sh e2b`")
    return E2B_IMAGE


@pytest.fixture(scope="module")
def service(docker_client: Any, e2b_image: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    templates = {
        "e2b": DockerTemplate(
            backend="docker", image=e2b_image, workdir="/home/user", cpus=0.5, memory="256m", labels=CLEANUP
        )
    }
    settings = settings_for(tmp_path_factory.mktemp("e2buser"), owner=f"{SESSION_OWNER}-e2buser", templates=templates)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("SANDBOXES_E2B_TEMPLATES", '{"base": "e2b"}')
        with running(settings, docker_client=docker_client) as svc:
            yield svc


@pytest.fixture(scope="module")
def sandbox(service: Running) -> Iterator[Sandbox]:
    created = Sandbox.create(timeout=3600, **opts(service))  # the module's life, past the 300 s default
    yield created
    created.kill()


def test_commands_run_as_user_in_its_home(sandbox: Sandbox) -> None:
    seen = sandbox.commands.run(
        'echo "$(whoami) $(id -u) $(id -g) $HOME $(pwd) $0"; shopt -q login_shell && echo login'
    )
    assert seen.stdout == "user 1000 1000 /home/user /home/user /bin/bash\nlogin\n"
    assert sandbox.get_info().template_id == "base"


def test_the_home_is_writable_and_where_relative_paths_land(sandbox: Sandbox) -> None:
    assert sandbox.files.write("notes.txt", "in the home\n").path == "/home/user/notes.txt"
    assert sandbox.commands.run("cat /home/user/notes.txt; touch made-here").stdout == "in the home\n"
    assert sandbox.files.exists("/home/user/made-here")
    assert sandbox.commands.run("pip --version >/dev/null && echo $PYTHONUSERBASE").stdout == "/home/user/.local\n"
    assert sandbox.commands.run("echo $PATH").stdout.startswith("/home/user/.local/bin:")  # after the login's profile


def test_there_is_no_root_to_reach(sandbox: Sandbox, tmp_path: Path) -> None:
    with pytest.raises(CommandExitException):
        sandbox.commands.run("sudo -n true")
    with pytest.raises(CommandExitException):
        sandbox.commands.run("touch /etc/owned")
    assert sandbox.commands.run("grep CapEff /proc/self/status").stdout.split() == ["CapEff:", "0000000000000000"]
