"""DockerSandbox's bulk path (files over `BULK_THRESHOLD`) against a sandbox that fights back.

The Docker engine's archive API (``put_archive``/``get_archive``) works as root from outside
the container and resolves the container's symlinks itself: a directory the sandbox swapped
for a link to ``/etc`` between the shell's check and the transfer made an upload write into
the read-only root (and onto the engine's disk, past the workspace's size limit), and a
download return ``/etc/shadow``. Big files must move as the sandbox's user, where the kernel
checks every access: these tests make the sandbox win each race on purpose (it runs its swap
right after the check, or watches the transfer and swaps mid-way), then look at the root as
root, from outside the sandbox, to see that nothing was written there.

Every test runs through the exec helper and through the one-``docker exec``-per-command path.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from support import SESSION_OWNER

from sandboxes import protocol as p
from sandboxes._mux import Command
from sandboxes._mux import _stall as stall
from sandboxes._output import OutputHook
from sandboxes._staged import CHUNK_BYTES as STAGE_CHUNK_BYTES
from sandboxes.docker import BULK_THRESHOLD, DockerSandbox, DockerSandboxConfig

BIG = BULK_THRESHOLD + 4096
REFUSED = (p.PERMISSION_DENIED, p.INVALID_PATH)


@pytest.fixture(scope="module", params=[True, False], ids=["helper", "docker-exec"])
def sandbox(request: pytest.FixtureRequest, docker_client: Any, runtime_image: str) -> Iterator[DockerSandbox]:
    config = DockerSandboxConfig(image=runtime_image, owner=SESSION_OWNER, use_exec_helper=request.param)
    with DockerSandbox.create(config, client=docker_client) as sb:
        yield sb


@pytest.fixture
def clean(sandbox: DockerSandbox) -> Iterator[DockerSandbox]:
    """The sandbox with an empty workspace after the test, and its root as it found it."""
    before = _root_listing(sandbox)
    yield sandbox
    assert sandbox.execute("rm -rf /workspace/* /workspace/.[!.]*", timeout=60).exit_code == 0
    assert _root_listing(sandbox) == before


def _as_root(sandbox: DockerSandbox, script: str) -> str:
    """Run ``script`` as root through the engine, outside every path the sandbox controls."""
    result = sandbox.container.exec_run(["sh", "-c", script], user="root")
    assert result.exit_code == 0, result.output
    return bytes(result.output).decode()


def _root_listing(sandbox: DockerSandbox) -> str:
    """Every entry of the directories a link could lead an upload to, as root sees them."""
    return _as_root(sandbox, "ls -A /etc /etc/ssl /usr/local /")


def _assert_nothing_written_outside(sandbox: DockerSandbox, before: str) -> None:
    after = _root_listing(sandbox)
    assert after == before, f"the read-only root changed: {set(after.split()) ^ set(before.split())}"
    found = "find / -xdev \\( -name 'evil*' -o -name '.sandboxes-write.*' \\) -print 2>/dev/null; true"
    assert _as_root(sandbox, found) == ""


def _swap_first(sandbox: DockerSandbox, monkeypatch: pytest.MonkeyPatch, hook: str, swap: str) -> list[int]:
    """Make the sandbox win the race: its ``swap`` command runs after the shell checked the
    path and before the bulk transfer (``hook``: ``_bulk_put`` or ``_bulk_get``) starts."""
    swapped: list[int] = []
    original = getattr(sandbox, hook)

    def raced(*args: Any) -> Any:
        result = sandbox.execute(swap, timeout=30)
        swapped.append(result.exit_code or 0)
        return original(*args)

    monkeypatch.setattr(sandbox, hook, raced)
    return swapped


# ---------------------------------------------------------------------------- uploads


def test_a_big_upload_through_a_link_the_sandbox_made_writes_nothing_outside(clean: DockerSandbox) -> None:
    before = _root_listing(clean)
    assert clean.execute("ln -s /etc /workspace/sub").exit_code == 0
    response = clean.upload_files([("/workspace/sub/evil", b"E" * BIG)])[0]
    assert response.error in REFUSED, response
    _assert_nothing_written_outside(clean, before)


def test_a_link_swapped_in_after_the_check_cannot_redirect_a_big_upload(
    clean: DockerSandbox, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The check sees a real directory; the transfer meets a link to ``/etc``."""
    before = _root_listing(clean)
    assert clean.execute("mkdir /workspace/sub").exit_code == 0
    swapped = _swap_first(clean, monkeypatch, "_bulk_put", "rmdir /workspace/sub && ln -s /etc /workspace/sub")
    responses = clean.upload_files([("/workspace/sub/evil", b"E" * BIG), ("/workspace/fine.bin", b"F" * BIG)])
    assert swapped == [0]
    assert responses[0].error in REFUSED, responses[0]
    assert responses[1].error is None, responses[1]  # the batch's other file is not refused with it
    assert clean.download_files(["/workspace/fine.bin"])[0].content == b"F" * BIG
    _assert_nothing_written_outside(clean, before)


