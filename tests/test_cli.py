"""The ``sandboxes`` console script, run for real as a subprocess against a LocalSandbox."""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import sys
from dataclasses import fields
from pathlib import Path

import pytest

from sandboxes import protocol as p
from sandboxes.paths import InvalidPathError, normalize_path
from sandboxes.testing.corpus import CANARY, HOSTILE_NAMES


def _script() -> list[str]:
    found = shutil.which("sandboxes") or shutil.which("sandboxes", path=str(Path(sys.executable).parent))
    return [found] if found else [sys.executable, "-m", "sandboxes.cli"]


SCRIPT = _script()


def run(
    *args: str,
    root: Path | None = None,
    stdin: bytes | None = None,
    cwd: Path | None = None,
    env_root: str | None = None,
) -> subprocess.CompletedProcess[bytes]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SANDBOXES_")}  # SANDBOXES_URL: remote mode
    if env_root is not None:
        env["SANDBOXES_ROOT"] = env_root
    argv = [*SCRIPT, *(["--root", str(root)] if root is not None else []), *args]
    return subprocess.run(argv, input=stdin or b"", capture_output=True, env=env, cwd=cwd, timeout=60)


def out(result: subprocess.CompletedProcess[bytes]) -> str:
    return result.stdout.decode()


def err(result: subprocess.CompletedProcess[bytes]) -> str:
    return result.stderr.decode()


def as_json(result: subprocess.CompletedProcess[bytes]) -> dict[str, object]:
    loaded = json.loads(result.stdout)
    assert isinstance(loaded, dict)
    return loaded


@pytest.fixture
def root(tmp_path: Path) -> Path:
    directory = tmp_path / "root"
    directory.mkdir()
    return directory.resolve()


# --------------------------------------------------------------------------- write / read


def test_write_content_then_read_prints_it_exactly(root: Path) -> None:
    written = run("write", "notes.txt", "--content", "one\ntwo\nno final newline", root=root)
    assert (written.returncode, written.stdout, written.stderr) == (0, b"", b"")
    assert (root / "notes.txt").read_text() == "one\ntwo\nno final newline"
    read = run("read", "notes.txt", root=root)
    assert read.returncode == 0
    assert out(read) == "one\ntwo\nno final newline"


def test_write_reads_stdin_when_no_content(root: Path) -> None:
    result = run("write", "sub/dir/f.txt", stdin="ünïcødé\n".encode(), root=root)
    assert result.returncode == 0, err(result)
    assert (root / "sub/dir/f.txt").read_text(encoding="utf-8") == "ünïcødé\n"


def test_write_refuses_non_utf8_stdin(root: Path) -> None:
    result = run("write", "f.bin", stdin=b"\xff\xfe\x00", root=root)
    assert result.returncode == 1
    assert err(result).startswith("error: invalid_argument: ")
    assert not (root / "f.bin").exists()


def test_write_onto_directory_reports_code(root: Path) -> None:
    (root / "d").mkdir()
    result = run("write", "d", "--content", "x", root=root)
    assert result.returncode == 1
    assert err(result).startswith("error: is_directory: ")


def test_read_window_and_continuation_hint(root: Path) -> None:
    (root / "lines.txt").write_text("".join(f"line {i}\n" for i in range(10)))
    result = run("read", "lines.txt", "--offset", "2", "--limit", "3", root=root)
    assert result.returncode == 0
    assert out(result) == "line 2\nline 3\nline 4\n"
    assert "--offset 5" in err(result)
    last = run("read", "lines.txt", "--offset", "8", root=root)
    assert (out(last), err(last)) == ("line 8\nline 9\n", "")


def test_read_offset_past_end_is_an_error(root: Path) -> None:
    (root / "short.txt").write_text("a\n")
    result = run("read", "short.txt", "--offset", "5", root=root)
    assert result.returncode == 1
    assert err(result).startswith("error: offset_out_of_range: ")


