"""The exec helper's native searches (`sandboxes._helper._search`) answer exactly what the scripts
(`sandboxes._scripts.GREP`, ``FIND_FILES``) answer, for the tests of every backend that has the
helper: each grep and glob runs natively, then through the script with ripgrep where the
sandbox has it and with POSIX ``find`` and ``grep``, and the three results must be equal (a
case handed back ran the first script, and is compared with it only). Which
path ran is counted by the helper's client (`MuxClient.native_answers` / ``native_declined``),
so a test cannot pass by never taking it, nor by handing everything back.

The tree is built to trip a walker or a matcher: names with ``:``, newlines, quotes, a 0xff
byte, a leading dash or ``!``; hidden files; symlinks to files and directories (never followed)
and a dangling one; a FIFO (never opened); unreadable files and directories; binary files; CRLF,
a last line without newline, empty files and lines; a match twice on one line. Files where the
tools disagree with each other (a late NUL, byte order marks) live in their own directories, each
searched alone, and must be handed back. Everything is real: the sandbox, its helper, its tools."""

from __future__ import annotations

import shlex
import uuid
from collections.abc import Callable
from dataclasses import dataclass

from native_writes import helper_client

from sandboxes import protocol as p
from sandboxes.base import BaseSandbox

__all__ = ["assert_native_searches_match_the_scripts"]

_TREE = r"""mkdir -p tree/sub/deeper tree/.hidden tree/sp\ ace tree/noread tree/nosearch/inner edge/late edge/bom8 \
  edge/bom16 edge/nul-late-nomatch
cd tree
printf 'needle one\nnothing\nneedle two\n' > a.py
printf 'a needle: with colon:1:\n' > 'we:ird
name.py'
printf 'needle hidden\n' > .hidden/secret.txt
printf 'x\r\nneedle crlf\r\n' > sub/deeper/c.txt
printf 'needle bang\n' > '!bang.txt'
printf 'needle dash\n' > -dash.txt
printf 'needle quote\n' > "q'uo\"te.txt"
printf 'needle 0xff\n' > "$(printf 'bad\377name.txt')"
printf 'needle unicode \303\274\n' > "$(printf 'sp ace/\303\274.txt')"
printf 'needle needle twice\n\nno\nlast needle' > sub/last.txt
printf '' > empty.txt
printf '\n\n' > blank.txt
printf '\000needle early nul\n' > early.bin
printf 'needle hidden in noread\n' > noread/f.txt
printf 'needle hidden in nosearch\n' > nosearch/inner/f.txt
printf 'needle under nosearch\n' > nosearch/g.txt
ln -s a.py link.py
ln -s sub sublink
ln -s nowhere dangling.py
mkfifo fifo.py
chmod 000 noread
chmod 444 nosearch
cd ../edge
{ head -c 9000 /dev/zero | tr '\0' x; printf '\nneedle\n\000\n'; } > late/f.txt
printf '\357\273\277needle bom\n' > bom8/f.txt
printf '\377\376n\000e\000' > bom16/f.txt
{ head -c 9000 /dev/zero | tr '\0' y; printf '\nplain\n'; head -c 10 /dev/zero; } > nul-late-nomatch/f.bin
mkdir ../big
yes 'needle, and enough words after it to make its answer line long' | head -n 8000 > ../big/many.txt
"""
"""Built with the sandbox's own shell, so every backend gets the same bytes."""


@dataclass(frozen=True)
class Case:
    name: str
    run: Callable[[BaseSandbox, str], object]
    """The operation, given the directory the tree was built in."""
    native: bool
    """Whether the helper answers it itself (``False``: it hands it back to the script)."""


def _grep(pattern: str, path: str, glob: str | None = None) -> Callable[[BaseSandbox, str], object]:
    return lambda sb, d: sb.grep(pattern, f"{d}/{path}", glob)


def _glob(pattern: str, path: str) -> Callable[[BaseSandbox, str], object]:
    return lambda sb, d: sb.glob(pattern, f"{d}/{path}")


