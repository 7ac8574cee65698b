"""A fifth backend, added as one package and one template arm (``tests/toy_backend``, a TOY that
runs plain subprocesses in a directory) and registered from that package: the service serves it
through its real HTTP API and the real client without any other file knowing of it."""

from __future__ import annotations

from pathlib import Path

import httpx
import toy_backend
from service_harness import KEYS, running, settings_for

from sandboxes.client import SandboxClient


def test_the_service_serves_a_backend_added_as_one_package(tmp_path: Path) -> None:
    settings = settings_for(tmp_path, templates={"toy": {"backend": "toy", "default_timeout": 30}})
    assert isinstance(settings.templates["toy"], toy_backend.ToyTemplate)
    with running(settings) as service, SandboxClient(service.url, KEYS["alice"]) as client:
        sandbox = client.create("toy", labels={"kind": "toy"})
        assert sandbox.info is not None
        assert sandbox.info.backend == "toy"
        workdir = sandbox.workdir
        assert workdir is not None
        assert Path(workdir).parent == tmp_path / "toy"

        done = sandbox.execute("echo hello; pwd; echo oops >&2; exit 3")
        assert (done.exit_code, done.output) == (3, f"hello\n{workdir}\noops\n")

        assert sandbox.write(f"{workdir}/notes/a.txt", "one\ntwo\n").error is None
        read = sandbox.read(f"{workdir}/notes/a.txt")
        assert read.error is None
        assert read.file_data is not None
        assert "two" in read.file_data.content
        assert (Path(workdir) / "notes" / "a.txt").read_text() == "one\ntwo\n"  # really on its disk

        assert [info.id for info in client.list()] == [sandbox.id]
        sandbox.destroy()
        assert not Path(workdir).exists()
        assert client.list() == []

        with httpx.Client(base_url=service.url) as health:
            assert health.get("/readyz").status_code == 200
            (tmp_path / "toy" / "NOT_READY").touch()  # the readiness the toy's provider reports
            answer = health.get("/readyz")
        assert answer.status_code == 503
        assert answer.json()["problems"] == ["toy backend not ready (see the service log)"]