def test_read_binary_needs_base64_flag(root: Path) -> None:
    payload = bytes(range(256))
    (root / "blob.bin").write_bytes(payload)
    refused = run("read", "blob.bin", root=root)
    assert (refused.returncode, refused.stdout) == (1, b"")
    assert err(refused).startswith("error: not_a_text_file: ")
    assert "--base64" in err(refused)
    shown = run("read", "blob.bin", "--base64", root=root)
    assert shown.returncode == 0
    assert base64.b64decode(shown.stdout) == payload


def test_read_base64_of_text_file(root: Path) -> None:
    (root / "t.txt").write_text("plain text\n")
    result = run("read", "t.txt", "--base64", root=root)
    assert base64.b64decode(result.stdout) == b"plain text\n"


def test_read_missing_file(root: Path) -> None:
    result = run("read", "nope.txt", root=root)
    assert (result.returncode, result.stdout) == (1, b"")
    assert err(result) == f"error: file_not_found: File '{root}/nope.txt' not found\n"


# --------------------------------------------------------------------------- ls / grep / glob


def test_ls_lists_sorted_with_dirs_marked(root: Path) -> None:
    (root / "b.txt").write_text("bb")
    (root / "a.txt").write_text("a")
    (root / "sub").mkdir()
    (root / "sub" / "deep.txt").write_text("not listed")
    result = run("ls", root=root)
    assert result.returncode == 0
    assert out(result).splitlines() == [f"{root}/a.txt", f"{root}/b.txt", f"{root}/sub/"]
    long = run("ls", "-l", root=root)
    sizes = [line.split()[0] for line in out(long).splitlines()]
    assert sizes == ["1", "2", "0"]


def test_ls_errors(root: Path) -> None:
    (root / "file").write_text("x")
    missing = run("ls", "missing", root=root)
    assert (missing.returncode, err(missing).split(":")[:2]) == (1, ["error", " file_not_found"])
    not_dir = run("ls", "file", root=root)
    assert (not_dir.returncode, err(not_dir).split(":")[:2]) == (1, ["error", " not_a_directory"])


@pytest.fixture
def tree(root: Path) -> Path:
    (root / "src").mkdir()
    (root / "src" / "main.py").write_text("import os\nprint('needle')\n")
    (root / "src" / "util.py").write_text("needle = 1\nneedle += 1\n")
    (root / "README.md").write_text("a needle in a haystack\n")
    (root / "other.txt").write_text("nothing here\n")
    return root


def test_grep_prints_path_line_text_sorted(tree: Path) -> None:
    result = run("grep", "needle", root=tree)
    assert result.returncode == 0
    assert out(result).splitlines() == [
        f"{tree}/README.md:1:a needle in a haystack",
        f"{tree}/src/main.py:2:print('needle')",
        f"{tree}/src/util.py:1:needle = 1",
        f"{tree}/src/util.py:2:needle += 1",
    ]


def test_grep_glob_path_and_max_count(tree: Path) -> None:
    only_py = run("grep", "needle", "src", "--glob", "*.py", "--max-count", "2", root=tree)
    assert only_py.returncode == 0
    assert out(only_py).splitlines() == [f"{tree}/src/main.py:2:print('needle')", f"{tree}/src/util.py:1:needle = 1"]
    assert "truncated" in err(only_py)


def test_grep_is_literal_and_no_match_is_not_an_error(tree: Path) -> None:
    result = run("grep", "need.e", root=tree)
    assert (result.returncode, result.stdout, result.stderr) == (0, b"", b"")


def test_grep_missing_root(tree: Path) -> None:
    result = run("grep", "x", "absent", root=tree)
    assert result.returncode == 1
    assert err(result).startswith("error: file_not_found: ")


