"""``lockbench`` with a tiny measuring time: the JSON has every row (the asyncio peers' included),
each with positive figures, and the ratios it prints against its targets are the JSON's, each
judged met or not by its target; a peer that cannot be imported is one line, not a crash."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from io import StringIO
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command

from loadtests.management.commands.lockbench import TARGETS, Command
from loadtests.targets import shown_against
from processes.nodes import ping_error
from tests import slots

ROWS = [
    "floor-1node",
    "floor-5nodes",
    "floor-1node-fenced",
    "floor-5nodes-fenced",
    "ours-redis",
    "ours-redlock",
    "redis-py-lock",
    "python-redis-lock",
    "pottery-redlock",
    "redlock-py",
    "ours-redis-async",
    "ours-redlock-async",
    "redis-py-lock-async",
    "aioredlock",
    "contended-polling",
    "contended-notified",
    "floor-etcd",
    "ours-etcd",
    "floor-zookeeper",
    "ours-zookeeper",
]  # the etcd rows: their own cluster on BASE_PORT+5..+10; the ZooKeeper rows on BASE_PORT+171..+193
# Inside the lock tests' range (7679-7690), clear of tests/locks (7679-7683).
BASE_PORT = slots.LOCKBENCH_BASE_PORT
ROOT = Path(__file__).resolve().parents[1]


# Seen by trying them: --rounds -1 ended in a ZeroDivisionError, --base-port 70000 in a
# ValueError from the socket, both as tracebacks.
@pytest.mark.parametrize(
    "options, message",
    [
        ({"rounds": -1}, "--rounds -1: give 1 or more, or 0 for one slice per 0.2 s"),
        ({"seconds": float("nan")}, "--seconds nan: give a positive number of seconds"),
        ({"seconds": float("inf")}, "--seconds inf: give a positive number of seconds"),
        ({"seconds": 0}, "--seconds 0: give a positive number of seconds"),
        ({"base_port": 70000}, "--base-port 70000: its rows use ports 70000 to 70193: give a base from 1 to 65342"),
        ({"base_port": 65400}, "--base-port 65400: its rows use ports 65400 to 65593: give a base from 1 to 65342"),
        ({"base_port": 0}, "--base-port 0: its rows use ports 0 to 193: give a base from 1 to 65342"),
    ],
)
def test_bad_arguments_are_one_line_before_any_node_starts(tmp_path, options, message):
    path = tmp_path / "lockbench.json"
    with pytest.raises(CommandError) as excinfo:
        call_command("lockbench", json=str(path), **{"seconds": 0.3, "base_port": BASE_PORT, **options})
    assert str(excinfo.value) == message
    assert not path.exists()


@pytest.mark.parametrize("where", ["folder", "under a file"])
def test_an_unwritable_json_is_refused_before_any_node_starts(tmp_path, where):
    """Seen with ``--json README.md/x.json``: two minutes of rows, then a traceback and no file."""
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    path = tmp_path if where == "folder" else blocker / "lockbench.json"
    with pytest.raises(CommandError) as excinfo:
        call_command("lockbench", json=str(path), seconds=0.3, base_port=BASE_PORT, stdout=StringIO())
    problem = "is a folder" if where == "folder" else f"{blocker} is a file, not a folder"
    assert str(excinfo.value).startswith(f"--json {path}: {problem}")


@pytest.mark.slow
def test_lockbench_writes_every_row_with_positive_figures(tmp_path):
    path = tmp_path / "lockbench.json"
    out, err = StringIO(), StringIO()
    call_command("lockbench", json=str(path), seconds=0.3, base_port=BASE_PORT, stdout=out, stderr=err)
    written = json.loads(path.read_text())
    rows = written["rows"]
    assert [row["name"] for row in rows] == ROWS and written["unmeasured"] == {}
    assert written["machine"]["wake_up"]["round_trip_us"] > 0
    for row in rows:
        assert row["ops_per_s"] > 0 and row["us_per_op"] > 0, row
        if row["name"].startswith("contended-"):
            assert row["p99_wait_ms"] > 0, row
    text = out.getvalue()
    by_name = {row["name"]: row["ops_per_s"] for row in rows}
    for numerator, denominator, target in TARGETS:
        ratio = by_name[numerator] / by_name[denominator]
        verdict = "met" if ratio >= target else "NOT met"
        line = f"  {numerator} / {denominator} = {shown_against(ratio, target):>5}x  (target >= {target}x)  {verdict}"
        assert any(printed.startswith(line) for printed in text.splitlines()), f"{line!r} not printed:\n{text}"
    assert any(line.startswith("  floor-5nodes-fenced / floor-5nodes = ") for line in text.splitlines()), text
    assert text.startswith("machine wake-up: one round trip through a pipe between two processes"), text
    # No figure is asserted: with 0.3 s a row, one slice, a full run on a fresh clone once read
    # ours-redlock 1,361/s against redlock-py's 1,399/s (2.7x apart in lockbench's own runs).
    # Which lock is faster is the benchmark's to print (docs/locks.md), not a timed test's.
    assert "round" in err.getvalue()


def test_the_asyncio_rows_stand_beside_their_asyncio_peers_with_a_target_each():
    """Issue 29's rows: each asyncio twin against its asyncio peer, at least 1.0x; issue 28's
    five-node floor target is there too."""
    assert ("ours-redis-async", "redis-py-lock-async", 1.0) in TARGETS
    assert ("ours-redlock-async", "aioredlock", 1.0) in TARGETS
    assert ("ours-redlock", "floor-5nodes", 0.9) in TARGETS
    assert {numerator for numerator, _, _ in TARGETS} >= {"ours-redis-async", "ours-redlock-async"}


def test_a_peer_that_cannot_be_imported_is_one_line_and_its_target_says_not_measured(tmp_path):
    rows = [{"name": name, "ops_per_s": 100.0, "us_per_op": 10_000.0} for name in ROWS if name != "aioredlock"]
    out = StringIO()
    command = Command(stdout=out)
    why = "TypeError: duplicate base class TimeoutError"
    command.unmeasured = {"aioredlock": f"it cannot be imported here ({why})"}
    command._report(rows, tmp_path / "lockbench.json")
    lines = out.getvalue().splitlines()
    assert f"aioredlock: not measured, it cannot be imported here ({why})" in lines
    assert "  ours-redlock-async / aioredlock: not measured  (target >= 1.0x)" in lines
    assert "  ours-redis-async / redis-py-lock-async =  1.00x  (target >= 1.0x)  met" in lines


def test_a_lock_against_its_floor_is_shown_beside_what_the_fenced_floor_reaches_and_a_near_miss_in_full(tmp_path):
    figures = {"floor-5nodes": 1000.0, "floor-5nodes-fenced": 870.0, "ours-redlock": 897.0}
    rows = [{"name": name, "ops_per_s": figures.get(name, 100.0), "us_per_op": 10.0} for name in ROWS]
    out = StringIO()
    command = Command(stdout=out)
    command.unmeasured = {}
    command._report(rows, tmp_path / "lockbench.json")
    lines = out.getvalue().splitlines()
    # 0.897 had printed as "0.90x  (target >= 0.9x)  NOT met"; the fenced floor says why it cannot be 0.9x.
    assert (
        "  ours-redlock / floor-5nodes = 0.897x  (target >= 0.9x)  NOT met"
        "  (the fenced floor, our scripts with no library, reaches 0.87x)"
    ) in lines
    assert "  ours-redis / redis-py-lock =  1.00x  (target >= 1.28x)  NOT met" in lines  # a peer: no floor beside it


@pytest.mark.slow
def test_a_consensus_row_that_fails_is_not_measured_and_the_other_rows_are_kept(tmp_path, monkeypatch):
    """Seen in a full run on 2026-12-05: ZooKeeper did not answer one try-lock's create within its
    second, and lockbench ended in a NotAcquired traceback after 1 min 44 s, every Redis and etcd
    figure lost. The failed rows are now not measured, with the reason; the rest is written."""
    from loadtests.management.commands import lockbench
    from locks.errors import NotAcquired

    def stalled(seconds, base_port):
        raise NotAcquired("ZooKeeper did not answer within 0 ms", name="lockbench:zookeeper", nodes=["127.0.0.1:1"])

    monkeypatch.setattr(lockbench, "zookeeper_rows", stalled)
    path = tmp_path / "lockbench.json"
    out = StringIO()
    call_command("lockbench", json=str(path), seconds=0.3, base_port=BASE_PORT, stdout=out, stderr=StringIO())
    written = json.loads(path.read_text())
    assert [row["name"] for row in written["rows"]] == [name for name in ROWS if "zookeeper" not in name]
    assert set(written["unmeasured"]) == {"floor-zookeeper", "ours-zookeeper"}
    assert "ZooKeeper did not answer within 0 ms" in written["unmeasured"]["ours-zookeeper"]
    lines = out.getvalue().splitlines()
    assert any(line.startswith("ours-zookeeper: not measured, ") for line in lines), lines
    assert any(line.startswith("  ours-redis / floor-1node = ") for line in lines), lines


@pytest.mark.slow  # a manage.py subprocess that starts five nodes
def test_a_sigterm_stops_its_nodes_and_says_so(tmp_path):
    """Seen with ``timeout 60 manage.py lockbench`` (2026-12-05): SIGTERM ended Python at once, and
    its five redis-server processes (7779-7783) ran on with nobody to stop them. SIGTERM now
    stops them as Ctrl-C does, and the command says so in one line."""
    ports = [BASE_PORT + index for index in range(5)]
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "tests.settings"}  # its slot is this worker's
    command = [sys.executable, "manage.py", "lockbench", "--json", str(tmp_path / "x.json"), "--seconds", "30"]
    bench = subprocess.Popen(
        [*command, "--base-port", str(BASE_PORT)], cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    try:
        deadline = time.monotonic() + 30
        while not all(answers(port) for port in ports):
            assert bench.poll() is None and time.monotonic() < deadline, "the nodes did not come up"
            time.sleep(0.2)
        bench.send_signal(signal.SIGTERM)
        _, stderr = bench.communicate(timeout=30)
    finally:
        if bench.poll() is None:
            bench.kill()
    assert bench.returncode == 1 and "interrupted: its Redis nodes, etcd and ZooKeeper were stopped" in stderr.decode()
    assert [port for port in ports if answers(port)] == []


FINALISER_SIGTERM = """
import gc, os, signal, sys, time
from processes.children import sigterm_as_interrupt

class Pool:
    def __del__(self):  # a finaliser running when SIGTERM comes, as ConnectionPool.__del__ did
        os.kill(os.getpid(), signal.SIGTERM)
        for _ in range(100_000):
            pass

try:
    with sigterm_as_interrupt():
        Pool()  # collected at once: its __del__ takes the signal
        time.sleep(5)
    print("ran on")
except KeyboardInterrupt:
    print("interrupted")
"""


def test_a_sigterm_during_a_finaliser_still_interrupts():
    """Seen in CI (stop 56): ``test_a_sigterm_stops_its_nodes_and_says_so`` timed out because
    lockbench ran on after its SIGTERM; its stderr began "Exception ignored in: <function
    ConnectionPool.__del__". The handler's KeyboardInterrupt was raised inside a finaliser, where
    Python only prints an exception. Such a swallowed interrupt is now delivered again."""
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-c", FINALISER_SIGTERM], cwd=ROOT, capture_output=True, text=True, timeout=30
    )
    assert done.stdout.strip() == "interrupted", done.stdout + done.stderr
    assert time.monotonic() - started < 4


def answers(port: int) -> bool:
    return ping_error(f"redis://127.0.0.1:{port}/0", timeout_s=0.5) is None
