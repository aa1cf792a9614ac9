"""loadtests/cpu.py: the CPU a burst round cost each request, by the processes that spent it."""

import os
import subprocess
import sys
import textwrap
import time
from types import SimpleNamespace

import pytest

from loadtests import cpu
from loadtests.table import cpu_line

# Burns 0.3 s of CPU in itself and in a child of its own, says so, then waits for its stdin to close.
BURNER = textwrap.dedent(
    """
    import subprocess, sys, time
    BURN = "import time\\nwhile time.process_time() < 0.3: pass\\nprint('burnt', flush=True)\\nsys.stdin.read()"
    child = subprocess.Popen([sys.executable, "-c", "import sys\\n" + BURN], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
    while time.process_time() < 0.3:
        pass
    child.stdout.readline()
    print("burnt", flush=True)
    sys.stdin.read()
    child.stdin.close()
    child.wait()
    """
)


def test_a_group_is_the_cpu_of_its_process_trees():
    burner = subprocess.Popen([sys.executable, "-c", BURNER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert burner.stdout.readline().strip() == "burnt"
        # The burner is this process's child: a process belongs to its nearest root's group.
        taken = cpu.snapshot({"burner": [burner.pid], "test": [os.getpid()]})
        mine = time.process_time()
    finally:
        burner.stdin.close()
        burner.wait(timeout=10)
    assert 0.5 <= taken["burner"] < 3.0  # both processes' 0.3 s each (/proc counts 10 ms ticks)
    assert taken["test"] >= mine - 0.25  # this process's own CPU (less the snapshot's), in its own group
    assert "postgres" in taken  # a service is counted by its name, whoever started it


def test_a_rounds_cost_is_milliseconds_a_request_by_group():
    before = {"pods": 1.0, "postgres": 2.0, "locust": 0.5}
    after = {"pods": 2.83, "postgres": 2.33, "locust": 0.8, "redis": 0.02}

    cost = cpu.per_request(before, after, 1000)

    assert cost == {"pods": 1.83, "postgres": 0.33, "redis": 0.02, "locust": 0.3, "total": 2.48}
    assert cpu.per_request(None, after, 1000) is None and cpu.per_request(before, after, 0) is None


def test_the_cpu_line_reads_a_purchase_against_its_floor_round():
    run = {
        "cpu_ms": {"pods": 1.83, "postgres": 0.33, "locust": 0.3, "total": 2.46},
        "floor": {"cpu_ms": {"pods": 1.39, "locust": 0.28, "total": 1.67}},
    }

    assert cpu_line(run) == (
        "  cpu ms a request: pods 1.83 + postgres 0.33 + locust 0.30 = 2.46; "
        "floor round 1.67 (pods 1.39 + locust 0.28): 1.47×"
    )
    assert cpu_line({"cpu_ms": None}) is None
    assert cpu_line({"cpu_ms": run["cpu_ms"], "floor": None}).endswith("= 2.46")


@pytest.mark.parametrize("missing", ["countdown", "round"])
def test_a_round_without_both_snapshots_has_no_cost(missing):
    from loadtests.burst import round_cpu
    from loadtests.plan import Progress

    progress = Progress(backend="db", requests=10)
    progress.cpu_at = {"countdown_1": {"pods": 1.0}, "round_1": {"pods": 2.0}}
    del progress.cpu_at[f"{missing}_1"]

    assert round_cpu(progress, 1, {"answered": 10}) is None


def test_a_round_shorter_than_a_sample_still_has_its_opening_snapshot():
    """The driver polls the Locust master every 0.25 s; a floor round of 300 purchases lasts about
    0.1 s on a fast machine, so one poll saw round 0 counting down and the next saw round 1: the
    opening snapshot was never taken (cpu_ms None) or taken at the end with the closing one (no
    ``pods``). Seen as test_deep_puts_one_unit_per_purchase_and_every_purchase_buys failing in 3
    of 7 runs of the burst tests. The last look during the countdown is the opening snapshot."""
    from loadtests.burst import note_steps, round_cpu
    from loadtests.plan import Progress

    meter_readings = iter([{"pods": 1.0}, {"pods": 1.1}, {"pods": 4.0}, {"pods": 4.0}, {"pods": 4.0}])
    progress = Progress(backend="db", requests=300)
    progress.meter = lambda: next(meter_readings)
    since = [time.monotonic()]
    note_steps(progress, {"round": 0, "phase": "countdown"}, since)  # prepare; the countdown's looks
    note_steps(progress, {"round": 1, "phase": "countdown"}, since)  # round 0 opened and ended between

    cost = round_cpu(progress, 0, {"answered": 300})
    assert cost is not None and cost["pods"] > 0, progress.cpu_at


class _EndingSale:
    """What :func:`loadtests.burst.drive` looks at of a row whose master ends the sale while it
    reads: the progress file still says the last round is open, and the summary is already there
    (the master writes its summary, then its last progress report)."""

    def __init__(self, summary_path) -> None:
        self.rounds = [("floor", "no-such-sku"), ("purchase", "no-such-sku")]
        self.workers: list = []
        self.master = self
        self.summary_path = summary_path
        self.plan = SimpleNamespace(timeout_s=60.0)  # the open round's time limit

    def running(self) -> bool:
        return True

    def progress_report(self) -> dict:
        self.summary_path.write_text("{}")  # the master's summary, written just after this read
        return {"round": 1, "phase": "open", "opened_at": time.time()}


@pytest.mark.django_db
def test_the_last_rounds_end_is_noted_when_the_summary_comes_just_after_a_stale_report(tmp_path):
    """Seen in a fresh clone's ``make test`` at load 9: test_deep_puts_one_unit_per_purchase_and_every_purchase_buys
    failed, its purchase round's ``cpu_ms`` None. The driver read the master's progress (the last
    round still open), then found the summary and returned: the round's end, and with it its closing
    CPU snapshot, was never noted."""
    from loadtests.burst import drive, round_cpu
    from loadtests.plan import Progress

    readings = iter([{"pods": 1.0}, {"pods": 1.5}, {"pods": 4.0}, {"pods": 4.5}])
    progress = Progress(backend="db", requests=300)
    progress.meter = lambda: next(readings)
    since = [time.monotonic()]
    progress.step("prepare", since)
    progress.cpu_at["countdown_1"] = progress.meter()  # the countdown's last look, as note_steps takes it

    drive(_EndingSale(tmp_path / "summary.json"), progress, None, since)

    assert progress.finished and "round_1" in progress.steps, progress.steps
    cost = round_cpu(progress, 1, {"answered": 300})
    assert cost is not None and cost["pods"] > 0, progress.cpu_at