def test_glob_lists_matches(tree: Path) -> None:
    result = run("glob", "*.py", root=tree)
    assert out(result).splitlines() == [f"{tree}/src/main.py", f"{tree}/src/util.py"]
    anchored = run("glob", "**/*.md", str(tree), root=tree)
    assert out(anchored).splitlines() == [f"{tree}/README.md"]


def test_glob_refuses_dotdot_pattern(tree: Path) -> None:
    result = run("glob", "../*", root=tree)
    assert result.returncode == 1
    assert err(result).startswith("error: invalid_argument: ")


# --------------------------------------------------------------------------- exec


def test_exec_prints_output_and_propagates_exit_code(root: Path) -> None:
    result = run("exec", "echo out; echo err >&2; exit 7", root=root)
    assert result.returncode == 7
    assert out(result) == "out\nerr\n"


def test_exec_several_words_are_an_argv(root: Path) -> None:
    result = run("exec", "printf", "%s|", "a b", "$(id)", "-n", root=root)
    assert (result.returncode, out(result)) == (0, "a b|$(id)|-n|")


def test_exec_options_and_double_dash(root: Path) -> None:
    (root / "work").mkdir()
    result = run("exec", "--cwd", "work", "--", "pwd", root=root)
    assert (result.returncode, out(result)) == (0, f"{root}/work\n")


def test_exec_runs_in_root_by_default_and_forwards_stdin(root: Path) -> None:
    here = run("exec", "pwd", root=root)
    assert out(here) == f"{root}\n"
    piped = run("exec", "--stdin", "tr a-z A-Z", stdin=b"shout\n", root=root)
    assert out(piped) == "SHOUT\n"


def test_exec_timeout_exits_124(root: Path) -> None:
    result = run("exec", "--timeout", "0.5", "echo started; sleep 30", root=root)
    assert result.returncode == 124
    assert out(result) == "started\n"
    assert err(result).startswith("error: timeout: ")


def test_exec_without_command_is_usage_error(root: Path) -> None:
    result = run("exec", root=root)
    assert result.returncode == 2
    assert "a command is required" in err(result)


# --------------------------------------------------------------------------- --json


def _field_names(kind: type[object]) -> set[str]:
    return {f.name for f in fields(kind)}  # type: ignore[arg-type]


def test_json_for_every_subcommand(tree: Path) -> None:
    cases: list[tuple[list[str], type[object]]] = [
        (["exec", "--json", "echo hi"], p.ExecuteResponse),
        (["ls", "--json"], p.LsResult),
        (["read", "--json", "README.md"], p.ReadResult),
        (["write", "--json", "new.txt", "--content", "x"], p.WriteResult),
        (["grep", "--json", "needle"], p.GrepResult),
        (["glob", "--json", "*.py"], p.GlobResult),
    ]
    for argv, kind in cases:
        result = run(*argv, root=tree)
        assert result.returncode == 0, (argv, err(result))
        loaded = as_json(result)
        assert set(loaded) == _field_names(kind), argv
        assert loaded["error"] is None
    assert as_json(run("exec", "--json", "echo hi", root=tree))["output"] == "hi\n"
    grep = as_json(run("grep", "--json", "haystack", root=tree))
    assert grep["matches"] == [{"path": f"{tree}/README.md", "line": 1, "text": "a needle in a haystack"}]
    write = as_json(run("write", "--json", "w.txt", "--content", "x", root=tree))
    assert write["path"] == f"{tree}/w.txt"


def test_json_flag_before_subcommand_and_for_binary(root: Path) -> None:
    (root / "img.png").write_bytes(b"\x89PNG\r\n\x1a\n")
    result = run("--json", "read", "img.png", root=root)
    assert result.returncode == 0
    data = as_json(result)["file_data"]
    assert isinstance(data, dict)
    assert data["encoding"] == "base64"
    assert base64.b64decode(str(data["content"])) == b"\x89PNG\r\n\x1a\n"


