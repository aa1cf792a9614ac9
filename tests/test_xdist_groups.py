"""The suite relies on ``--dist loadgroup`` sending every test of one ``xdist_group`` to one worker:
the bursts share their worker's pods and collect, the ZooKeeper tests one ensemble, the static-file
collects never run beside each other. pytest 9.2.0 changed how node ids are stored, and
pytest-xdist 3.8.0's grouping (a suffix written into the id) silently stopped taking effect
(pytest-xdist issue 1386): every group was spread over both workers. Seen in CI as a static-file
collect test finding the manifest rewritten by the other worker's collect test. This runs the
installed pytest and pytest-xdist on a small grouped suite and reads which worker ran each test."""

from __future__ import annotations

import os
import textwrap

import pytest

from tests.helpers import pytest_of_its_own

GROUPED_SUITE = textwrap.dedent(
    """
    import os
    from pathlib import Path

    import pytest

    def record(name):
        with open(Path(__file__).parent / "workers.txt", "a") as out:
            out.write(f"{name} {os.environ['PYTEST_XDIST_WORKER']}\\n")

    @pytest.mark.xdist_group("together")
    @pytest.mark.parametrize("n", range(6))
    def test_grouped(n):
        record("grouped")

    @pytest.mark.parametrize("n", range(6))
    def test_free(n):
        record("free")
    """
)


@pytest.mark.slow  # a pytest of its own with two workers: about 2.5 s; the groups matter in make test
def test_every_test_of_an_xdist_group_runs_on_one_worker(tmp_path):
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    (tmp_path / "test_grouped.py").write_text(GROUPED_SUITE)
    env = {key: value for key, value in os.environ.items() if key != "DJANGO_SETTINGS_MODULE"}
    args = ["-n", "2", "--dist", "loadgroup", "-p", "no:django", "-c", str(tmp_path / "pytest.ini"), str(tmp_path)]
    result = pytest_of_its_own(tmp_path, args, env)
    assert result.returncode == 0, result.stdout + result.stderr
    ran = [line.split() for line in (tmp_path / "workers.txt").read_text().splitlines()]
    grouped = {worker for name, worker in ran if name == "grouped"}
    assert len(ran) == 12
    assert len(grouped) == 1, f"the group ran on {sorted(grouped)}: pytest-xdist's loadgroup is not grouping"
    assert {worker for _, worker in ran} == {"gw0", "gw1"}, "the suite used one worker only: no evidence either way"
