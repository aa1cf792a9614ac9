"""scripts/lua_round_trip.py: a row per acquire shape from a real Redis; bad input is one line and a non-zero exit."""

import subprocess
import sys
from pathlib import Path

import pytest
import redis

from tests.slots import LOCK_TEST_REDIS_URL, SHOP_REDIS_URL

ROOT = Path(__file__).resolve().parent.parent
ROWS = ("SET NX PX", "EVALSHA: SET", "EVALSHA: SET + INCR", "EVALSHA: our ACQUIRE", "MULTI SET INCR EXEC")


def run(*args: str) -> subprocess.CompletedProcess:
    script = str(ROOT / "scripts" / "lua_round_trip.py")
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, script, *args], cwd=ROOT, env=env, capture_output=True, text=True)


def test_prints_every_row_against_the_plain_set_and_leaves_no_key():
    done = run("--url", LOCK_TEST_REDIS_URL, "--slices", "2", "--ops", "3")

    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("one command + DEL, median of 2 slices of 3")
    assert [line.split("  ")[1].strip() for line in lines[1:]] == list(ROWS)
    assert lines[1].endswith("1.00x SET NX PX")
    assert redis.Redis.from_url(LOCK_TEST_REDIS_URL).keys("lua_round_trip:*") == []


def test_with_several_urls_each_command_goes_to_every_node_and_leaves_no_key_on_any():
    done = run("--url", LOCK_TEST_REDIS_URL, "--url", SHOP_REDIS_URL, "--slices", "2", "--ops", "3")

    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].endswith(f"(2 nodes at once: {LOCK_TEST_REDIS_URL} {SHOP_REDIS_URL})")
    assert [line.split("  ")[1].strip() for line in lines[1:]] == list(ROWS)
    for url in (LOCK_TEST_REDIS_URL, SHOP_REDIS_URL):
        assert redis.Redis.from_url(url).keys("lua_round_trip:*") == []


@pytest.mark.slow  # starts Django in a process of its own per case: make test runs it, make check does not
@pytest.mark.parametrize(
    ("args", "code", "said"),
    [
        (["--ops", "0"], 2, "--slices and --ops must be 1 or more, not 40 and 0"),
        (["--slices", "-1"], 2, "--slices and --ops must be 1 or more, not -1 and 200"),
        (["--url", "redis://127.0.0.1:1/0"], 1, "cannot use redis://127.0.0.1:1/0"),
        (
            ["--url", "redis://127.0.0.1:6379/15", "--url", "redis://127.0.0.1:1/0"],
            1,
            "cannot use redis://127.0.0.1:6379/15 redis://127.0.0.1:1/0",
        ),
        (["--url", "redis://127.0.0.1:6379/15", "--url", "notaurl"], 2, "--url 'notaurl'"),
        (["--url", "notaurl"], 2, "--url 'notaurl': Redis URL must specify one of the following schemes"),
    ],
)
def test_bad_input_is_one_line_and_a_non_zero_exit(args, code, said):
    done = run(*args)

    assert done.returncode == code, done.stderr
    assert said in done.stderr and len(done.stderr.strip().splitlines()) == 1
    assert done.stdout == ""
