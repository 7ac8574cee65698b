"""The exec helper's native file ops (`sandboxes._helper._files`) answer exactly what the scripts
(`sandboxes._scripts.WRITE`, ``CAS_WRITE``, ``READ_FILE``) answer, for the tests of every backend
that has the helper: the same `Call`s run once natively and once as the script, each in its own
fresh copy of the same setup, and the exit codes, the outputs (a read's or a download's as its
parser reads them: the same bytes, wrapped or not) and the files left behind (names, modes,
groups, owners, types, sizes, contents) must be equal. Which path ran is counted by the helper's client
(`MuxClient.native_answers` / ``native_declined``), so a test cannot pass by never taking it.

Everything here is real: the sandbox, its helper and its shell; nothing is staged."""

from __future__ import annotations

import hashlib
import shlex
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sandboxes import _parse, _scripts
from sandboxes import protocol as p
from sandboxes._mux import MuxClient
from sandboxes.base import BaseSandbox, Call

__all__ = [
    "assert_a_failed_native_write_stops_sending",
    "assert_bad_op_refused",
    "assert_native_writes_match_the_scripts",
    "helper_client",
    "observe",
    "write_call",
]


def assert_a_failed_native_write_stops_sending(sandbox: Any, path: str, monkeypatch: Any, bound: int) -> None:
    """A native write that fails on the way (the disk's ``bound`` in bytes reached: ``no_space``)
    is answered by the helper at once and the client sends no more of it: a write of four times
    the bound sends well under half of its bytes (before, all of them went, then the answer)."""
    mux = helper_client(sandbox)
    sent = [0]
    send = mux._stream.send

    def counting(data: bytes) -> None:
        sent[0] += len(data)
        send(data)

    monkeypatch.setattr(mux._stream, "send", counting)
    before = mux.native_answers
    size = 4 * bound
    too_big = sandbox.write(path, "x" * size)
    assert too_big.error == p.NO_SPACE, too_big
    assert mux.native_answers == before + 1, "not written by the helper"
    assert sent[0] < size // 2, f"{sent[0]} of {size} bytes sent"
    assert sandbox.execute("true").exit_code == 0  # the helper took the rest of the frames in stride
    assert mux.alive


def helper_client(sandbox: Any) -> MuxClient:
    """The sandbox's live exec helper client (Local, Docker, SSH, Kubernetes), started if needed."""
    assert sandbox.execute("true").exit_code == 0
    mux = sandbox.exec_helper()  # `sandboxes._mux.HoldsHelper`, on every backend that has a helper
    assert isinstance(mux, MuxClient), "no exec helper"
    assert mux.alive, "the exec helper is not alive"
    return mux


def assert_bad_op_refused(sandbox: Any, op: list[str]) -> None:
    """A malformed native op (what the client never sends, a forged or broken one might) is
    answered as an error, and the helper serves on."""
    mux = helper_client(sandbox)
    answer = mux.run_native(op, None, timeout=30, output_limit=1 << 20)
    assert answer is not None
    assert answer.error == p.BACKEND_ERROR
    assert "bad file op" in (answer.message or "")
    assert sandbox.execute("echo alive").output == "alive\n"
    assert mux.alive


def assert_file_ops_go_native(sandbox: Any, directory: str) -> None:
    """A write and an edit answered by the exec helper itself: three native answers (the
    write, the edit's read and its compare-and-swap), and the file as edited; a download of
    1 MiB of binary, one native answer."""
    mux = helper_client(sandbox)
    before = mux.native_answers
    path = f"{directory}/native.txt"
    assert sandbox.write(path, "a b\n").error is None
    assert sandbox.edit(path, "b", "c").error is None
    assert mux.native_answers == before + 3  # the edit's read and its compare-and-swap
    assert sandbox.read(path).file_data == p.FileData("a c\n")
    blob = bytes(range(256)) * 4096  # 1 MiB of every byte value: answered raw, and exactly
    assert sandbox.upload_files([(f"{directory}/blob.bin", blob)])[0].error is None
    before = mux.native_answers
    got, missing = sandbox.download_files([f"{directory}/blob.bin", f"{directory}/missing"])
    assert (got.error, got.content == blob, missing.error) == (None, True, p.FILE_NOT_FOUND)
    assert mux.native_answers == before + 1
    raw = sandbox._run_call(download_call("-", f"{directory}/blob.bin")).output  # not base64: 2.4 ms a MiB to decode
    assert raw == "\0" + f"0 {len(blob)}\n" + blob.decode("latin-1")


