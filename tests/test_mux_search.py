"""The exec helper's native grep and glob (`sandboxes._helper._search`) on a local jail: the same
results as the scripts (`native_searches`), and what it hands back to them, answered alike:
work past its budget (entries walked, bytes read, output) and walks it must not make (a root on
``/dev``, a walk into another filesystem). The Docker, SSH and Kubernetes twins of the parity
test are in their backends' modules."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from native_searches import assert_native_searches_match_the_scripts
from native_writes import assert_bad_op_refused, helper_client

from sandboxes import _scripts
from sandboxes import protocol as p
from sandboxes._helper import _search
from sandboxes.local import LocalSandbox
from sandboxes.semantics import GREP_MAX_MATCHES


def test_native_searches_answer_what_the_scripts_answer(jail: LocalSandbox) -> None:
    assert_native_searches_match_the_scripts(jail, str(jail.root))


def test_grep_and_glob_start_no_process(jail: LocalSandbox) -> None:
    assert jail.write(f"{jail.root}/t/a.py", "one needle\n").error is None
    mux = helper_client(jail)
    before = mux.native_answers
    assert jail.grep("needle", f"{jail.root}/t").matches == [p.GrepMatch(f"{jail.root}/t/a.py", 1, "one needle")]
    assert jail.glob("*.py", f"{jail.root}/t").matches == [p.FileInfo(f"{jail.root}/t/a.py")]
    assert mux.native_answers == before + 2


_ENTRIES = _search.SEARCH_MAX_ENTRIES + 1
_BIG = _search.SEARCH_MAX_BYTES + (1 << 20)
_MATCHING = _search.SEARCH_MAX_OUTPUT // 2


_DEEPER_THAN_PATH_MAX = (
    'python3 -c \'import os\nfor _ in range(21): os.mkdir("d" * 200); os.chdir("d" * 200)\nopen("f.py", "w")\''
)
"""A file 4200 bytes of path down: ``find`` walks relative to each directory, the helper by
path, which the kernel refuses past 4096 (``ENAMETOOLONG``)."""


Search = Callable[[LocalSandbox, str], p.GrepResult | p.GlobResult]


@pytest.mark.parametrize(
    ("setup", "search"),
    [
        (f"seq {_ENTRIES} | xargs touch", lambda sb, d: sb.glob("*", d)),
        (f"seq {_ENTRIES} | xargs touch; echo x > 1", lambda sb, d: sb.grep("x", d)),
        (f"yes abcdefgh | head -c {_BIG} > f; echo needle >> f", lambda sb, d: sb.grep("needle", d)),
        (_DEEPER_THAN_PATH_MAX, lambda sb, d: sb.glob("*.py", d)),
        ("", lambda sb, d: sb.glob("*", "/dev")),
        ("", lambda sb, d: sb.glob("*", "/etc")),
        ("", lambda sb, d: sb.grep("root", "/etc")),
    ],
    ids=[
        "too many entries (glob)",
        "too many entries (grep)",
        "too many bytes",
        "deeper than PATH_MAX",
        "a root on /dev (glob)",
        "into other filesystems (glob)",
        "into other filesystems (grep)",
    ],
)
def test_what_the_helper_hands_back_the_script_answers(jail: LocalSandbox, setup: str, search: Search) -> None:
    """Bounded work: the helper's one thread serves every other command, so a big tree is the
    script's; and a walk into ``/proc`` would read the helper's own files, not grep's. The
    jail's ``/etc`` holds bind mounts of the host's files (another filesystem)."""
    directory = f"{jail.root}/tree"
    assert jail.execute(f"mkdir -p {directory} && cd {directory} && {setup or 'true'}").exit_code == 0
    mux = helper_client(jail)
    before = (mux.native_answers, mux.native_declined)
    handed_back = search(jail, directory)
    assert (mux.native_answers, mux.native_declined) == (before[0], before[1] + 1)
    jail.native_file_ops = False
    try:
        scripted = search(jail, directory)
    finally:
        jail.native_file_ops = True
    assert handed_back == scripted
    assert handed_back.error is None
    if setup:
        found = handed_back.matches
        assert found, "not vacuous: the tree has what is searched for"


def test_a_grep_past_the_output_cap_is_answered_cut_as_the_script_cuts_it(jail: LocalSandbox) -> None:
    """The helper's lines stop at the script's cap (``head -c``) and it answers them itself:
    the same first matches as the script, ``truncated``, not a whole search run again."""
    assert _search.SEARCH_MAX_OUTPUT == _scripts.GREP_PART_MAX
    directory = f"{jail.root}/wide"
    assert jail.execute(f"mkdir -p {directory} && yes needle | head -c {_MATCHING} > {directory}/f").exit_code == 0
    mux = helper_client(jail)
    before = (mux.native_answers, mux.native_declined)
    native = jail.grep("needle", directory)
    assert (mux.native_answers, mux.native_declined) == (before[0] + 1, before[1])
    jail.native_file_ops = False
    try:
        scripted = jail.grep("needle", directory)
    finally:
        jail.native_file_ops = True
    assert native == scripted
    assert native.truncated
    assert native.matches == [p.GrepMatch(f"{directory}/f", n, "needle") for n in range(1, GREP_MAX_MATCHES + 1)]


@pytest.mark.parametrize(
    "op",
    [["grep", "relative/path", "x"], ["grep", "/only-a-root"], ["find_files"], ["grep", "/x\u0000y", "x"]],
    ids=["relative root", "no pattern", "no root", "NUL in the root"],
)
def test_a_malformed_search_is_refused_and_the_helper_serves_on(jail: LocalSandbox, op: list[str]) -> None:
    """What the client never sends, a forged or broken one might: an error, not a crash."""
    assert_bad_op_refused(jail, op)
