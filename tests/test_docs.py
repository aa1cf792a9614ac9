"""The README stays one screen, and no page points at nothing.

Every Markdown page of the repository (the README, the changelog, everything under ``docs/``,
whoever adds it) is checked: each relative link names a file that exists and, with ``#anchor``, a
heading of that file; each repository path quoted in backticks exists; every page under ``docs/``
can be reached from the README by following links. Python sources may not name a Markdown file
that does not exist.
"""

from __future__ import annotations

import fnmatch
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


# Names the pages quote in backticks that must still exist in the code: a class (`BurstPlan`,
# `Conductor.shares`), a command (`manage.py flashsale`), a Make target (`make check`), a setting
# or constant (`INVENTORY_BATCH`, `ROW_LOCK_TIMEOUT_MS`). A renamed or deleted one leaves the page
# pointing at nothing, as a dead link does.
_SPAN = re.compile(r"`([^`\n]+)`")
_CLASS = re.compile(r"^([A-Z][a-z0-9]+(?:[A-Z][a-z0-9]*)+|[A-Z][a-z]{2,})(?:\.([a-z_][a-z0-9_]*))?(?:\(\))?$")
_SETTING = re.compile(r"^[A-Z][A-Z0-9]*(?:_[A-Z0-9]+)+$")
_COMMAND = re.compile(r"\bmanage\.py\s+([a-z_]+)")
_MAKE = re.compile(r"^make\s+([a-z][\w-]*)")
#: Source files whose words count as "in the code".
_SOURCES = ("*.py", "Makefile", "*.sh", ".importlinter", "pyproject.toml", "pytest.ini", "*.cfg")
#: Capitalized words the pages quote that are not this project's classes: Python's constants and
#: other projects' classes (Django's, psycopg's, redis-py's, kazoo's).
OTHER_NAMES = {
    "True",
    "False",
    "None",
    "IntegrityError",  # Django, psycopg
    "LogEntry",  # django.contrib.admin
    "AppConfig",  # Django
    "Lock",  # redis-py's redis.lock.Lock, kazoo's recipe
    "ConnectionClosedError",  # kazoo
    "ConnectionLoss",  # kazoo
}


def repository_files(pattern: str, *, leave_out: tuple[str, ...] = ()) -> list[Path]:
    """``ROOT.rglob(pattern)`` without the top-level folders whose name starts with a dot or is in
    ``leave_out``: those are never walked (``.venv`` and ``.git`` alone hold tens of thousands of files)."""
    found = []
    for top in sorted(ROOT.iterdir()):
        if top.name.startswith(".") or top.name in leave_out:
            continue
        if fnmatch.fnmatch(top.name, pattern):
            found.append(top)
        if top.is_dir():
            found += top.rglob(pattern)
    return found


def source_words() -> set[str]:
    words: set[str] = set()
    for pattern in _SOURCES:
        for path in repository_files(pattern, leave_out=("docs", "staticfiles", "artifacts")):
            if path == Path(__file__):  # this file quotes stale names to show they are caught
                continue
            words.update(re.findall(r"\w+", path.read_text(encoding="utf-8", errors="replace")))
    return words


def make_targets() -> set[str]:
    return set(re.findall(r"^([a-z][\w-]*)\s*:", (ROOT / "Makefile").read_text(encoding="utf-8"), re.M))


def stale_names(text: str, *, words: set[str], classes: set[str], commands: set[str], targets: set[str]) -> list[str]:
    """The names ``text`` quotes in backticks that the code no longer has (the pages' prose only:
    fenced blocks are transcripts)."""
    stale = []
    for span in _SPAN.findall(text):
        span = span.strip()
        stale += [f"manage.py {name}" for name in _COMMAND.findall(span) if name not in commands]
        stale += [f"make {name}" for name in _MAKE.findall(span) if name not in targets]
        if _SETTING.match(span) and span not in words:
            stale.append(span)
        found = _CLASS.match(span)
        if found and found[1] not in OTHER_NAMES and (found[1] not in classes or (found[2] and found[2] not in words)):
            stale.append(span)
    return stale


@pytest.fixture(scope="module")
def code_names() -> dict:
    from django.core.management import get_commands

    words = source_words()
    classes = set()
    for path in repository_files("*.py"):
        classes.update(re.findall(r"^\s*class\s+(\w+)", path.read_text(encoding="utf-8"), re.M))
    return {"words": words, "classes": classes, "commands": set(get_commands()), "targets": make_targets()}


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_quoted_name_exists_in_the_code(page, code_names):
    if page.name == "CHANGELOG.md":
        pytest.skip("the changelog records names as they were")
    stale = stale_names(prose(page), **code_names)
    assert not stale, f"{page.relative_to(ROOT)} names what the code no longer has: {sorted(set(stale))}"


def test_a_stale_name_is_caught_and_a_live_one_is_not(code_names):
    live = "`BurstPlan`, `Conductor.shares`, `manage.py flashsale --batch 1,64`, `make check`, `INVENTORY_BATCH`"
    assert stale_names(live, **code_names) == []
    stale = (
        "`NoSuchPlan`, `Conductor.no_such_share`, `manage.py nosuchcommand`, `make nosuchtarget`, `NO_SUCH_SETTING_MS`"
    )
    assert stale_names(stale, **code_names) == [
        "NoSuchPlan",
        "Conductor.no_such_share",
        "manage.py nosuchcommand",
        "make nosuchtarget",
        "NO_SUCH_SETTING_MS",
    ]


def listed_in_testing_md(test_file: Path, quoted: set[str]) -> bool:
    """``docs/testing.md`` names ``test_file``: its path, its bare name (for a file directly in
    ``tests/``), a folder above it, or a pattern it matches (``tests/test_simulate_*.py``)."""
    relative = test_file.relative_to(ROOT).as_posix()
    return (
        relative in quoted
        or (test_file.parent == ROOT / "tests" and test_file.name in quoted)
        or any(word.endswith("/") and relative.startswith(word) for word in quoted)
        or any("*" in word and fnmatch.fnmatch(relative, word) for word in quoted)
    )


def test_testing_md_lists_every_test_file():
    quoted = {word.rstrip(".,:;") for word in _CODE.findall(prose(ROOT / "docs/testing.md"))}
    unlisted = [
        path.relative_to(ROOT).as_posix()
        for path in sorted((ROOT / "tests").rglob("test_*.py"))
        if not listed_in_testing_md(path, quoted)
    ]
    assert not unlisted, f"docs/testing.md does not say what these prove: {unlisted}"


def test_every_rerun_test_is_named_in_testing_md():
    """A test marked to rerun on failure hides a first failure from a green run: docs/testing.md
    names each one, with what was seen."""
    testing = (ROOT / "docs/testing.md").read_text()
    rerun = []
    for path in sorted((ROOT / "tests").rglob("test_*.py")):
        marked = False
        for line in path.read_text().splitlines():
            if line.startswith("@pytest.mark.flaky"):
                marked = True
            elif marked and line.startswith("def test_"):
                rerun.append(line.removeprefix("def ").split("(")[0])
                marked = False
    assert len(rerun) >= 5, rerun
    missing = [name for name in rerun if f"`{name}`" not in testing]
    assert not missing, f"docs/testing.md does not name these rerun tests: {missing}"
