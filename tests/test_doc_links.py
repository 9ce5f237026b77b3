"""Links between the user's pages land: every ``[text](#anchor)`` and ``[text](PATH#anchor)`` of ``README.md``,
``tasks/README.md``, ``docs/*.md`` and ``benchmarks/*.md`` names a page that exists and, with an anchor, a heading of
that page (GitHub's anchors: lower case, punctuation but ``-`` and ``_`` dropped, spaces as ``-``, a repeated heading
suffixed ``-1``, ``-2``, ...)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit  # the fast tier: pytest -m unit (README)

ROOT = Path(__file__).resolve().parents[1]
PAGES = ("README.md", "tasks/README.md", *sorted(f"docs/{p.name}" for p in (ROOT / "docs").glob("*.md")),
         *sorted(f"benchmarks/{p.name}" for p in (ROOT / "benchmarks").glob("*.md")))
LINK = re.compile(r"\]\(([^()\s]*?\.md)?(?:#([^()\s]+))?\)")
FENCE = re.compile(r"^(```|~~~)")


def anchors(text: str) -> set[str]:
    """The anchors GitHub gives the headings of a markdown ``text`` (fenced blocks left out)."""
    found: set[str] = set()
    seen: dict[str, int] = {}
    inside = False
    for line in text.splitlines():
        if FENCE.match(line):
            inside = not inside
            continue
        heading = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if inside or not heading:
            continue
        slug = re.sub(r"[^\w\- ]", "", heading.group(1).lower()).replace(" ", "-")
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        found.add(slug if count == 0 else f"{slug}-{count}")
    return found


def broken_links(page: str, read=lambda path: path.read_text(encoding="utf-8")) -> list[str]:
    """``page:line: target`` for each link of ``page`` whose page or heading does not exist."""
    source = ROOT / page
    text = read(source)
    broken = []
    for number, line in enumerate(text.splitlines(), 1):
        for match in LINK.finditer(line):
            target, anchor = match.groups()
            if target is None and anchor is None or (target or "").startswith(("http:", "https:")):
                continue
            path = (source.parent / target).resolve() if target else source
            if not path.is_file():
                broken.append(f"{page}:{number}: {target} (no such page)")
            elif anchor is not None and anchor not in anchors(read(path)):
                broken.append(f"{page}:{number}: {target or ''}#{anchor} (no such heading)")
    return broken


def test_every_link_between_pages_lands():
    broken = [hit for page in PAGES for hit in broken_links(page)]
    assert broken == [], "links to a page or heading that is not there:\n" + "\n".join(broken)


def test_the_check_finds_a_stale_anchor():
    """Broken on purpose: a table of contents whose entry kept a heading's old text."""
    assert anchors("# Gold self-check (`tests/scoring/test_x.py`)\n## Pools\n## Pools\n") == {
        "gold-self-check-testsscoringtest_xpy", "pools", "pools-1"}
    page = ("- [Gold](#gold-self-check-teststaskstest_xpy)\n- [Pools](#pools)\n\n"
            "## Gold self-check (`tests/scoring/test_x.py`)\n## Pools\n")
    assert broken_links("tasks/README.md", read=lambda path: page) == [
        "tasks/README.md:1: #gold-self-check-teststaskstest_xpy (no such heading)"]
