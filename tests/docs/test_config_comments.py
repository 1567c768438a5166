"""Configs that explain their keys (STYLE.md rule 11): every YAML under configs/ says, in at
most two comment lines, what each key it sets does and why it sets it; what a choice is
worth (measured AP, times, dates) lives in the docs, reached by one link at the top.

The rules, checked on every config:
- a header (the comment lines before the first key) of at most 3 lines that links to an
  existing markdown file (docs/... or configs/<Member>/README.md);
- at most 2 comment lines in a row before a key (or anywhere after the header);
- every key that sets a value has a comment: on its line, or on the lines just before it;
- no date in a comment.
"""
import re
from pathlib import Path
from typing import List

import pytest

REPO = Path(__file__).resolve().parents[2]
CONFIGS = sorted((REPO / "configs").rglob("*.yaml"))
MAX_COMMENT_LINES = 2
MAX_HEADER_LINES = 3

KEY = re.compile(r"^\s*[A-Za-z_][\w.]*\s*:")
DATE = re.compile(r"\b\d{4}-\d{2}-\d{2}\b|\b(?:Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec)"
                  r"[a-z]*\.? \d{1,2}(?:st|nd|rd|th)?,? \d{4}\b|\b\d{1,2} (?:Jan|Feb|Mar|Apr|"
                  r"May|Jun|Jul|Aug|Sep|Oct|Nov|Dec)[a-z]* \d{4}\b")
LINK = re.compile(r"((?:docs|configs)/[\w./-]+\.md)(?:#[\w-]+)?")


def comment_of(line: str) -> str:
    """The comment of a YAML line ('' if none); a '#' inside quotes is not one."""
    quoted = None
    for index, char in enumerate(line):
        if char in "\"'" and quoted in (None, char):
            quoted = None if quoted else char
        elif char == "#" and quoted is None and (index == 0 or line[index - 1].isspace()):
            return line[index + 1:].strip()
    return ""


def problems(path: Path, root: Path = REPO) -> List[str]:
    """What breaks the rules in the config at ``path``, each naming the line; links are
    relative to ``root``."""
    lines = path.read_text().splitlines()
    name = path.relative_to(root)
    found, run = [], []  # run: (number, text) of the comment lines since the last key
    first_key = next((i for i, line in enumerate(lines) if KEY.match(line)), len(lines))
    header = [comment_of(line) for line in lines[:first_key] if line.strip().startswith("#")]
    if len(header) > MAX_HEADER_LINES:
        found.append(f"{name}: a header of {len(header)} comment lines (at most "
                     f"{MAX_HEADER_LINES}); move the prose to the docs and link them")
    links = [m.group(1) for m in LINK.finditer(" ".join(header))]
    if not links or not all((root / link).is_file() for link in links):
        found.append(f"{name}: the header links to no existing docs page ({links or 'none'})")
    for number, line in enumerate(lines, 1):
        comment = comment_of(line)
        if comment and DATE.search(comment):
            found.append(f"{name}:{number}: a date in a comment: {DATE.search(comment).group()}"
                         " (dates and measurements belong in the docs)")
        if number <= first_key:
            continue
        if line.strip().startswith("#"):
            run.append(number)
            if len(run) == MAX_COMMENT_LINES + 1:
                found.append(f"{name}:{run[0]}: more than {MAX_COMMENT_LINES} comment lines "
                             "in a row")
            continue
        if KEY.match(line) and _sets_a_value(line) and not (comment or run):
            found.append(f"{name}:{number}: {line.strip()} has no comment saying what it does")
        run = []
    return found


def _sets_a_value(line: str) -> bool:
    """``KEY: value`` (not ``KEY:`` opening a mapping)."""
    value = line.split(":", 1)[1]
    return bool(value.split("#", 1)[0].strip())


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: str(p.relative_to(REPO / "configs")))
def test_every_key_has_a_short_comment_and_no_comment_has_a_date(path):
    assert problems(path) == []


def test_the_checker_finds_each_kind_of_fault(tmp_path):
    probe = tmp_path / "configs" / "probe.yaml"
    probe.parent.mkdir()
    probe.write_text("# a header whose link leads nowhere: docs/missing.md\n"
                     "MODEL:\n"
                     "  # one\n  # two\n  # three\n"
                     "  WEIGHTS: \"\"\n"
                     "  DEVICE: cpu\n"
                     "  FOO: 1  # measured on 2026-12-03\n"
                     "  BAR: \"#not a comment\"\n")
    found = problems(probe, root=tmp_path)
    expected = ["the header links to no existing docs page (['docs/missing.md'])",
                "probe.yaml:3: more than 2 comment lines in a row",
                "probe.yaml:7: DEVICE: cpu has no comment",
                "probe.yaml:8: a date in a comment: 2026-12-03",
                'probe.yaml:9: BAR: "#not a comment" has no comment']
    assert len(found) == len(expected), found
    for part, message in zip(expected, found):
        assert part in message, (part, message)
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "missing.md").write_text("# now there\n")
    assert len(problems(probe, root=tmp_path)) == len(expected) - 1
