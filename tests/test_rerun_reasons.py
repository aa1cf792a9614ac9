"""The suite's summary says what each rerun test failed on (``tests/conftest.py``): a failure that a
rerun hides is otherwise lost, and the flaky tests' rows in docs/testing.md need what was seen."""

from __future__ import annotations

import os
import textwrap
from pathlib import Path

import pytest

from tests.helpers import pytest_of_its_own

FAILS_ONCE = textwrap.dedent(
    """
    import os

    import pytest

    @pytest.mark.flaky(reruns=1)
    def test_fails_once():
        marker = os.path.join(os.path.dirname(__file__), "tried")
        if not os.path.exists(marker):
            open(marker, "w").close()
            assert 1 == 2, "the first try fails\\nsecond line\\nthird line\\nkept for the cause: stopping"
    """
)


@pytest.mark.slow  # a pytest of its own: about 2 s
def test_a_rerun_tests_first_failure_is_in_the_summary(tmp_path):
    tests = tmp_path / "tests"
    tests.mkdir()
    (tests / "test_once.py").write_text(FAILS_ONCE)
    (tests / "conftest.py").write_text((Path(__file__).parent / "conftest.py").read_text())
    root = Path(__file__).resolve().parent.parent
    env = {**os.environ, "PYTHONPATH": str(root)}
    result = pytest_of_its_own(tmp_path, ["-c", str(root / "pytest.ini"), str(tests)], env)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "1 passed, 1 rerun" in result.stdout
    assert "test_once.py::test_fails_once: AssertionError: the first try fails" in result.stdout, result.stdout
    # The whole message, not its first three lines: a test that appends what its cause needs (the
    # Locust UI test, the runner's state) had it cut off in a fresh clone's run (2026-12-07).
    assert "kept for the cause: stopping" in result.stdout, result.stdout