def write_call(path: str, data: bytes, size: int | None = None) -> Call:
    args = (path, str(len(data) if size is None else size), uuid.uuid4().hex[:16])
    return Call(_scripts.command(_scripts.WRITE, *args), data, idempotent=False, native=("write", *args))


def read_call(path: str, limit: int = 256 << 20) -> Call:
    args = (path, str(limit))
    return Call(_scripts.command(_scripts.READ_FILE, *args), native=("read_file", *args))


def upload_call(directory: str, files: list[tuple[str, bytes]], sizes: list[int] | None = None) -> Call:
    """`_scripts.UPLOAD` of ``files`` (names under ``directory``), announcing ``sizes`` when given."""
    counts = sizes if sizes is not None else [len(data) for _, data in files]
    args = [uuid.uuid4().hex[:16]]
    for (name, _), count in zip(files, counts, strict=True):
        args += [f"{directory}/{name}", str(count)]
    stream = b"".join(data for _, data in files)
    return Call(_scripts.command(_scripts.UPLOAD, *args), stream, idempotent=False, native=("upload", *args))


def download_call(limit: str, *paths: str) -> Call:
    args = (limit, *paths)
    return Call(_scripts.command(_scripts.DOWNLOAD, *args), native=("download", *args))


def cas_call(path: str, digest: str, data: bytes, size: int | None = None) -> Call:
    args = (path, digest, str(len(data) if size is None else size), uuid.uuid4().hex[:16])
    return Call(_scripts.command(_scripts.CAS_WRITE, *args), data, idempotent=False, native=("cas_write", *args))


@dataclass(frozen=True)
class Case:
    name: str
    setup: str
    """Shell run in the case's fresh directory first."""
    call: Callable[[str], Call]
    """The call, given that directory."""
    native: bool
    """Whether the helper answers it itself (``False``: it hands it back to the script)."""
    concurrent: str | None = None
    """A command run alongside the call (a FIFO's reader), its output compared too."""


_OLD = b"old content\n"
_OLD_MD5 = hashlib.md5(_OLD, usedforsecurity=False).hexdigest()
HOSTILE = "-x \n'q\"$(touch PWNED)`id`*\\"
NOT_UTF8 = "bad\udcffname"
"""A name with the byte 0xff, as Python spells it (surrogateescape): paths are str end to end."""
NOT_UTF8_SH = "\"$(printf 'bad\\377name')\""


