"""The suite is filed by subject: no two test files share a name, wherever they sit, so a name
in a failure report or in ``pytest -k`` means one file."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

TESTS = Path(__file__).resolve().parent


def test_no_two_test_files_share_a_basename():
    found = defaultdict(list)
    for path in TESTS.rglob("test_*.py"):
        found[path.name].append(str(path.relative_to(TESTS)))
    shared = {name: paths for name, paths in found.items() if len(paths) > 1}
    assert not shared, shared
