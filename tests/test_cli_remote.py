"""The ``sandboxes`` CLI against a real sandbox service over HTTP: the service in-process (a real
uvicorn server on 127.0.0.1, local backend); the CLI through `main` and, where the process
boundary matters (environment, exit status, streaming, ``serve``), as the console script."""

from __future__ import annotations

import io
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tarfile
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import uvicorn
from support import HAS_BWRAP

from sandboxes import protocol as p
from sandboxes.cli import _decode as d
from sandboxes.cli import main
from sandboxes.client import _wire as w
from sandboxes.local import LocalTemplate
from sandboxes.server.app import create_app
from sandboxes.server.auth import hash_key
from sandboxes.server.settings import ServiceSettings

pytestmark = pytest.mark.needs(HAS_BWRAP, "the local backend needs bubblewrap")

KEYS = {"alice": "cli-key-alice-0123456789", "bob": "cli-key-bob-0123456789"}


def _script() -> list[str]:
    found = shutil.which("sandboxes") or shutil.which("sandboxes", path=str(Path(sys.executable).parent))
    return [found] if found else [sys.executable, "-m", "sandboxes.cli"]


SCRIPT = _script()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _settings(data_dir: Path) -> ServiceSettings:
    return ServiceSettings(
        data_dir=data_dir,
        api_keys={hash_key(key): tenant for tenant, key in KEYS.items()},
        templates={"default": LocalTemplate(default_timeout=30), "short": LocalTemplate(ttl=600)},
    )


