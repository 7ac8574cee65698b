"""The front door holds: README.md stays short, names the commands CI runs and the protocol's whole
error vocabulary, and every relative link of README.md, docs/ and benchmarks/README.md (its
``#anchor`` too) reaches a file and a heading that exist."""

from __future__ import annotations

import re
import typing
from pathlib import Path

import pytest

from sandboxes.api import ServiceErrorCode
from sandboxes.protocol import ErrorCode

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
PAGES = [README, ROOT / "benchmarks" / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
README_MAX_LINES = 210
"""The issue's "at most ~200 lines", with room for a small edit; the rest belongs in docs/."""
FENCE = re.compile(r"^```.*?^```", re.S | re.M)
LINK = re.compile(r"\]\(([^)\s]+)\)")


def _anchors(page: Path) -> set[str]:
    """GitHub's anchors of a page's headings (outside code blocks)."""
    headings = re.findall(r"^#+ (.+)$", FENCE.sub("", page.read_text()), re.M)
    return {re.sub(r"[^\w\- ]", "", title.strip().lower()).replace(" ", "-") for title in headings}


def _broken(page: Path) -> list[str]:
    broken = []
    for target in LINK.findall(FENCE.sub("", page.read_text())):
        if re.match(r"[a-z]+:", target):
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path) if path else page
        if not dest.exists():
            broken.append(f"{target} (no such file)")
        elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
            broken.append(f"{target} (no such heading)")
    return broken


@pytest.mark.parametrize("page", PAGES, ids=lambda page: str(page.relative_to(ROOT)))
def test_relative_links_resolve(page: Path) -> None:
    assert _broken(page) == [], f"{page.relative_to(ROOT)} links to what does not exist"


def test_readme_is_short() -> None:
    lines = len(README.read_text().splitlines())
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines: move details to docs/ and link them"


def test_readme_names_the_commands_ci_runs() -> None:
    text = README.read_text()
    assert "bash scripts/demo.sh\n" in text
    assert "bash .ci/run\n" in text
    assert (ROOT / ".ci" / "run").exists()


def test_readme_lists_every_error_code() -> None:
    text = README.read_text()
    missing = [
        code for code in (*typing.get_args(ErrorCode), *typing.get_args(ServiceErrorCode)) if f"`{code}`" not in text
    ]
    assert missing == [], f"README.md's protocol section does not name {missing}"


def test_link_check_finds_a_broken_link(tmp_path: Path) -> None:
    (tmp_path / "a.md").write_text("# Title\n## The part\n")
    page = tmp_path / "index.md"
    page.write_text("[ok](a.md#the-part) [gone](b.md) [heading](a.md#nope)\n```\n[code](c.md)\n```\n")
    assert _broken(page) == ["b.md (no such file)", "a.md#nope (no such heading)"]