_CASES = [
    Case("grep the tree", _grep("needle", "tree"), True),
    Case("grep, glob *.py", _grep("needle", "tree", "*.py"), True),
    Case("grep, glob **/*.txt", _grep("needle", "tree", "**/*.txt"), True),
    Case("grep, glob !bang.txt", _grep("needle", "tree", "!bang.txt"), True),
    Case("grep, glob {a,c}.*", _grep("needle", "tree", "{a,c}.*"), True),
    Case("grep, glob with a bracket", _grep("needle", "tree", "[ab].py"), False),
    Case("grep a subdirectory", _grep("needle", "tree/sub"), True),
    Case("grep a file", _grep("needle", "tree/a.py"), True),
    Case("grep a file, glob elsewhere", _grep("needle", "tree/a.py", "*.txt"), True),
    Case("grep through a symlinked root", _grep("needle", "tree/sublink"), True),
    Case("grep a symlink to a file", _grep("needle", "tree/link.py"), True),
    Case("grep a FIFO root", _grep("needle", "tree/fifo.py"), True),
    Case("grep a colon pattern", _grep(":1:", "tree"), True),
    Case("grep an absent pattern", _grep("absent", "tree"), True),
    Case("grep the empty pattern", _grep("", "tree/sub"), True),
    Case("grep a non-ASCII pattern", _grep("\u00fc", "tree"), True),
    Case("grep a pattern with a newline", _grep("needle\none", "tree"), True),
    Case("grep a missing root", _grep("needle", "tree/missing"), True),
    Case("grep below a file", _grep("needle", "tree/a.py/x"), True),
    Case("grep a dangling symlink root", _grep("needle", "tree/dangling.py"), True),
    Case("grep a late NUL after a match", _grep("needle", "edge/late"), False),
    Case("grep a late NUL, no match", _grep("plain", "edge/nul-late-nomatch"), False),
    Case("grep a late NUL, other pattern", _grep("absent", "edge/nul-late-nomatch"), True),
    Case("grep a UTF-8 BOM", _grep("needle", "edge/bom8"), False),
    Case("grep a UTF-16 BOM", _grep("n", "edge/bom16"), False),
    Case("grep an answer of many steps (`_reads.sent_in_steps`)", _grep("needle", "big"), True),
    Case("glob *.py", _glob("*.py", "tree"), True),
    Case("glob **/*.txt", _glob("**/*.txt", "tree"), True),
    Case("glob sub/**", _glob("sub/**", "tree"), True),
    Case("glob .*", _glob(".*", "tree"), True),
    Case("glob ?.py", _glob("?.py", "tree"), True),
    Case("glob with a bracket", _glob("[a-z].py", "tree"), False),
    Case("glob *", _glob("*", "tree"), True),
    Case("glob a file root", _glob("*.py", "tree/a.py"), True),
    Case("glob a symlinked root", _glob("*", "tree/sublink"), True),
    Case("glob a missing root", _glob("*", "tree/missing"), True),
]


def assert_native_searches_match_the_scripts(sandbox: BaseSandbox, root: str) -> None:
    """Every case natively and through both scripts, on one tree built under ``root``: equal
    results; the helper answered exactly the cases meant to be native."""
    assert sandbox.native_file_ops, "the sandbox does not offer native file ops"
    mux = helper_client(sandbox)
    directory = f"{root}/searches-{uuid.uuid4().hex[:8]}"
    made = sandbox.execute(f"mkdir -p {shlex.quote(directory)} && cd {shlex.quote(directory)} && {_TREE}")
    assert made.exit_code == 0, made
    differences = []
    try:
        for case in _CASES:
            before = (mux.native_answers, mux.native_declined)
            native = case.run(sandbox, directory)
            answered, declined = mux.native_answers - before[0], mux.native_declined - before[1]
            assert (answered, declined) == ((1, 0) if case.native else (0, 1)), f"{case.name}: wrong path"
            sandbox.native_file_ops = False
            try:
                scripted = {}
                # Handed back, it ran the script with ripgrep where there is one; the two scripts
                # disagree on exactly such files (a BOM: rg transcodes or strips it, grep not).
                for tools in (True, False) if case.native else (True,):
                    sandbox.search_tools = tools
                    scripted[tools] = case.run(sandbox, directory)
            finally:
                sandbox.native_file_ops = True
                sandbox.search_tools = True
            assert (mux.native_answers, mux.native_declined) == (before[0] + answered, before[1] + declined)
            for tools, result in scripted.items():
                if result != native:
                    differences.append((case.name, "rg" if tools else "find", result, native))
        whole = sandbox.grep("needle", f"{directory}/tree")
        assert isinstance(whole, p.GrepResult), whole
        assert len(whole.matches) >= 12, whole  # not vacuous: the walk saw the whole tree
    finally:
        sandbox.native_file_ops = True
        sandbox.execute(f"chmod -R u+rwx {shlex.quote(directory)}; rm -rf {shlex.quote(directory)}")
    assert not differences, "\n".join(
        f"{name} ({tool}):\n script {s!r}\n native {n!r}" for name, tool, s, n in differences
    )
