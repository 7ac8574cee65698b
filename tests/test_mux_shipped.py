"""The exec helper as every transport ships it (`sandboxes._mux._shipped`): one argument well
under the kernel's limit on a single argument, and its modules compiled only when imported."""

from __future__ import annotations

import shlex
import subprocess
import sys

from sandboxes._mux import PYTHON_FLAGS, SERVER_SOURCE
from sandboxes._mux._shipped import HELPER_SOURCES, ON_DEMAND, SHIPPED_PACKAGE
from sandboxes.kubernetes import sandbox as kubernetes_sandbox
from sandboxes.local import sandbox as local_sandbox
from sandboxes.ssh import _users

MAX_ARG_STRLEN = 32 * 4096
"""Linux's limit on one argument (or environment entry) of an exec: ``E2BIG`` past it."""
HEADROOM = 64 << 10
"""What any one argument that starts a helper may take: half the kernel's limit, so that the
helper can grow (or a transport quote it once more) long before a start fails."""


def _arguments() -> dict[str, list[str]]:
    """Per transport, the arguments of the exec that starts a helper (SSH's and Kubernetes' are
    a shell command's and an exec's, each also one argument of the process they start)."""
    ssh = f"exec python3 {' '.join(PYTHON_FLAGS)} -c {shlex.quote(SERVER_SOURCE)}"
    return {
        "docker": ["python3", *PYTHON_FLAGS, "-c", SERVER_SOURCE, "--reap-init"],
        "local": list(local_sandbox.HELPER_COMMAND),
        "ssh": [ssh, _users.as_user(ssh, "sbx-01", "/home/sbx-01/.tmp")],
        "kubernetes": ["python3", *PYTHON_FLAGS, "-c", kubernetes_sandbox.BOOTSTRAP],
    }


def test_every_transport_starts_the_helper_with_arguments_far_below_the_kernels_limit() -> None:
    assert HEADROOM < MAX_ARG_STRLEN
    for transport, arguments in _arguments().items():
        longest = max(len(argument.encode()) for argument in arguments)
        assert longest < HEADROOM, f"{transport}: an argument of {longest} bytes"
    assert SERVER_SOURCE in local_sandbox.HELPER_COMMAND
    assert len(kubernetes_sandbox._SOURCE) < HEADROOM  # what Kubernetes sends through stdin


def test_the_shipped_helper_compiles_its_file_ops_only_when_they_are_imported() -> None:
    """The bootstrap's importer serves every module of `sandboxes._helper` by its shipped name,
    and runs none of the file ops' code before they are imported."""
    probe = (
        "import sys\n"
        "install = None\n"
        f"exec({SERVER_SOURCE.rpartition(';exec(b);')[0].partition(';')[2]!r})\n"
        "exec(b)\n"
        f"install(s, {SHIPPED_PACKAGE!r})\n"
        f"loaded = sorted(n for n in sys.modules if n.startswith({SHIPPED_PACKAGE!r}))\n"
        f"import {SHIPPED_PACKAGE}._files\n"
        f"later = sorted(n for n in sys.modules if n.startswith({SHIPPED_PACKAGE!r}))\n"
        "print(' '.join(loaded)); print(' '.join(later))\n"
    )
    prelude = SERVER_SOURCE.partition(";")[0]  # the bootstrap's imports
    result = subprocess.run(
        [sys.executable, *PYTHON_FLAGS, "-c", prelude + "\n" + probe],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    loaded, later = (set(line.split()) for line in result.stdout.splitlines())
    names = {f"{SHIPPED_PACKAGE}.{name}" for name in HELPER_SOURCES if name not in ("__init__", "_boot", *ON_DEMAND)}
    native = {
        f"{SHIPPED_PACKAGE}.{name}"
        for name in ("_files", "_native", "_reads", "_uploads", "_search", "_listing", "_usage")
    }
    assert loaded == (names - native) | {SHIPPED_PACKAGE}
    assert later == names | {SHIPPED_PACKAGE}