def test_a_link_swapped_in_during_a_big_upload_cannot_redirect_it(clean: DockerSandbox) -> None:
    """A command in the sandbox waits for the staged file to appear, then swaps its directory
    for a link to ``/etc`` while the rest of the bytes are still on their way."""
    before = _root_listing(clean)
    assert clean.execute("mkdir /workspace/sub").exit_code == 0
    watcher_script = (
        "i=0; while [ $i -lt 3000 ]; do"
        " for f in /workspace/sub/.sandboxes-write.*; do"
        '  if [ -s "$f" ]; then mv /workspace/sub /workspace/moved && ln -s /etc /workspace/sub && echo swapped;'
        "  exit 0; fi; done; i=$((i + 1)); sleep 0.01; done; echo never"
    )
    watched: list[p.ExecuteResponse] = []
    watcher = threading.Thread(target=lambda: watched.append(clean.execute(watcher_script, timeout=60)))
    watcher.start()
    try:
        response = clean.upload_files([("/workspace/sub/evil", b"E" * (64 << 20))])[0]
    finally:
        watcher.join(90)
    assert [w.output.strip() for w in watched] == ["swapped"], watched
    assert response.error is not None, "the upload succeeded although its directory became a link to /etc"
    assert clean.execute("test -e /workspace/moved/evil").exit_code == 1
    _assert_nothing_written_outside(clean, before)