@pytest.fixture(scope="module")
def url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    app = create_app(_settings(tmp_path_factory.mktemp("service")))
    port = _free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_config=None, lifespan="on"))
    thread = threading.Thread(target=server.run, name="cli-test-uvicorn", daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert thread.is_alive(), "the service did not start"
        assert time.monotonic() < deadline, "the service did not start in 30s"
        time.sleep(0.02)
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(30)


@dataclass
class Cli:
    """Runs ``sandboxes`` with this service and key: in-process through `main` (what the console
    script calls; a subprocess per call would cost most of this module's time in imports), or
    as the real console script with ``real=True``."""

    url: str
    key: str

    def __call__(self, *args: str, stdin: bytes = b"", real: bool = False) -> subprocess.CompletedProcess[bytes]:
        if real:
            env = {k: v for k, v in os.environ.items() if not k.startswith("SANDBOXES_")}
            env.update(SANDBOXES_URL=self.url, SANDBOXES_API_KEY=self.key)
            return subprocess.run([*SCRIPT, *args], input=stdin, capture_output=True, env=env, timeout=60)
        streams = [io.TextIOWrapper(io.BytesIO(data), encoding="utf-8") for data in (stdin, b"", b"")]
        saved = sys.stdin, sys.stdout, sys.stderr
        sys.stdin, sys.stdout, sys.stderr = streams
        try:
            code = main(["--url", self.url, "--api-key", self.key, *args])
        finally:
            sys.stdin, sys.stdout, sys.stderr = saved
        captured = []
        for stream in streams[1:]:
            stream.flush()
            captured.append(stream.buffer.getvalue())  # type: ignore[attr-defined]
        return subprocess.CompletedProcess(list(args), code, captured[0], captured[1])

    def ok(self, *args: str, stdin: bytes = b"", real: bool = False) -> str:
        result = self(*args, stdin=stdin, real=real)
        assert result.returncode == 0, (args, result.stderr.decode())
        return result.stdout.decode()


@pytest.fixture(scope="module")
def cli(url: str) -> Cli:
    return Cli(url, KEYS["alice"])


@pytest.fixture
def sandbox(cli: Cli) -> Iterator[str]:
    sandbox_id = cli.ok("create").strip()
    yield sandbox_id
    cli("rm", "-f", sandbox_id)


def _err(result: subprocess.CompletedProcess[bytes]) -> str:
    return result.stderr.decode()


# --------------------------------------------------------------------------- lifecycle


def test_create_list_rm(cli: Cli) -> None:
    argv = ("create", "--json", "--template", "short", "--label", "team=qa", "--ttl", "120")
    created = json.loads(cli.ok(*argv, real=True))
    assert (created["template"], created["backend"], created["labels"]) == ("short", "local", {"team": "qa"})
    assert created["expires_at"] - created["created_at"] == pytest.approx(120, abs=5)
    sandbox_id = created["id"]
    assert sandbox_id in cli.ok("ls").split()
    long = [line for line in cli.ok("ls", "-l").splitlines() if line.startswith(sandbox_id)]
    assert len(long) == 1
    assert long[0].split() == [sandbox_id, "short", "local", "expires", long[0].split()[4], created["workdir"]]
    listed = json.loads(cli.ok("--json", "ls"))
    assert [s["labels"] for s in listed if s["id"] == sandbox_id] == [{"team": "qa"}]

    assert cli.ok("rm", sandbox_id) == ""
    assert sandbox_id not in cli.ok("ls").split()
    again = cli("rm", sandbox_id)
    assert again.returncode == 1
    assert _err(again).startswith("error: not_found: ")
    assert cli("rm", "-f", sandbox_id).returncode == 0
    gone = cli("exec", "--sandbox", sandbox_id, "true")
    assert (gone.returncode, _err(gone).split(":")[:2]) == (1, ["error", " not_found"])


def test_create_with_an_idempotency_key_makes_one_sandbox(cli: Cli) -> None:
    key = f"cli-{uuid.uuid4()}"
    first = cli.ok("create", "--idempotency-key", key, "--label", "run=1").strip()
    try:
        assert cli.ok("create", "--idempotency-key", key, "--label", "run=1").strip() == first
        assert cli.ok("ls").split().count(first) == 1
        other = cli("create", "--idempotency-key", key, "--label", "run=2")
        assert (other.returncode, _err(other).split(":")[:2]) == (1, ["error", " invalid_request"])
    finally:
        cli("rm", "-f", first)


def test_create_sends_its_egress_allow_list(cli: Cli) -> None:
    listed = cli("create", "--egress", "example.com:443", "--egress", "10.0.0.0/8")
    assert (listed.returncode, _err(listed).split(":")[:2]) == (1, ["error", " invalid_request"])
    assert "has no egress" in _err(listed)  # the list reached the service, whose template has none
    sandbox_id = cli.ok("create", "--no-egress").strip()  # an empty list: what it has anyway
    cli.ok("rm", sandbox_id)
    with pytest.raises(SystemExit) as both:  # argparse's refusal: one or the other
        cli("create", "--egress", "example.com", "--no-egress")
    assert both.value.code == 2


def test_create_env_reaches_commands(cli: Cli) -> None:
    sandbox_id = cli.ok("create", "--env", "GREETING=hello there").strip()
    try:
        assert cli.ok("exec", "--sandbox", sandbox_id, 'echo "$GREETING"') == "hello there\n"
    finally:
        cli.ok("rm", sandbox_id)


def test_another_tenants_sandbox_is_not_found(cli: Cli, sandbox: str) -> None:
    bob = Cli(cli.url, KEYS["bob"])
    assert sandbox not in bob.ok("ls").split()
    for argv in (["exec", "--sandbox", sandbox, "true"], ["rm", sandbox], ["cp", f"{sandbox}:x", "-"]):
        result = bob(*argv)
        assert result.returncode == 1, argv
        assert _err(result).startswith("error: not_found: "), argv
    assert cli.ok("exec", "--sandbox", sandbox, "echo still here") == "still here\n"


# --------------------------------------------------------------------------- exec and file subcommands


def test_exec_output_status_argv_stdin_env_cwd(cli: Cli, sandbox: str) -> None:
    result = cli("exec", "--sandbox", sandbox, "echo out; echo err >&2; exit 7")
    assert (result.returncode, result.stdout, _err(result)) == (7, b"out\n", "err\n")  # each to its own stream
    assert cli.ok("exec", "--sandbox", sandbox, "printf", "%s|", "a b", "$(id)", "-n") == "a b|$(id)|-n|"
    assert cli.ok("exec", "--sandbox", sandbox, "--stdin", "tr a-z A-Z", stdin=b"shout\n") == "SHOUT\n"
    assert cli.ok("exec", "--sandbox", sandbox, "--env", "A=1", "--env", "B=x=y", "echo $A $B") == "1 x=y\n"
    workdir = cli.ok("exec", "--sandbox", sandbox, "pwd").strip()
    assert [s["workdir"] for s in json.loads(cli.ok("--json", "ls")) if s["id"] == sandbox] == [workdir]
    cli.ok("exec", "--sandbox", sandbox, "mkdir sub")
    assert cli.ok("exec", "--sandbox", sandbox, "--cwd", "sub", "--", "pwd") == f"{workdir}/sub\n"


def test_exec_streams_output_before_the_command_ends(cli: Cli, url: str, sandbox: str) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SANDBOXES_")}
    env.update(SANDBOXES_URL=url, SANDBOXES_API_KEY=KEYS["alice"])
    command = "echo first; sleep 3; echo second"
    with subprocess.Popen([*SCRIPT, "exec", "--sandbox", sandbox, command], stdout=subprocess.PIPE, env=env) as proc:
        assert proc.stdout is not None
        started = time.monotonic()
        first = proc.stdout.readline()
        seen_after = time.monotonic() - started
        rest = proc.stdout.read()
        assert proc.wait(30) == 0
    assert (first, rest) == (b"first\n", b"second\n")
    assert seen_after < 2.5, f"first line only after {seen_after:.1f}s: output was not streamed"


def test_exec_timeout_and_json(cli: Cli, sandbox: str) -> None:
    timed_out = cli("exec", "--sandbox", sandbox, "--timeout", "0.5", "echo started; sleep 30")
    assert timed_out.returncode == 124
    assert timed_out.stdout == b"started\n"
    assert _err(timed_out).startswith("error: timeout: ")
    loaded = json.loads(cli.ok("exec", "--json", "--sandbox", sandbox, "echo hi"))
    assert (loaded["output"], loaded["exit_code"], loaded["error"]) == ("hi\n", 0, None)


def test_file_subcommands_use_the_sandbox_workdir(cli: Cli, sandbox: str) -> None:
    workdir = cli.ok("exec", "--sandbox", sandbox, "pwd").strip()
    assert cli.ok("write", "--sandbox", sandbox, "src/main.py", "--content", "print('needle')\n") == ""
    assert cli.ok("read", "--sandbox", sandbox, "src/main.py") == "print('needle')\n"
    assert cli.ok("ls", "--sandbox", sandbox).splitlines() == [f"{workdir}/src/"]
    assert cli.ok("grep", "--sandbox", sandbox, "needle") == f"{workdir}/src/main.py:1:print('needle')\n"
    assert cli.ok("glob", "--sandbox", sandbox, "*.py") == f"{workdir}/src/main.py\n"
    missing = cli("read", "--sandbox", sandbox, "nope.txt")
    assert (missing.returncode, _err(missing)) == (1, f"error: file_not_found: File '{workdir}/nope.txt' not found\n")


# --------------------------------------------------------------------------- cp


def test_cp_file_in_and_out(cli: Cli, sandbox: str, tmp_path: Path) -> None:
    payload = os.urandom(3 << 20) + b"\x00\xff end"
    (tmp_path / "blob.bin").write_bytes(payload)
    cli.ok("exec", "--sandbox", sandbox, "mkdir -p in")
    assert cli.ok("cp", str(tmp_path / "blob.bin"), f"{sandbox}:in") == ""  # an existing dir: into it
    cli.ok("cp", str(tmp_path / "blob.bin"), f"{sandbox}:renamed.bin")  # not a dir: to that name
    cli.ok("cp", str(tmp_path / "blob.bin"), f"{sandbox}:new/dir/")  # trailing slash: a dir, made
    sizes = cli.ok("exec", "--sandbox", sandbox, "wc -c < in/blob.bin; wc -c < renamed.bin; wc -c < new/dir/blob.bin")
    assert sizes.split() == [str(len(payload))] * 3

    out = tmp_path / "out"
    out.mkdir()
    cli.ok("cp", f"{sandbox}:in/blob.bin", str(out))  # into an existing local dir
    cli.ok("cp", f"{sandbox}:renamed.bin", str(out / "copy.bin"))  # to a new local name
    assert (out / "blob.bin").read_bytes() == payload
    assert (out / "copy.bin").read_bytes() == payload


def test_cp_directory_tree_round_trip(cli: Cli, sandbox: str, tmp_path: Path) -> None:
    tree = tmp_path / "project"
    (tree / "src" / "pkg").mkdir(parents=True)
    (tree / "src" / "pkg" / "mod.py").write_text("x = 1\n")
    (tree / "README.md").write_text("ünïcødé readme\n")
    (tree / "empty").mkdir()
    (tree / "run.sh").write_text("#!/bin/sh\necho ran\n")
    (tree / "run.sh").chmod(0o755)
    cli.ok("cp", str(tree), f"{sandbox}:uploaded")
    assert cli.ok("exec", "--sandbox", sandbox, "./uploaded/run.sh; cat uploaded/src/pkg/mod.py") == "ran\nx = 1\n"
    assert cli.ok("exec", "--sandbox", sandbox, "test -d uploaded/empty && echo yes") == "yes\n"

    back = tmp_path / "back"
    cli.ok("cp", f"{sandbox}:uploaded", str(back))
    assert sorted(str(p.relative_to(back)) for p in back.rglob("*")) == sorted(
        str(p.relative_to(tree)) for p in tree.rglob("*")
    )
    assert (back / "README.md").read_text() == "ünïcødé readme\n"
    assert os.access(back / "run.sh", os.X_OK)


def test_cp_tar_streams_on_stdin_and_stdout(cli: Cli, sandbox: str) -> None:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        info = tarfile.TarInfo("from-stdin.txt")
        info.size = 5
        tar.addfile(info, io.BytesIO(b"hello"))
    cli.ok("cp", "-", f"{sandbox}:.", stdin=buffer.getvalue())
    assert cli.ok("read", "--sandbox", sandbox, "from-stdin.txt") == "hello"
    result = cli("cp", f"{sandbox}:from-stdin.txt", "-")
    assert result.returncode == 0, _err(result)
    with tarfile.open(fileobj=io.BytesIO(result.stdout)) as tar:
        assert tar.getnames() == ["from-stdin.txt"]
        member = tar.extractfile("from-stdin.txt")
        assert member is not None
        assert member.read() == b"hello"


def test_cp_out_skips_links_leading_outside(cli: Cli, sandbox: str, tmp_path: Path) -> None:
    cli.ok("exec", "--sandbox", sandbox, "mkdir d && echo ok > d/f && ln -s /etc/passwd d/evil && ln -s f d/good")
    result = cli("cp", f"{sandbox}:d", str(tmp_path / "d"))
    assert result.returncode == 0, _err(result)
    assert "skipped d/evil" in _err(result) or "skipped evil" in _err(result)
    assert sorted(p.name for p in (tmp_path / "d").iterdir()) == ["f", "good"]
    assert (tmp_path / "d" / "good").read_text() == "ok\n"


def test_cp_errors(cli: Cli, sandbox: str, tmp_path: Path) -> None:
    missing_local = cli("cp", str(tmp_path / "absent"), f"{sandbox}:x")
    assert (missing_local.returncode, _err(missing_local).split(":")[:2]) == (1, ["error", " file_not_found"])
    missing_remote = cli("cp", f"{sandbox}:absent", str(tmp_path / "x"))
    assert (missing_remote.returncode, _err(missing_remote).split(":")[:2]) == (1, ["error", " file_not_found"])
    assert not (tmp_path / "x").exists()
    escape = cli("cp", str(tmp_path), f"{sandbox}:../../outside")
    assert (escape.returncode, _err(escape).split(":")[:2]) == (1, ["error", " invalid_path"])
    for argv in (["cp", "a", "b"], ["cp", f"{sandbox}:a", f"{sandbox}:b"]):
        usage = cli(*argv)
        assert usage.returncode == 2, argv
        assert "exactly one of SOURCE and TARGET" in _err(usage)


# --------------------------------------------------------------------------- modes and failures


def test_wrong_key_and_unreachable_service(cli: Cli, sandbox: str) -> None:
    wrong = Cli(cli.url, "not-a-key")
    for argv in (["ls"], ["create"], ["exec", "--sandbox", sandbox, "true"]):
        result = wrong(*argv)
        assert result.returncode == 1, argv
        assert _err(result).startswith("error: unauthorized: "), argv
    down = Cli(f"http://127.0.0.1:{_free_port()}", KEYS["alice"])
    result = down("ls")
    assert (result.returncode, _err(result).split(":")[:2]) == (1, ["error", " unavailable"])


def test_mode_selection(cli: Cli, sandbox: str, tmp_path: Path) -> None:
    # --root means local even with SANDBOXES_URL set; --url/--sandbox with --root is ambiguous.
    (tmp_path / "local.txt").write_text("local file")
    assert cli.ok("--root", str(tmp_path), "read", "local.txt", real=True) == "local file"
    both = cli("--root", str(tmp_path), "--sandbox", sandbox, "ls", real=True)
    assert both.returncode == 2
    # SANDBOXES_URL alone means the service, where a protocol subcommand needs a sandbox.
    assert cli.ok("exec", "--sandbox", sandbox, "echo remote", real=True) == "remote\n"
    which = cli("exec", "true", real=True)
    assert (which.returncode, "--sandbox ID" in _err(which)) == (2, True)
    # create/rm/cp need a service.
    env = {k: v for k, v in os.environ.items() if not k.startswith("SANDBOXES_")}
    no_url = subprocess.run([*SCRIPT, "create"], capture_output=True, env=env, timeout=60)
    assert no_url.returncode == 2
    assert "SANDBOXES_URL" in no_url.stderr.decode()
    # --url with the key from the environment works too.
    explicit = subprocess.run(
        [*SCRIPT, "--url", cli.url, "--api-key", cli.key, "exec", "--sandbox", sandbox, "echo via flags"],
        capture_output=True,
        env=env,
        timeout=60,
    )
    assert (explicit.returncode, explicit.stdout) == (0, b"via flags\n")


# --------------------------------------------------------------------------- serve


def test_serve_refuses_without_keys(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SANDBOXES_")}
    result = subprocess.run(
        [*SCRIPT, "serve", "--data-dir", str(tmp_path), "--port", "0"], capture_output=True, env=env, timeout=60
    )
    assert result.returncode == 2
    assert "refusing to start without API keys" in result.stderr.decode()


def test_serve_runs_the_service_until_sigterm(tmp_path: Path) -> None:
    port = _free_port()
    config = tmp_path / "service.toml"
    config.write_text(f'port = {port}\ndata_dir = "{tmp_path / "data"}"\n\n[api_keys]\n"{hash_key("k-123")}" = "me"\n')
    env = {k: v for k, v in os.environ.items() if not k.startswith("SANDBOXES_")}
    log = tmp_path / "serve.log"
    with log.open("wb") as sink:
        proc = subprocess.Popen([*SCRIPT, "serve", "--config", str(config)], stdout=sink, stderr=sink, env=env)
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 30
        while True:
            assert proc.poll() is None, log.read_text()
            try:
                if httpx.get(f"{url}/readyz", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.1)
        me = Cli(url, "k-123")
        sandbox_id = me.ok("create").strip()
        assert me.ok("exec", "--sandbox", sandbox_id, "echo served") == "served\n"
        me.ok("rm", sandbox_id)
    finally:
        proc.send_signal(signal.SIGTERM)
        status = proc.wait(30)
    # uvicorn re-raises the signal once it has shut down, so the status is SIGTERM's; what
    # matters is that it went through the shutdown (drain, registry stop) first.
    assert status in (0, -signal.SIGTERM), log.read_text()
    assert "service stopped" in log.read_text()


# --------------------------------------------------------------------------- start-up cost

HEAVY = ("docker", "kubernetes", "langchain", "langgraph", "paramiko", "fastapi", "uvicorn", "starlette", "rich",
         "click", "pygments", "wcmatch", "bracex", "websockets", "h2", "tornado")  # fmt: skip
"""Packages a remote subcommand never needs: the backends' drivers, the service's stack, the
agent's, httpx's own command-line tool (click, rich, pygments), which httpx imports unless told
not to, and the glob matcher (a service's sandbox matches its globs itself); websockets (ports
and terminals only), HTTP/2 (the client speaks HTTP/1.1) and tenacity's Tornado support."""

THIRD_PARTY = {"sandboxes", "httpx", "httpcore", "h11", "anyio", "sniffio", "idna", "certifi", "zstandard", "pydantic",
               "pydantic_core", "annotated_types", "typing_extensions", "typing_inspection", "tenacity"}  # fmt: skip
"""Every non-standard top-level package a remote subcommand may import: the client's stack and
what it needs; anything more is a start-up cost to justify here first."""

MODELS_BUILT = 4
"""At most this many models of the API and of `sandboxes.lifecycle` have their validators built
by one subcommand (their build is deferred to first use: importing the client builds none)."""

_IMPORTS_AFTER = """
import inspect, json, sys
import pydantic
from sandboxes.cli import main
code = main(sys.argv[1:])
modules = sorted({name.split(".")[0] for name, module in sys.modules.items() if module is not None})
built = [name for api in ("sandboxes.api", "sandboxes.api_resources", "sandboxes.lifecycle")
         for name, kind in vars(sys.modules[api]).items()
         if inspect.isclass(kind) and issubclass(kind, pydantic.BaseModel) and kind.__module__ == api
         and kind.__pydantic_complete__]
print(json.dumps({"code": code, "modules": modules, "stdlib": sorted(sys.stdlib_module_names), "built": built}))
"""


def test_a_remote_subcommand_imports_no_heavy_package(cli: Cli) -> None:
    """A fresh interpreter runs a subcommand that takes the client (``--json ls``) against the
    service, as the console script does, then lists every top-level package it imported and the
    API models whose validators it built."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SANDBOXES_")}
    env["SANDBOXES_API_KEY"] = cli.key
    argv = ["--url", cli.url, "--json", "ls"]  # the JSON list takes the client, not the light path
    run = subprocess.run([sys.executable, "-c", _IMPORTS_AFTER, *argv], capture_output=True, env=env, timeout=60)
    assert run.returncode == 0, run.stderr.decode()
    report = json.loads(run.stdout.decode().splitlines()[-1])
    assert report["code"] == 0, run.stderr.decode()
    assert "httpx" in report["modules"]  # it did talk to the service
    assert sorted(set(HEAVY) & set(report["modules"])) == []
    others = {name for name in report["modules"] if not name.startswith("_")} - set(report["stdlib"])
    assert sorted(others - THIRD_PARTY) == []
    assert len(report["built"]) <= MODELS_BUILT, report["built"]


NOT_ON_THE_LIGHT_PATH = (
    "pydantic", "pydantic_core", "tenacity", "sandboxes.api", "sandboxes.client._wire", "asyncio", "httpx",
)  # fmt: skip
"""What a protocol subcommand against a sandbox, the plain list of sandboxes or a process
subcommand never imports (`sandboxes.cli._fast`): the API's models and their validator, the
retry library, asyncio; nor httpx for a plain ``http://`` service without a proxy."""

_LOADED_AFTER = f"""
import json, sys
from sandboxes.cli import main
code = main(sys.argv[1:])
print(json.dumps({{"code": code, "loaded": [name for name in {NOT_ON_THE_LIGHT_PATH!r} if name in sys.modules]}}))
"""


def test_the_light_subcommands_import_no_pydantic(cli: Cli, sandbox: str) -> None:
    """Each subcommand in a fresh interpreter, as the console script runs it: it talks to the
    service (its answer is right) and has imported none of `NOT_ON_THE_LIGHT_PATH`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SANDBOXES_") and not k.lower().endswith("_proxy")}
    env["SANDBOXES_API_KEY"] = cli.key
    on = ["--url", cli.url, "--sandbox", sandbox]
    started = cli.ok("process", "start", sandbox, "echo background").strip()
    calls = {
        "exec": ([*on, "exec", "echo light"], "light\n"),
        "exec --json": ([*on, "exec", "--json", "true"], '"exit_code": 0'),
        "write": ([*on, "write", "light.txt", "--content", "one\ntwo\n"], ""),
        "read": ([*on, "read", "light.txt"], "one\ntwo\n"),
        "ls": ([*on, "ls"], "light.txt"),
        "grep": ([*on, "grep", "two", "."], "light.txt:2:two"),
        "glob": ([*on, "glob", "*.txt"], "light.txt"),
        "list": (["--url", cli.url, "ls", "-l"], sandbox),
        "process start": (["--url", cli.url, "process", "start", sandbox, "true"], ""),
        "process wait": (["--url", cli.url, "process", "wait", sandbox, started], "background\n"),
    }
    for name, (argv, shown) in calls.items():
        run = subprocess.run([sys.executable, "-c", _LOADED_AFTER, *argv], capture_output=True, env=env, timeout=60)
        *printed, last = run.stdout.decode().splitlines(keepends=True)
        report = json.loads(last)
        assert (report["code"], run.returncode) == (0, 0), (name, run.stderr.decode())
        assert shown in "".join(printed), (name, printed)
        assert report["loaded"] == [], name
    # A proxy variable (httpx honours them): the same calls over httpx, still without the models.
    env["no_proxy"] = "proxy.invalid"
    run = subprocess.run([sys.executable, "-c", _LOADED_AFTER, *on, "exec", "echo light"], capture_output=True, env=env)
    *printed, last = run.stdout.decode().splitlines(keepends=True)
    assert (json.loads(last), printed) == ({"code": 0, "loaded": ["httpx"]}, ["light\n"]), run.stderr.decode()


def test_the_light_path_says_what_the_client_says(cli: Cli, sandbox: str) -> None:
    """What the light path does not vouch for (an argument the model refuses, an unknown
    sandbox) ends exactly as through the client: the same line, the same status."""
    refused = cli("--sandbox", sandbox, "exec", "--timeout", "inf", "true")
    assert refused.returncode == 1
    assert _err(refused).startswith("error: invalid_request: invalid ExecuteRequest: "), _err(refused)
    missing = cli("--sandbox", "nonexistent0000", "ls")
    assert missing.returncode == 1
    assert _err(missing).startswith("error: not_found: "), _err(missing)
    assert "(HTTP 404, request " in _err(missing)


def test_the_light_path_reads_real_answers_as_the_client_does(cli: Cli, sandbox: str) -> None:
    """The service's own answers, read by the light decoders (`sandboxes.cli._decode`) without
    help from the models, and by the client's models: the same values."""
    path = f"/v1/sandboxes/{sandbox}"
    with httpx.Client(base_url=cli.url, headers={"authorization": f"Bearer {cli.key}"}, timeout=60) as http:

        def answer(method: str, route: str, body: object = None) -> bytes:
            response = http.request(method, route, json=body)
            assert response.is_success, response.text
            return response.content

        def same(kind: type, raw: bytes, full: object) -> None:
            assert d.strictly(kind, raw) == full, raw

        raw = answer("GET", path)
        same(d.SandboxInfo, raw, d.SandboxInfo(**w.sandbox_info.decode(raw).model_dump()))
        raw = answer("GET", "/v1/sandboxes")
        same(
            d.SandboxList,
            raw,
            d.SandboxList([d.SandboxInfo(**i.model_dump()) for i in w.sandbox_list(httpx.Response(200, content=raw))]),
        )
        for command, timeout in (("echo out; echo err >&2; exit 3", None), ("sleep 5", 0.2)):
            raw = answer(
                "POST", f"{path}/execute", d.execute_body(command, timeout=timeout, stdin=None, env=None, cwd=None)
            )
            same(p.ExecuteResponse, raw, w.execute_response(w._EXECUTE.decode(raw)))
        body = d.execute_body("echo out; echo err >&2", timeout=None, stdin=None, env=None, cwd=None)
        with http.stream("POST", f"{path}/execute/stream", json=body) as stream:
            lines = [line for line in stream.iter_lines() if line.strip()]
        assert len(lines) >= 2
        for line in lines:
            event = w.stream_event(line)
            assert event is not None
            result = None if event.result is None else w.execute_response(event.result)
            full = d.StreamEvent(event.type, event.data, result, event.id, event.offset, event.stream)
            assert d.strictly(d.StreamEvent, line) == full, line
        files = {
            "write": ("/tmp/light.txt", "one\ntwo\n"), "read": ("/tmp/light.txt", 1, 5), "ls": ("/tmp",),
            "grep": ("two", "/tmp", None, None), "glob": ("*.txt", "/tmp"),
        }  # fmt: skip
        files["read missing"] = ("/tmp/missing.txt", 0, 10)
        for name, values in files.items():
            op = name.split()[0]
            raw = answer("POST", f"{path}/files/{op}", d.file_body(op, *values))
            kind = {
                "ls": p.LsResult,
                "read": p.ReadResult,
                "write": p.WriteResult,
                "grep": p.GrepResult,
                "glob": p.GlobResult,
            }[op]
            full = w._GREP.decode(raw) if op == "grep" else getattr(w, f"{op}_result").decode(raw)
            same(kind, raw, full)
        raw = answer(
            "POST", f"{path}/processes", d.execute_body("echo hi", timeout=None, stdin=None, env=None, cwd=None)
        )
        polled = answer("GET", f"{path}/processes/{w._PROCESS.decode(raw).id}")
        for each in (raw, polled):
            info = w._PROCESS.decode(each)
            result = None if info.result is None else w.execute_response(info.result)
            same(
                d.ProcessInfo, each, d.ProcessInfo(info.id, info.status, info.output, result, info.stdout, info.stderr)
            )


def test_exec_interrupted_kills_its_command(cli: Cli, url: str, sandbox: str) -> None:
    """Ctrl-C on a streamed ``exec`` kills the command in the service, not only the CLI."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SANDBOXES_")}
    env.update(SANDBOXES_URL=url, SANDBOXES_API_KEY=KEYS["alice"])
    marker = f"sbx-{uuid.uuid4().hex}"
    command = f"echo first; while :; do sleep 0.05; done; echo {marker}"
    with subprocess.Popen([*SCRIPT, "exec", "--sandbox", sandbox, command], stdout=subprocess.PIPE, env=env) as proc:
        assert proc.stdout is not None
        assert proc.stdout.readline() == b"first\n"
        assert _processes_with(cli, sandbox, marker), "the command does not run"
        proc.send_signal(signal.SIGINT)
        assert proc.wait(30) == 130
    deadline = time.monotonic() + 10
    while _processes_with(cli, sandbox, marker):
        assert time.monotonic() < deadline, "the interrupted command kept running in the service"
        time.sleep(0.05)


def _processes_with(cli: Cli, sandbox: str, marker: str) -> list[str]:
    """Processes of the sandbox with ``marker`` in their command line (read from stdin: not in the search's own)."""
    found = cli("exec", "--sandbox", sandbox, "--stdin", "grep -lsF -f - /proc/[0-9]*/cmdline", stdin=marker.encode())
    return found.stdout.decode().split()
