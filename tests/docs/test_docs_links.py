"""The README stays short, and every relative link of the README and the docs leads somewhere.

A link is `[text](target)` outside fenced code blocks; a target without a scheme is relative
to the file that holds it, and its `#fragment`, if any, must be the anchor GitHub gives one
of the target's headings."""
import os
import re
from pathlib import Path
from typing import Dict, Iterator, List, Set, Tuple

import pytest

REPO = Path(__file__).resolve().parents[2]
README_MAX_LINES = 300
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^\s*```")


def documents() -> List[Path]:
    """README.md, every markdown file under docs/, and the members' configs/*/README.md."""
    return [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md")),
            *sorted((REPO / "configs").glob("*/README.md"))]


def prose_lines(text: str) -> Iterator[Tuple[int, str]]:
    """(1-based line number, line) of the lines outside fenced code blocks."""
    inside = False
    for number, line in enumerate(text.splitlines(), start=1):
        if FENCE.match(line):
            inside = not inside
        elif not inside:
            yield number, line


def links(text: str) -> Iterator[Tuple[int, str]]:
    """(line number, target) of each inline link outside code blocks."""
    for number, line in prose_lines(text):
        for match in LINK.finditer(line):
            yield number, match.group(1)


def github_anchor(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation other than '-' and '_'
    dropped, spaces made '-'."""
    text = heading.strip().lower().replace("`", "")
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(path: Path) -> Set[str]:
    """The anchors of a markdown file's headings (a repeated one also gets -1, -2, ...)."""
    found: Set[str] = set()
    counts: Dict[str, int] = {}
    for _, line in prose_lines(path.read_text()):
        heading = re.match(r"^#{1,6}\s+(.*)$", line)
        if heading:
            anchor = github_anchor(heading.group(1))
            count = counts.get(anchor, 0)
            found.add(anchor if count == 0 else f"{anchor}-{count}")
            counts[anchor] = count + 1
    return found


def broken_links(path: Path, root: Path = REPO) -> List[str]:
    """'file:line: target (why)' for each relative link of `path` that leads nowhere; file
    names are given relative to `root`."""
    broken = []
    for number, target in links(path.read_text()):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # https:, mailto:, ...
            continue
        file_part, _, fragment = target.partition("#")
        destination = (path.parent / file_part).resolve() if file_part else path
        where = f"{path.relative_to(root)}:{number}: {target}"
        if not destination.exists():
            broken.append(f"{where} (no file {os.path.relpath(destination, root)})")
        elif fragment and destination.suffix == ".md" and fragment not in anchors(destination):
            broken.append(f"{where} (no heading with anchor #{fragment} in "
                          f"{destination.relative_to(root)})")
    return broken


def test_the_readme_is_at_most_300_lines():
    lines = (REPO / "README.md").read_text().splitlines()
    assert len(lines) <= README_MAX_LINES, (
        f"README.md has {len(lines)} lines, more than {README_MAX_LINES}: move details to docs/")


def test_the_docs_the_issue_asks_for_exist():
    for name in ("small_data", "speed", "deployment", "cluster", "troubleshooting",
                 "development"):
        assert (REPO / "docs" / f"{name}.md").is_file(), f"docs/{name}.md is missing"


@pytest.mark.parametrize("path", documents(), ids=lambda p: str(p.relative_to(REPO)))
def test_every_relative_link_leads_to_an_existing_file_and_heading(path):
    assert broken_links(path) == []


def test_the_link_check_finds_a_missing_file_and_a_missing_heading(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "b.md").write_text("# Speed: `bf16`, AMP\n\n## Speed: `bf16`, AMP\n")
    page = tmp_path / "docs" / "a.md"
    page.write_text("see [b](b.md#speed-bf16-amp), [again](b.md#speed-bf16-amp-1),\n"
                    "[gone](c.md), [wrong](b.md#speed) and [web](https://example.com)\n"
                    "```\n[in code](nowhere.md)\n```\n")
    assert broken_links(page, root=tmp_path) == [
        "docs/a.md:2: c.md (no file docs/c.md)",
        "docs/a.md:2: b.md#speed (no heading with anchor #speed in docs/b.md)"]