@pytest.mark.parametrize("native", [True, False], ids=["native-ops", "scripts"])
def test_big_uploads_never_go_through_the_engines_archive_api(
    clean: DockerSandbox, monkeypatch: pytest.MonkeyPatch, native: bool
) -> None:
    """Several big files in one call are all written as the sandbox's user, never through
    ``put_archive``: by the exec helper itself where it runs with its native ops; otherwise
    those of more than one chunk each streamed into one ``docker exec`` of the staging script,
    the others through `execute`."""
    monkeypatch.setattr(clean, "native_file_ops", native)

    def refused(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("the engine's archive API was used")

    monkeypatch.setattr(clean.container, "put_archive", refused)
    monkeypatch.setattr(clean.container, "get_archive", refused)
    streamed: list[int] = []
    run_alone = clean.run_alone

    def measured(command: Command, on_output: OutputHook | None) -> p.ExecuteResponse:
        streamed.append(len(command.stdin) if command.stdin is not None else 0)
        return run_alone(command, on_output)

    monkeypatch.setattr(clean, "run_alone", measured)
    files = [(f"/workspace/split/{index}.bin", bytes([index]) * ((9 << 20) + index)) for index in range(3)]
    files.append(("/workspace/split/small.bin", b"s" * (2 << 20)))
    clean.execute("true")  # the helper started, if the sandbox has one
    answered = clean.helper_driver.mux.native_answers if clean.helper_driver.mux is not None else 0
    assert [r.error for r in clean.upload_files(files)] == [None] * 4
    if native and clean.helper_alive:
        assert streamed == []
        assert clean.helper_driver.mux is not None
        assert clean.helper_driver.mux.native_answers - answered == len(files)  # one staged write each
    else:
        assert sorted(n for n in streamed if n > STAGE_CHUNK_BYTES) == [len(data) for _, data in files[:3]]
    assert [r.content for r in clean.download_files([path for path, _ in files])] == [data for _, data in files]
    owners = clean.execute("stat -c '%u:%g %a' /workspace/split/*.bin").output.split("\n")
    assert owners[:4] == ["1000:1000 644"] * 4


# ---------------------------------------------------------------------------- downloads


_BIG_FILE = "head -c 2000000 /dev/zero > /workspace/big"


@pytest.mark.parametrize(
    ("setup", "swap", "path", "code"),
    [
        (
            "mkdir /workspace/d && head -c 2000000 /dev/zero > /workspace/d/shadow",
            "rm -r /workspace/d && ln -s /etc /workspace/d",
            "/workspace/d/shadow",
            p.PERMISSION_DENIED,
        ),
        (_BIG_FILE, "ln -sf /etc/shadow /workspace/big", "/workspace/big", p.PERMISSION_DENIED),
        (_BIG_FILE, "rm /workspace/big && mkdir /workspace/big", "/workspace/big", p.IS_DIRECTORY),
        (_BIG_FILE, "rm /workspace/big", "/workspace/big", p.FILE_NOT_FOUND),
        (_BIG_FILE, "rm /workspace/big && mkfifo /workspace/big", "/workspace/big", p.INVALID_ARGUMENT),
    ],
    ids=["directory-swapped-for-a-link", "file-swapped-for-a-link", "file-swapped-for-a-dir", "removed", "fifo"],
)
def test_a_big_download_answers_only_what_the_sandbox_may_read(
    clean: DockerSandbox, monkeypatch: pytest.MonkeyPatch, setup: str, swap: str, path: str, code: str
) -> None:
    """The size check sees a big file of the sandbox's; the transfer meets something else: a
    link to a file only root may read must answer ``permission_denied``, as ``cat`` would, and
    the rest what the inline path answers for them."""
    assert clean.execute(setup).exit_code == 0
    swapped = _swap_first(clean, monkeypatch, "_bulk_get", swap)
    response = clean.download_files([path])[0]
    assert swapped == [0]
    assert response.content is None, f"{path} returned {response.content[:40]!r}"
    assert response.error == code, response


def test_a_big_download_follows_links_as_the_sandbox_user_would(clean: DockerSandbox) -> None:
    """What the sandbox may read through a link comes back, as the inline path answers it."""
    assert clean.execute("head -c 2000000 /dev/urandom > /workspace/real && ln -s real /workspace/link").exit_code == 0
    real, linked = clean.download_files(["/workspace/real", "/workspace/link"])
    assert real.error is None
    assert linked.error is None
    assert real.content == linked.content
    assert len(real.content or b"") == 2000000


def _when_staging(sandbox: DockerSandbox, directory: str, then: str) -> tuple[threading.Thread, list[str]]:
    """Run ``then`` through the engine as the sandbox's user (outside the helper, which it may
    stop; root there has no capability to signal it) once a bulk write's bytes appear in
    ``directory``; its output lands in the returned list."""
    script = (
        "i=0; while [ $i -lt 3000 ]; do"
        f" for f in {directory}/.sandboxes-write.*; do"
        f'  if [ -s "$f" ]; then {then}; echo done; exit 0; fi; done; i=$((i + 1)); sleep 0.01; done; echo never'
    )
    said: list[str] = []
    user = sandbox.config.user

    def watch() -> None:
        said.append(bytes(sandbox.container.exec_run(["sh", "-c", script], user=user).output).decode().strip())

    watcher = threading.Thread(target=watch)
    watcher.start()
    return watcher, said


def test_a_helper_killed_midway_through_a_big_upload_leaves_no_bytes_behind(
    docker_client: Any, runtime_image: str
) -> None:
    """The helper writes the staged file through a temporary file of its own, which the commit
    does not know: a write cut off by the helper's death answers an error and removes it."""
    config = DockerSandboxConfig(image=runtime_image, owner=SESSION_OWNER)
    with DockerSandbox.create(config, client=docker_client) as sandbox:
        assert sandbox.execute("mkdir /workspace/up").exit_code == 0
        assert sandbox.helper_driver.mux is not None
        watcher, said = _when_staging(sandbox, "/workspace/up", f"kill -9 {sandbox.helper_driver.mux.info['pid']}")
        try:
            response = sandbox.upload_files([("/workspace/up/big", b"B" * (256 << 20))])[0]
        finally:
            watcher.join(60)
        assert said == ["done"]
        assert response.error == p.CONNECTION_LOST, response
        assert sandbox.execute("ls -A /workspace/up").output == ""


def test_a_helper_that_stops_taking_a_big_upload_ends_it(
    docker_client: Any, runtime_image: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A command can stop the helper (same user): the bytes' send then blocks, before any
    deadline is looked at. The upload still ends once no frame went for `STALL` seconds
    (`sandboxes._mux._stall`), with an error, and the next command gets a new helper."""
    monkeypatch.setattr(stall, "STALL", 2.0)
    config = DockerSandboxConfig(image=runtime_image, owner=SESSION_OWNER)
    with DockerSandbox.create(config, client=docker_client) as sandbox:
        assert sandbox.execute("mkdir /workspace/up").exit_code == 0
        assert sandbox.helper_driver.mux is not None
        pid = sandbox.helper_driver.mux.info["pid"]
        watcher, said = _when_staging(sandbox, "/workspace/up", f"kill -STOP {pid}")
        started = time.monotonic()
        try:
            response = sandbox.upload_files([("/workspace/up/big", b"B" * (1 << 30))])[0]
        finally:
            watcher.join(60)
            sandbox.container.exec_run(["kill", "-CONT", str(pid)], user=sandbox.config.user)
        assert said == ["done"]
        assert response.error is not None, response
        assert time.monotonic() - started < 30
        assert sandbox.execute("echo back").output == "back\n"


def test_a_big_download_is_bounded_and_endless_pseudo_files_too(clean: DockerSandbox) -> None:
    """A sparse file costs the sandbox nothing: the bulk path takes at most the bound of it
    (``file_too_large`` past it, by its size and by the bytes counted as they come), and of a
    link to an endless pseudo-file (which says it is empty) no more than the bound is taken."""
    made = clean.execute(
        "truncate -s 1G /workspace/sparse && head -c 3000000 /dev/urandom > /workspace/mid"
        " && ln -s /proc/self/pagemap /workspace/endless"
    )
    assert made.exit_code == 0, made
    big, mid, endless = clean.download_files_within(
        ["/workspace/sparse", "/workspace/mid", "/workspace/endless"], 2 << 20
    )
    assert (big.error, big.content) == (p.FILE_TOO_LARGE, None), big
    assert (mid.error, mid.content) == (p.FILE_TOO_LARGE, None), mid
    assert endless.error in (None, p.FILE_TOO_LARGE, p.PERMISSION_DENIED), endless
    assert endless.content is None or len(endless.content) <= 2 << 20
    [whole] = clean.download_files_within(["/workspace/mid"], 4 << 20)
    assert whole.content is not None
    assert len(whole.content) == 3000000


def test_the_async_transfers_take_the_bulk_path_the_sync_ones_take(
    clean: DockerSandbox, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``aupload_files`` and ``adownload_files`` move a big file through `_bulk_put` and
    `_bulk_get`, as ``upload_files`` and ``download_files`` do, and a small one inline, in one
    batch, each answer in its place."""
    moved: list[str] = []
    for hook in ("_bulk_put", "_bulk_get"):
        original = getattr(clean, hook)

        def recorded(*args: Any, _hook: str = hook, _original: Any = original) -> Any:
            moved.append(_hook)
            return _original(*args)

        monkeypatch.setattr(clean, hook, recorded)
    big, small = bytes(range(256)) * (BIG // 256 + 1), b"small"
    files = [("/workspace/async/small.txt", small), ("/workspace/async/big.bin", big)]

    async def transfer() -> tuple[list[p.FileUploadResponse], list[p.FileDownloadResponse]]:
        uploaded = await clean.aupload_files(files)
        return uploaded, await clean.adownload_files([path for path, _ in files])

    uploaded, downloaded = asyncio.run(transfer())
    assert [(r.path, r.error) for r in uploaded] == [(path, None) for path, _ in files]
    assert [(r.path, r.content) for r in downloaded] == files
    assert moved == ["_bulk_put", "_bulk_get"]


def test_the_bulk_path_reads_a_pseudo_file_to_its_end_within_its_bound(clean: DockerSandbox) -> None:
    """``/proc/self/status`` says it is empty: the bulk path reads it whole, or answers
    ``file_too_large`` past a bound smaller than what it holds; a device stays refused."""
    whole = clean._bulk_get("/proc/self/status", 1 << 20)
    assert isinstance(whole, bytes), whole
    assert whole.startswith(b"Name:\t"), whole
    assert clean._bulk_get("/proc/self/status", 64) == p.FILE_TOO_LARGE
    assert clean._bulk_get("/dev/zero", 1 << 20) == p.INVALID_ARGUMENT
