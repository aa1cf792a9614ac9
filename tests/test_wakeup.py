"""The wake-up probe (loadtests/wakeup.py): what one round trip between two processes costs here."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from loadtests.report.page import machine_rows
from loadtests.wakeup import describe, idle_states, measured, wake_up


def test_the_probe_times_round_trips_to_a_child_and_gives_the_caller_its_cores_back():
    cores = os.sched_getaffinity(0)

    probe = wake_up(batches=3, round_trips=50)

    assert 0 < probe["fastest_batch_us"] <= probe["round_trip_us"] <= probe["slowest_batch_us"]
    assert (probe["batches"], probe["round_trips"]) == (3, 50)
    assert probe["one_core_each"] is (len(cores) > 1)
    # It pins itself to one core while it measures: a command that went on pinned (Locust, the pods
    # it starts) would run on half the machine.
    assert os.sched_getaffinity(0) == cores


def test_how_idle_cores_wait_is_read_where_linux_says_it(tmp_path):
    (tmp_path / "current_driver").write_text("haltpoll\n")
    (tmp_path / "current_governor").write_text("haltpoll\n")
    poll = tmp_path / "guest_halt_poll_ns"
    poll.write_text("0\n")

    assert idle_states(tmp_path, poll) == {"driver": "haltpoll", "governor": "haltpoll", "guest_halt_poll_ns": "0"}
    assert idle_states(tmp_path / "absent", tmp_path / "absent-too") == {}


def test_the_line_and_the_report_say_it_in_words():
    probe = {
        "round_trip_us": 49.1,
        "fastest_batch_us": 47.4,
        "slowest_batch_us": 53.7,
        "batches": 10,
        "round_trips": 500,
        "one_core_each": True,
        "idle": {"driver": "haltpoll", "guest_halt_poll_ns": "0"},
    }
    line = describe(probe)
    assert line.startswith("machine wake-up: one round trip through a pipe between two processes on a core each 49.1")
    assert "idle cores: driver haltpoll, guest_halt_poll_ns 0" in line
    assert "idle cores: not readable here" in describe({**probe, "idle": {}})

    rows = dict(machine_rows({"wake_up": probe}))
    said = rows["Wake-up (loadtests/wakeup.py)"]
    assert said.startswith("one round trip through a pipe between two processes 49.1 µs")
    # A hand-edited figure is not read as one (the report's rule for every figure): shown as recorded.
    edited = dict(machine_rows({"wake_up": {**probe, "round_trip_us": "fast"}}))
    assert "round_trip_us fast" in edited["Wake-up (loadtests/wakeup.py)"]


def test_bad_counts_are_refused():
    with pytest.raises(ValueError):
        wake_up(batches=0)


@pytest.mark.parametrize("arguments", [["--batches", "0"], ["--round-trips", "-1"]])
def test_a_bad_count_on_the_command_line_is_one_line_and_exit_2(arguments):
    result = subprocess.run(
        [sys.executable, "-m", "loadtests.wakeup", *arguments], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines()[-1].endswith("give --batches 1 or more and --round-trips 1 or more")


def test_a_probe_that_cannot_start_its_child_says_so_in_its_line(monkeypatch, tmp_path):
    monkeypatch.setattr(sys, "executable", str(tmp_path / "no-python-here"))
    probe, line = measured()
    assert probe is None and line.startswith("machine wake-up: not measured (") and "no-python-here" in line