def _cases(foreign: bool) -> list[Case]:
    old = "printf 'old content\\n' > f"
    cases = [
        Case("new file: umask mode", "", lambda d: write_call(f"{d}/new.txt", b"hello"), True),
        Case("parents created", "", lambda d: write_call(f"{d}/a/b/c.txt", b"deep"), True),
        Case("hostile name", "", lambda d: write_call(f"{d}/{HOSTILE}", b"hostile"), True),
        Case("non-UTF-8 name (byte 0xff)", "", lambda d: write_call(f"{d}/{NOT_UTF8}", b"bytes"), True),
        Case("empty content", old, lambda d: write_call(f"{d}/f", b""), True),
        Case("mode kept", f"{old}; chmod 640 f", lambda d: write_call(f"{d}/f", b"new"), True),
        Case("set-id bits kept", f"{old}; chmod 4750 f", lambda d: write_call(f"{d}/f", b"new"), True),
        Case("read-only file", f"{old}; chmod 444 f", lambda d: write_call(f"{d}/f", b"new"), True),
        Case("a directory", "mkdir f", lambda d: write_call(f"{d}/f", b"new"), True),
        Case("below a file", old, lambda d: write_call(f"{d}/f/g/h", b"new"), True),
        Case("short stream", old, lambda d: write_call(f"{d}/f", b"12345", size=10), True),
        Case("long stream", old, lambda d: write_call(f"{d}/f", b"12345", size=3), True),
        Case("new file, read-only dir", "mkdir ro; chmod 555 ro", lambda d: write_call(f"{d}/ro/new", b"x"), True),
        Case(
            "existing file, read-only dir (in place)",
            f"mkdir ro; {old.replace('> f', '> ro/f')}; chmod 555 ro",
            lambda d: write_call(f"{d}/ro/f", b"new"),
            False,
        ),
        Case("symlink (written through)", f"{old}; ln -s f link", lambda d: write_call(f"{d}/link", b"new"), False),
        Case("dangling symlink", "ln -s nowhere link", lambda d: write_call(f"{d}/link", b"new"), False),
        Case("FIFO: refused, never opened", "mkfifo fifo", lambda d: write_call(f"{d}/fifo", b"x"), True),
        Case(
            "symlink to a FIFO: refused", "mkfifo fifo; ln -s fifo link", lambda d: write_call(f"{d}/link", b"x"), True
        ),
        Case("a device: refused", "", lambda d: write_call("/dev/null", b"x"), True),
        Case("cas: unchanged", old, lambda d: cas_call(f"{d}/f", _OLD_MD5, b"swapped"), True),
        Case("cas: mode kept", f"{old}; chmod 600 f", lambda d: cas_call(f"{d}/f", _OLD_MD5, b"swapped"), True),
        Case("cas: changed", "printf other > f", lambda d: cas_call(f"{d}/f", _OLD_MD5, b"swapped"), True),
        Case("cas: missing", "", lambda d: cas_call(f"{d}/f", _OLD_MD5, b"swapped"), True),
        Case("cas: a directory", "mkdir f", lambda d: cas_call(f"{d}/f", _OLD_MD5, b"swapped"), True),
        Case("cas: below a file", old, lambda d: cas_call(f"{d}/f/g", _OLD_MD5, b"swapped"), True),
        Case("cas: short", old, lambda d: cas_call(f"{d}/f", _OLD_MD5, b"ab", size=5), True),
        Case("cas: symlink", f"{old}; ln -s f link", lambda d: cas_call(f"{d}/link", _OLD_MD5, b"swapped"), False),
    ]
    cases += [
        Case("read", old, lambda d: read_call(f"{d}/f"), True),
        Case("read: empty", "true > f", lambda d: read_call(f"{d}/f"), True),
        Case(
            "read: binary, lines wrapped", "seq 1 2000 > f; printf '\\377\\0' >> f", lambda d: read_call(f"{d}/f"), True
        ),
        Case("read: at most the limit", old, lambda d: read_call(f"{d}/f", limit=5), True),
        Case("read: through a symlink", f"{old}; ln -s f link", lambda d: read_call(f"{d}/link"), True),
        Case("read: missing", "", lambda d: read_call(f"{d}/f"), True),
        Case("read: a directory", "mkdir f", lambda d: read_call(f"{d}/f"), True),
        Case("read: below a file", old, lambda d: read_call(f"{d}/f/g"), True),
        Case("read: unreadable", f"{old}; chmod 000 f", lambda d: read_call(f"{d}/f"), True),
        Case("read: a FIFO, never opened", "mkfifo fifo", lambda d: read_call(f"{d}/fifo"), True),
        Case("read: dangling symlink", "ln -s nowhere link", lambda d: read_call(f"{d}/link"), True),
        Case("read: big, sent a step at a time", "seq 1 2000000 > f", lambda d: read_call(f"{d}/f"), True),
        Case("read: big, within the limit", "seq 1 2000000 > f", lambda d: read_call(f"{d}/f", limit=300000), True),
        Case("read: a file whose size says 0", "", lambda d: read_call("/proc/version"), True),
        Case("read: non-UTF-8 name", f"printf x > {NOT_UTF8_SH}", lambda d: read_call(f"{d}/{NOT_UTF8}"), True),
        Case("read: hostile name", f"printf x > {shlex.quote(HOSTILE)}", lambda d: read_call(f"{d}/{HOSTILE}"), True),
    ]
    every_kind = (
        f"{old}; true > empty; seq 1 3000 > lines; printf '\\377\\0' >> lines; mkdir dir; ln -s f link; "
        f"ln -s nowhere dangling; mkfifo fifo; printf x > unreadable; chmod 000 unreadable; "
        f"printf h > {shlex.quote(HOSTILE)}; printf n > {NOT_UTF8_SH}"
    )
    names = [
        "f",
        "empty",
        "lines",
        "dir",
        "link",
        "dangling",
        "fifo",
        "unreadable",
        "missing",
        "f/below",
        HOSTILE,
        NOT_UTF8,
    ]
    cases += [
        Case("upload", old, lambda d: upload_call(d, [("f", b"new"), ("a/b/new", b"deep"), ("empty", b"")]), True),
        Case(
            "upload: every refusal",
            f"{old}; mkdir dir; printf ro > ro; chmod 444 ro; mkdir rodir; chmod 555 rodir",
            lambda d: upload_call(
                d,
                [("dir", b"x"), ("f/below", b"y"), ("ro", b"z"), ("rodir/new", b"w"), ("ok", b"v")],
            ),
            True,
        ),
        Case(
            "upload: hostile and non-UTF-8 names, binary",
            "",
            lambda d: upload_call(d, [(HOSTILE, b"\x00\xff\n"), (NOT_UTF8, bytes(range(256)))]),
            True,
        ),
        Case(
            "upload: a FIFO among others, refused",
            "mkfifo fifo",
            lambda d: upload_call(d, [("f", b"new"), ("fifo", b"x"), ("g", b"next")]),
            True,
        ),
        Case("upload: one path twice", "", lambda d: upload_call(d, [("f", b"first"), ("f", b"second")]), True),
        Case("upload: short stream", "", lambda d: upload_call(d, [("a", b"12"), ("b", b"")], [5, 3]), True),
        Case("upload: short, then nothing", "", lambda d: upload_call(d, [("a", b"1")], [4]), True),
        Case("upload: long stream", "", lambda d: upload_call(d, [("a", b"12345"), ("b", b"6789")], [2, 3]), True),
        Case(
            "upload: a symlink among them (in place)",
            f"{old}; ln -s f link",
            lambda d: upload_call(d, [("new", b"x"), ("link", b"through")]),
            False,
        ),
        Case("download", old, lambda d: download_call("-", f"{d}/f"), True),
        Case("download: every kind", every_kind, lambda d: download_call("-", *(f"{d}/{n}" for n in names)), True),
        Case(
            "download: over the limit",
            f"{old}; printf abc > small",
            lambda d: download_call("5", f"{d}/f", f"{d}/small"),
            True,
        ),
        Case("download: at the limit", old, lambda d: download_call("12", f"{d}/f"), True),
        Case(
            "download: bytes that read like headers and statuses",
            r"printf '0 3\n\000!0\n\377\n7 0\n' > f; : > empty",
            lambda d: download_call("-", f"{d}/f", f"{d}/missing", f"{d}/empty", f"{d}/f"),
            True,
        ),
        Case(
            "download: big files among small ones, sent a step at a time",
            "seq 1 2000000 > f; printf x > small; head -c 262144 f > step; head -c 262145 f > over",
            lambda d: download_call("-", f"{d}/f", f"{d}/small", f"{d}/step", f"{d}/missing", f"{d}/over", f"{d}/f"),
            True,
        ),
        Case("download: a file whose size says 0", "", lambda d: download_call("-", "/proc/version"), True),
        Case("download: over the limit, its size says 0", "", lambda d: download_call("5", "/proc/version"), True),
    ]
    if foreign:
        cases.append(
            Case("another user's file (in place)", "chmod 777 .", lambda d: write_call(f"{d}/foreign", b"new"), False)
        )
    return cases


