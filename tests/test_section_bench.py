"""scripts/section_bench.py's command line: bad input is one line and a non-zero exit, before any section runs."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def bench(*args: str) -> subprocess.CompletedProcess:
    # Its own slot (6), whatever xdist worker runs this test: the script takes FLASHSALE_TEST_SLOT + worker.
    env = {key: value for key, value in os.environ.items() if key != "PYTEST_XDIST_WORKER"}
    env.update(PYTHONPATH=str(ROOT), FLASHSALE_TEST_SLOT="6")
    script = str(ROOT / "scripts" / "section_bench.py")
    return subprocess.run([sys.executable, script, *args], cwd=ROOT, env=env, capture_output=True, text=True)


@pytest.mark.parametrize(
    ("args", "code", "said"),
    [
        (["redis", "x"], 2, "purchases must be a whole number, 1 or more, not 'x'"),
        (["redis", "0", "--guard"], 2, "purchases must be a whole number, 1 or more, not '0'"),
        (["nosuch", "5"], 1, "'nosuch' is not a strategy"),
        (["atomic", "50", "--batch", "0"], 2, "--batch must be a whole number from 1 to 1000, not '0'"),
        (["atomic", "50", "--batch", "ten"], 2, "--batch must be a whole number from 1 to 1000, not 'ten'"),
    ],
)
@pytest.mark.slow  # a subprocess each: make test runs it, make check does not
def test_bad_input_is_one_line_and_a_non_zero_exit(args, code, said):
    done = bench(*args)

    assert done.returncode == code, done.stderr
    assert said in done.stderr and len(done.stderr.strip().splitlines()) == 1
    assert done.stdout == ""
