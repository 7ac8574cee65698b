"""A real PostgreSQL server for the tests: Debian's ``postgresql`` package, started per module.

PostgreSQL refuses to run as root, and CI runs the tests as root: then initdb and pg_ctl run as
the ``postgres`` system user (``runuser``). The server listens on 127.0.0.1 on a free port and on
a unix socket in its own temporary directory, which is removed afterwards. Trust
authentication: only this machine's loopback reaches it, for the length of a test module.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from support import needs


def _bin_dir() -> Path | None:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    if found:
        return Path(found[-1]).parent
    initdb = shutil.which("initdb")
    return Path(initdb).parent if initdb else None


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _as_server_user(argv: list[str], user: str | None) -> list[str]:
    return ["runuser", "-u", user, "--", *argv] if user else argv


@pytest.fixture(scope="module")
def postgres_dsn() -> Iterator[str]:
    bin_dir = _bin_dir()
    needs(bin_dir is not None, "PostgreSQL is not installed here (apt-get install postgresql; .ci/run does)")
    assert bin_dir is not None
    user = "postgres" if os.geteuid() == 0 else None
    base = Path(tempfile.mkdtemp(prefix="agent-pg-"))
    data, sockets = base / "data", base / "sockets"
    sockets.mkdir()
    if user:
        record = pwd.getpwnam(user)
        for path in (base, sockets):
            os.chown(path, record.pw_uid, record.pw_gid)
    port = _free_port()
    role = user or pwd.getpwuid(os.geteuid()).pw_name
    run = {"check": True, "capture_output": True, "timeout": 120}
    try:
        subprocess.run(
            _as_server_user(
                [str(bin_dir / "initdb"), "-D", str(data), "--auth=trust", "-U", role, "--no-sync", "-E", "UTF8"],
                user,
            ),
            **run,  # type: ignore[arg-type]
        )
        options = f"-c listen_addresses=127.0.0.1 -p {port} -k {sockets} -c fsync=off"
        subprocess.run(
            _as_server_user(
                [str(bin_dir / "pg_ctl"), "-D", str(data), "-o", options, "-l", str(base / "log"), "-w", "start"],
                user,
            ),
            **run,  # type: ignore[arg-type]
        )
        try:
            yield f"postgresql://{role}@127.0.0.1:{port}/postgres"
        finally:
            subprocess.run(
                _as_server_user([str(bin_dir / "pg_ctl"), "-D", str(data), "-m", "immediate", "-w", "stop"], user),
                check=False,
                capture_output=True,
                timeout=60,
            )
    finally:
        shutil.rmtree(base, ignore_errors=True)