_OBSERVE = r"""cd "$1" || exit 99
[ "$2" = open ] && chmod -R u+rwx . 2>/dev/null
find . -mindepth 1 -exec stat -c '%n %a %u %g %F %s' {} + | LC_ALL=C sort
find . -type f -exec md5sum {} + | LC_ALL=C sort
"""


def observe(sandbox: BaseSandbox, directory: str, *, open_up: bool = False) -> str:
    """Everything under ``directory``: names, modes, owners, types, sizes, contents; with
    ``open_up``, after making it all readable (what a delete could not remove)."""
    result = sandbox.execute(_scripts.command(_OBSERVE, directory, "open" if open_up else "as-is"))
    assert result.exit_code == 0, result
    return result.output


def _run_case(
    sandbox: BaseSandbox, case: Case, directory: str, make_foreign: Callable[[str], None] | None
) -> tuple[int | None, str, str, str]:
    made = sandbox.execute(
        f"mkdir -p {shlex.quote(directory)} && cd {shlex.quote(directory)} && {case.setup or 'true'}"
    )
    assert made.exit_code == 0, (case.name, made)
    if case.name.startswith("another user's"):
        assert make_foreign is not None
        make_foreign(f"{directory}/foreign")
    reader: list[p.ExecuteResponse] = []
    thread = None
    if case.concurrent is not None:
        command = case.concurrent
        thread = threading.Thread(target=lambda: reader.append(sandbox.execute(command, cwd=directory, timeout=60)))
        thread.start()  # it and the write meet at the FIFO, whichever opens it first
    response = sandbox._run_call(case.call(directory))
    if thread is not None:
        thread.join(90)
        assert reader, f"{case.name}: the reader did not end"
    assert response.error is None, (case.name, response)
    seen = observe(sandbox, directory)
    # The output where the parser reads it (success); a failure is its exit code, and the
    # shell's own complaint beside it (``cannot open ...``) is noise no caller sees.
    output = _as_read(case.call(directory), response.output) if response.exit_code == 0 else ""
    return response.exit_code, output, seen, reader[0].output if reader else ""


