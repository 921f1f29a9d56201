"""The README reads on one screen (issue 45): no table row past ~200 characters (the rest of a long row is in
docs/reference.md or docs/commands.md), and every link from the README into those two names a heading
that exists there."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
LIMIT = 210  # "about 200": a row of 201 characters is not worth cutting


def _anchor(heading: str) -> str:
    """GitHub's anchor of a Markdown heading."""
    return re.sub(r"[^a-z0-9 _-]", "", heading.strip().lower()).replace(" ", "-")


def _rows(text: str) -> list[str]:
    rows, fenced = [], False
    for line in text.splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and line.startswith("|"):
            rows.append(line)
    return rows


def test_no_readme_table_row_is_longer_than_a_screen_line() -> None:
    long_rows = [(len(r), r[:80]) for r in _rows(README.read_text()) if len(r) > LIMIT]
    assert long_rows == []


def test_the_links_into_the_detail_pages_name_their_headings() -> None:
    links = re.findall(r"\]\(docs/(reference|commands)\.md#([a-z0-9_-]+)\)", README.read_text())
    assert len(links) >= 20
    for page, anchor in links:
        text = (ROOT / "docs" / f"{page}.md").read_text()
        headings = {_anchor(h) for h in re.findall(r"^#+ (.+)$", text, re.MULTILINE)}
        assert anchor in headings, (page, anchor)
