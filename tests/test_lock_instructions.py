"""scripts/lock_instructions.py's command line: bad input is one line and a non-zero exit, before any node starts."""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--ops", "0"], "--ops must be a whole number, 1 or more, not '0'"),
        (["--ops", "many"], "--ops must be a whole number, 1 or more, not 'many'"),
        (["--cases", "ours-redis,nosuch"], "unknown case nosuch; choose from floor-1node-fenced, ours-redis"),
        (["--cases", ","], "unknown case (none); choose from"),
    ],
)
@pytest.mark.slow  # a subprocess each: make test runs it, make check does not
def test_bad_input_is_one_line_and_a_non_zero_exit(args, said):
    script = str(ROOT / "scripts" / "lock_instructions.py")
    done = subprocess.run([sys.executable, script, *args], cwd=ROOT, capture_output=True, text=True, timeout=60)

    assert done.returncode == 2, done.stderr
    assert said in done.stderr and len(done.stderr.strip().splitlines()) == 1
    assert done.stdout == ""