def test_json_error_prints_result_and_exits_1(root: Path) -> None:
    result = run("ls", "--json", "missing", root=root)
    assert result.returncode == 1
    loaded = as_json(result)
    assert loaded["error"] == "file_not_found"
    assert loaded["entries"] is None
    assert err(result) == f"error: file_not_found: {loaded['message']}\n"


def test_json_exec_timeout(root: Path) -> None:
    result = run("exec", "--json", "--timeout", "0.3", "sleep 30", root=root)
    assert result.returncode == 124
    loaded = as_json(result)
    assert (loaded["error"], loaded["exit_code"]) == ("timeout", None)


# --------------------------------------------------------------------------- roots and paths


def test_root_from_environment_and_from_cwd(root: Path) -> None:
    (root / "marker.txt").write_text("here")
    from_env = run("read", "marker.txt", env_root=str(root))
    assert out(from_env) == "here"
    from_cwd = run("read", "marker.txt", cwd=root)
    assert out(from_cwd) == "here"


def test_missing_root_is_an_error_not_created(tmp_path: Path) -> None:
    result = run("ls", root=tmp_path / "typo")
    assert result.returncode == 1
    assert err(result).startswith("error: file_not_found: ")
    assert not (tmp_path / "typo").exists()


def test_absolute_paths_are_used_as_given(root: Path, tmp_path: Path) -> None:
    result = run("write", str(root / "abs.txt"), "--content", "abs", root=root)
    assert result.returncode == 0
    assert (root / "abs.txt").read_text() == "abs"


@pytest.mark.parametrize("path", ["", "../escape.txt", "a/../../b.txt"])
def test_invalid_paths_are_refused(root: Path, path: str) -> None:
    result = run("write", "--content", "x", "--", path, root=root)
    assert result.returncode == 1
    assert err(result).startswith("error: invalid_path: ")
    assert not (root.parent / "escape.txt").exists()


WEIRD = [n for n in HOSTILE_NAMES if n in {
    "with space.txt", "single'quote", "$(touch PWNED)", "`touch PWNED`", "-n", "--help",
    "new\nline", "colon:12:colon", "unicode-ünïcødé-日本語-🦀", "~tilde", "back\\slash",
}]  # fmt: skip


@pytest.mark.parametrize("name", WEIRD)
def test_weird_names_round_trip(root: Path, name: str) -> None:
    content = f"content of {name!r}\n"
    written = run("write", "--content", content, "--", name, root=root)
    try:
        normalize_path(f"{root}/{name}")
    except InvalidPathError:
        assert written.returncode == 1
        assert err(written).startswith("error: invalid_path: ")
        return
    assert written.returncode == 0, err(written)
    assert (root / name).read_text(encoding="utf-8") == content
    read = run("read", "--", name, root=root)
    assert out(read) == content
    # Exactly one entry: nothing else (such as the canary file) was created by a shell.
    entries = as_json(run("ls", "--json", root=root))["entries"]
    assert isinstance(entries, list)
    assert [(e["path"], e["is_dir"], e["size"]) for e in entries] == [(f"{root}/{name}", False, len(content.encode()))]
    assert not (root / CANARY).exists()


# --------------------------------------------------------------------------- usage


@pytest.mark.parametrize(
    "argv",
    [[], ["frobnicate"], ["--backend", "docker", "ls"], ["exec", "--timeout", "-1", "true"], ["read"]],
)
def test_usage_errors_exit_2(root: Path, argv: list[str]) -> None:
    result = run(*argv, root=root)
    assert result.returncode == 2
    assert "usage:" in err(result)


def test_module_entry_point_matches_console_script(root: Path) -> None:
    (root / "m.txt").write_text("via -m")
    result = subprocess.run(
        [sys.executable, "-m", "sandboxes.cli", "--root", str(root), "read", "m.txt"], capture_output=True, timeout=60
    )
    assert (result.returncode, result.stdout) == (0, b"via -m")
