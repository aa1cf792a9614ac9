"""The machine-steadiness probe (loadtests/steadiness.py): its figures and its command line."""

from __future__ import annotations

import subprocess
import sys

import pytest

from loadtests.report.page import machine_rows
from loadtests.steadiness import describe, steadiness


def test_the_probe_times_the_same_job_each_run():
    probe = steadiness(jobs=3, job_s=0.02)

    assert len(probe["seconds"]) == 3 and probe["iterations"] > 0
    assert all(seconds > 0 for seconds in probe["seconds"])
    assert probe["spread"] == pytest.approx(max(probe["seconds"]) / min(probe["seconds"]), rel=0.01)
    assert describe(probe).startswith("machine steadiness: one fixed CPU job took ")


def test_the_report_says_it_in_words():
    rows = dict(machine_rows({"steadiness": {"iterations": 10, "seconds": [0.5, 0.6], "spread": 1.2}}))
    assert rows["Steadiness (flashsale --steadiness)"].startswith("one fixed CPU job took 0.50-0.60 s over 2 runs")


# Seen by a helper: --seconds nan, inf, 0.00001 (each run rounded to 0.000 s) and 1e-300 ended in a traceback.
@pytest.mark.parametrize(
    "arguments",
    [["--jobs", "1"], ["--seconds", "0"], ["--seconds", "nan"], ["--seconds", "inf"], ["--seconds", "0.00001"]],
)
def test_a_bad_count_is_one_line_and_exit_2(arguments):
    result = subprocess.run(
        [sys.executable, "-m", "loadtests.steadiness", *arguments], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "give --jobs 2 or more and --seconds from 0.01 to 3600" in result.stderr.strip().splitlines()[-1]
