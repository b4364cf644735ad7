"""The docs stay a reference a reader can follow: a short README, links that land, figures with a home.

Checks README.md and docs/ (the log in docs/log/ included for links): every relative link resolves to a file
in the repository and its #anchor to a heading there; no dates or issue numbers outside docs/log/; one section of
docs/BENCHMARKS.md per `spotlight bench` command; each README headline figure links to where it was measured.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import typer

from pipelines.bench_cli import bench_app

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
BENCHMARKS = REPO / "docs" / "BENCHMARKS.md"
LOG = REPO / "docs" / "log"
MAX_README_LINES = 220

FENCE = re.compile(r"^(```|~~~).*?^\1", re.MULTILINE | re.DOTALL)
INLINE_CODE = re.compile(r"`[^`\n]*`")
LINK = re.compile(r"(?<!!)\[[^\]\n]*\]\(([^)\s]+)\)|!\[[^\]\n]*\]\(([^)\s]+)\)")
HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*\s*$", re.MULTILINE)
DATE = re.compile(r"\b20\d\d-\d\d-\d\d\b")
ISSUE = re.compile(r"\bissues?\s+#?\d+", re.IGNORECASE)


def _reference_pages() -> list[Path]:
    """README.md and docs/*.md: the pages that must read as reference (docs/log/ is the dated history)."""
    return [README, *sorted((REPO / "docs").glob("*.md"))]


def _all_pages() -> list[Path]:
    return [*_reference_pages(), *sorted(LOG.glob("*.md"))]


def _prose(text: str) -> str:
    """The page without fenced code blocks (their contents are commands and code, not links or headings)."""
    return FENCE.sub("", text)


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: link syntax reduced to its text, lower case, punctuation dropped,
    spaces to hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading).strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    seen: dict[str, int] = {}
    anchors = set()
    for heading in HEADING.findall(_prose(page.read_text())):
        slug = _slug(heading)
        count = seen.get(slug, 0)
        anchors.add(slug if count == 0 else f"{slug}-{count}")
        seen[slug] = count + 1
    return anchors


def _links(page: Path) -> list[str]:
    prose = INLINE_CODE.sub("", _prose(page.read_text()))
    return [a or b for a, b in LINK.findall(prose)]


def _broken_links(page: Path) -> list[str]:
    broken = []
    for target in _links(page):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # https:, mailto: ...: not a file of the repository
            continue
        path_part, _, anchor = target.partition("#")
        dest = (page.parent / path_part).resolve() if path_part else page
        if REPO not in dest.parents and dest != REPO:
            broken.append(f"{target} (outside the repository)")
        elif not dest.exists():
            broken.append(f"{target} (no such file)")
        elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
            broken.append(f"{target} (no heading #{anchor} in {dest.relative_to(REPO)})")
    return broken


def test_readme_is_a_reference_page_of_at_most_220_lines() -> None:
    lines = README.read_text().splitlines()
    assert len(lines) <= MAX_README_LINES, f"README.md has {len(lines)} lines; move long explanations to docs/"


@pytest.mark.parametrize("page", _all_pages(), ids=lambda p: str(p.relative_to(REPO)))
def test_every_relative_link_lands_on_a_file_and_heading(page: Path) -> None:
    assert _broken_links(page) == []


@pytest.mark.parametrize("page", _reference_pages(), ids=lambda p: str(p.relative_to(REPO)))
def test_reference_pages_carry_no_dates_or_issue_numbers(page: Path) -> None:
    found = [
        f"{number}: {line.strip()[:100]}"
        for number, line in enumerate(page.read_text().splitlines(), start=1)
        if DATE.search(line) or ISSUE.search(line)
    ]
    assert found == [], "dated history and issue references belong in docs/log/"


def test_benchmarks_has_one_section_per_bench_command() -> None:
    commands = sorted(typer.main.get_command(bench_app).commands)
    headings = set(HEADING.findall(_prose(BENCHMARKS.read_text())))
    assert len(commands) >= 10
    assert [c for c in commands if f"`spotlight bench {c}`" not in headings] == []


def test_each_readme_headline_figure_links_to_where_it_was_measured() -> None:
    text = _prose(README.read_text())
    section = text.split("## Headline figures", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("|") and not re.match(r"^\|[\s|:-]+\|$", line)]
    figures = rows[1:]  # the first row is the header
    assert len(figures) >= 5
    benchmarks_anchors = _anchors(BENCHMARKS)
    for row in figures:
        targets = [t for t in LINK.findall(row) for t in t if t.startswith("docs/BENCHMARKS.md#")]
        assert targets, f"headline row without a link to docs/BENCHMARKS.md: {row}"
        assert all(t.split("#", 1)[1] in benchmarks_anchors for t in targets), row


def _benchmark_sections() -> dict[str, str]:
    """docs/BENCHMARKS.md's `## ` sections by heading."""
    parts = re.split(r"^## (.+)$", BENCHMARKS.read_text(), flags=re.MULTILINE)
    return dict(zip(parts[1::2], parts[2::2], strict=True))


def test_each_benchmark_section_names_its_command_machine_and_commit() -> None:
    missing = []
    for heading, body in _benchmark_sections().items():
        command = heading.strip("`") if heading.startswith("`spotlight bench ") else None
        if command is None:
            continue
        if command not in body:
            missing.append(f"{heading}: no command line")
        if "No figure yet" in body:
            continue
        if not re.search(r"\b(2-vCPU|2-core)\b", body):
            missing.append(f"{heading}: no machine")
        if not re.search(r"\bcommit\s+[0-9a-f]{7}\b", body):
            missing.append(f"{heading}: no commit")
    assert missing == []
