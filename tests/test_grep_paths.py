"""``grep`` has two script paths inside a sandbox: ripgrep where the sandbox has it, POSIX ``find``
and ``grep`` everywhere else (and the exec helper's native search before both). They must answer
exactly alike, over a tree built to trip either one
(names with ``:`` and newlines, hidden files, ignore files, binary files, symlinks, CRLF)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from support import SESSION_OWNER

from sandboxes import _scripts
from sandboxes import protocol as p
from sandboxes.docker import DockerSandbox, DockerSandboxConfig

ROOT = "/workspace/grep-tree"
FILES = {
    "a.py": "needle one\nnothing\nneedle two\n",
    "we:ird\nname.py": "a needle: with colon:1:\n",
    ".hidden/secret.txt": "needle hidden\n",
    "sub/deeper/c.txt": "x\r\nneedle crlf\r\n",
    "sub/.gitignore": "*\n",
    "sub/ignored.py": "needle despite .gitignore\n",
    "!bang.txt": "needle bang\n",
    "sp ace/ü.txt": "needle unicode ü\n",
}


@pytest.fixture(scope="module")
def sandbox(docker_client: Any, runtime_image: str) -> Iterator[DockerSandbox]:
    config = DockerSandboxConfig(image=runtime_image, owner=SESSION_OWNER)
    with DockerSandbox.create(config, client=docker_client) as sb:
        assert sb.upload_files([(f"{ROOT}/{name}", text.encode()) for name, text in FILES.items()])
        sb.upload_files([(f"{ROOT}/bin.dat", b"needle\x00binary\n")])
        assert sb.execute(f"ln -s {ROOT}/a.py {ROOT}/link.py && ln -s {ROOT}/sub {ROOT}/sublink").exit_code == 0
        assert sb.execute("command -v rg").exit_code == 0, "the runtime image ships ripgrep"
        yield sb


@pytest.mark.parametrize(
    ("pattern", "path", "glob"),
    [
        ("needle", ROOT, None),
        ("needle", ROOT, "*.py"),
        ("needle", ROOT, "**/*.txt"),
        ("needle", ROOT, "!bang.txt"),
        ("needle", ROOT, "{a,c}.*"),
        ("needle", f"{ROOT}/sub", None),
        ("needle", f"{ROOT}/a.py", None),
        ("needle", f"{ROOT}/sublink", None),
        (":1:", ROOT, None),
        ("absent", ROOT, None),
        ("needle", f"{ROOT}/missing", None),
    ],
)
def test_ripgrep_and_posix_tools_answer_alike(
    sandbox: DockerSandbox, pattern: str, path: str, glob: str | None
) -> None:
    """The scripts (the exec helper's native search off: it would answer both), and the
    native search beside them (`native_searches` covers it case by case)."""
    native = sandbox.grep(pattern, path, glob)
    sandbox.native_file_ops = False
    try:
        fast = sandbox.grep(pattern, path, glob)
        sandbox.search_tools = False
        plain = sandbox.grep(pattern, path, glob)
    finally:
        sandbox.search_tools = True
        sandbox.native_file_ops = True
    assert fast == plain
    assert native == fast


def test_the_tree_is_searched_whole(sandbox: DockerSandbox) -> None:
    """Not vacuous: the comparison above covers hidden, ignored, odd and CRLF files."""
    found = sandbox.grep("needle", ROOT)
    assert found.error is None
    assert {m.path.removeprefix(ROOT + "/") for m in found.matches} == {
        name for name, text in FILES.items() if "needle" in text
    }
    assert p.GrepMatch(f"{ROOT}/sub/deeper/c.txt", 2, "needle crlf\r") in found.matches
    for tool, form in (("rg", "=Z\n"), ("find", f"{ROOT}/")):
        output = sandbox.execute(_scripts.command(_scripts.GREP, ROOT, "needle", tool)).output
        assert output.startswith(form), f"the {tool} path was not taken"


def test_every_path_cuts_a_grep_at_the_cap(sandbox: DockerSandbox) -> None:
    """More matching lines than a grep answers: each script path sends at most its cap of them
    (`_scripts.GREP_PART_MAX`, the walk and search stopped there), and the answer says so."""
    wide = f"{ROOT}-wide"
    made = sandbox.execute(f"mkdir -p {wide} && yes needle | head -c {3 * _scripts.GREP_PART_MAX} > {wide}/f")
    assert made.exit_code == 0, made.output
    for tool in ("rg", "find"):
        command = _scripts.command(_scripts.GREP, wide, "needle", tool)
        output = sandbox.execute(command, output_limit=8 * _scripts.GREP_PART_MAX).output
        assert len(output.encode()) <= _scripts.GREP_PART_MAX + len(f"{wide}/f\0\0\n"), tool
    sandbox.native_file_ops = False
    try:
        for tools in (True, False):
            sandbox.search_tools = tools
            assert sandbox.grep("needle", wide).truncated
    finally:
        sandbox.search_tools = True
        sandbox.native_file_ops = True