def _as_read(call: Call, output: str) -> str:
    """``output`` as its parser reads it: a read's or a download's base64 decoded (coreutils
    wraps it in lines of 76, the helper sends one line: `sandboxes._helper._native._base64`), the
    statuses beside; any other op's as it is."""
    op = call.native[0] if call.native else None
    if op == "read_file":
        return repr(_parse.file_bytes(output))
    if op == "download":
        return repr(_parse.downloads(output, len(call.native or ()) - 2))
    return output


def assert_native_writes_match_the_scripts(
    sandbox: BaseSandbox, root: str, make_foreign: Callable[[str], None] | None = None
) -> None:
    """Every case twice, natively and as the script, in fresh directories under ``root``: the
    same answer and the same files; the helper answered exactly the cases meant to be native.
    ``make_foreign(path)`` creates a world-writable file at ``path`` owned by another user."""
    assert sandbox.native_file_ops, "the sandbox does not offer native writes"
    mux = helper_client(sandbox)
    run = uuid.uuid4().hex[:8]
    differences = []
    try:
        for index, case in enumerate(_cases(make_foreign is not None)):
            sandbox.native_file_ops = False
            before = (mux.native_answers, mux.native_declined)
            scripted = _run_case(sandbox, case, f"{root}/parity-{run}/{index}-script", make_foreign)
            assert (mux.native_answers, mux.native_declined) == before, f"{case.name}: native ops were off"
            sandbox.native_file_ops = True
            native = _run_case(sandbox, case, f"{root}/parity-{run}/{index}-native", make_foreign)
            answered, declined = mux.native_answers - before[0], mux.native_declined - before[1]
            assert (answered, declined) == ((1, 0) if case.native else (0, 1)), f"{case.name}: wrong path"
            if native != scripted:
                differences.append((case.name, scripted, native))
    finally:
        sandbox.native_file_ops = True
        sandbox.execute(
            f"chmod -R u+w {shlex.quote(f'{root}/parity-{run}')}; rm -rf {shlex.quote(f'{root}/parity-{run}')}"
        )
    assert not differences, "\n".join(f"{name}:\n script {s!r}\n native {n!r}" for name, s, n in differences)
