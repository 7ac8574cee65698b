"""The service's local template passes its limits to the LocalSandbox it makes."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from service_harness import settings_for
from support import HAS_BWRAP

from sandboxes import protocol as p
from sandboxes.local import LocalSandbox, LocalTemplate
from sandboxes.server.backends import make_backends


@pytest.mark.needs(HAS_BWRAP, "bubblewrap (bwrap) is not installed")
def test_a_local_templates_memory_and_cpus_bound_its_sandboxes(tmp_path: Path) -> None:
    template = LocalTemplate(memory="256m", cpus=0.5)
    backend = make_backends(settings_for(tmp_path, templates={"small": template}))["small"]
    state, sandbox = backend.create("alice", time.time() + 60, {}, {})
    try:
        assert isinstance(sandbox, LocalSandbox)
        assert (sandbox.config.memory, sandbox.config.cpus) == (256 << 20, 0.5)
        hog = sandbox.execute("python3 -c \"b = b'x' * (1 << 30); print(len(b))\"", timeout=60)
        assert hog.exit_code != 0
        if sandbox._cgroup is not None:
            assert hog.error == p.OUT_OF_MEMORY
    finally:
        backend.destroy(state, sandbox)
