"""The README stays one screen, and no page points at nothing.

Every Markdown page of the repository (the README, the changelog, everything under ``docs/``,
whoever adds it) is checked: each relative link names a file that exists and, with ``#anchor``, a
heading of that file; each repository path quoted in backticks exists; every page under ``docs/``
can be reached from the README by following links. Python sources may not name a Markdown file
that does not exist.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README_LINES = 150
PAGES = sorted([ROOT / "README.md", ROOT / "CHANGELOG.md", *(ROOT / "docs").rglob("*.md")])

_LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
_CODE = re.compile(r"`([^`\s]+)`")
_FENCE = re.compile(r"^```.*?^```", re.M | re.S)
#: Backticked words starting with one of these folders are taken as paths into the repository.
_TREES = ("shop/", "inventory/", "loadtests/", "locks/", "processes/", "faults/", "tests/", "scripts/", "docs/")


def prose(page: Path) -> str:
    """The page without its fenced blocks (command transcripts quote things that are not links)."""
    return _FENCE.sub("", page.read_text(encoding="utf-8"))


def anchors(page: Path) -> set[str]:
    """The anchors GitHub gives the page's headings."""
    found: set[str] = set()
    for heading in re.findall(r"^#{1,6}\s+(.+?)\s*$", prose(page), re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.lower().replace("`", "")).replace(" ", "-")
        n, unique = 0, slug
        while unique in found:
            n += 1
            unique = f"{slug}-{n}"
        found.add(unique)
    return found


def links(page: Path) -> list[str]:
    return [t for t in _LINK.findall(prose(page)) if not re.match(r"[a-z][a-z0-9+.-]*:", t)]


def target(page: Path, link: str) -> tuple[Path, str]:
    path, _, anchor = link.partition("#")
    return ((page.parent / path).resolve() if path else page), anchor


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_link_points_at_something(page):
    broken = []
    for link in links(page):
        file, anchor = target(page, link)
        if not file.exists():
            broken.append(f"{link}: no such file")
        elif anchor and file.suffix == ".md" and anchor not in anchors(file):
            broken.append(f"{link}: no heading with that anchor")
    assert not broken, broken


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_quoted_path_exists(page):
    quoted = {word.rstrip(".,:;") for word in _CODE.findall(prose(page)) if word.startswith(_TREES)}
    missing = sorted(word for word in quoted if not re.search(r"[<>*{]", word) and not (ROOT / word).exists())
    assert not missing, missing


def test_the_readme_is_one_screen():
    lines = (ROOT / "README.md").read_text(encoding="utf-8").count("\n")
    assert lines <= README_LINES, f"README.md has {lines} lines; move the detail into docs/"


def test_every_docs_page_is_reachable_from_the_readme():
    seen, todo = set(), [ROOT / "README.md"]
    while todo:
        page = todo.pop()
        if page in seen or page.suffix != ".md" or not page.exists():
            continue
        seen.add(page)
        todo += [target(page, link)[0] for link in links(page)]
    unreached = [str(p.relative_to(ROOT)) for p in PAGES if p not in seen]
    assert not unreached, f"no link leads to {unreached} from README.md"


def test_sources_name_no_missing_page():
    missing = []
    sources = [p for top in ROOT.iterdir() if top.is_dir() and not top.name.startswith(".") for p in top.rglob("*.py")]
    for source in sources:
        for name in re.findall(r"\b([\w./-]+\.md)\b", source.read_text(encoding="utf-8")):
            if not (ROOT / name).exists() and not (source.parent / name).exists():
                missing.append(f"{source.relative_to(ROOT)}: {name}")
    assert not missing, missing
