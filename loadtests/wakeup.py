"""What one round trip between two processes costs on this machine when its cores are idle.

Every figure the bursts and ``lockbench`` print is made of round trips: Locust to a pod, a pod to
PostgreSQL and Redis, a lock to its nodes. Each one sleeps a process and wakes another, and what a
wake-up costs is a property of the machine, not of the shop. On the thirty-second session's
Firecracker VM, whose idle cores halt through the host (cpuidle ``haltpoll`` with
``guest_halt_poll_ns`` 0), a one-byte ping-pong through two pipes between two processes on a
core each took 49 µs, a ``SELECT 1`` on a held connection 70 µs and a Redis ``PING`` 80 µs; with
``/dev/cpu_dma_latency`` held at 0 (idle cores poll instead of halting) 4.4, 17 and 24.5 µs.
``lockbench``'s ``floor-1node``, two round trips one after another, read 7,204 ops/s and 29,518
ops/s: a fourfold spread between machines that the floor's code never saw (docs/locks.md, "The
machine's wake-up").

So the figures say what they were measured on: ``flashsale`` and ``lockbench`` print this probe's
line before their rows and keep it in their JSON (``machine.wake_up``); ``python -m
loadtests.wakeup`` runs it alone. The probe: a child process echoes one byte at a time through two
pipes; the parent times ``batches`` batches of ``round_trips`` echoes and keeps each batch's mean,
so the median is one figure that a few slow batches (another process's burst) do not move.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

#: Batches and round trips per batch: about 0.3 s on a machine whose wake-up costs 50 µs.
BATCHES, ROUND_TRIPS = 10, 500
#: The child: echo each byte back until stdin closes.
ECHO = "import os\nwhile (b := os.read(0, 1)):\n    os.write(1, b)\n"
CPUIDLE = Path("/sys/devices/system/cpu/cpuidle")
HALT_POLL_NS = Path("/sys/module/haltpoll/parameters/guest_halt_poll_ns")


def idle_states(cpuidle: Path = CPUIDLE, halt_poll_ns: Path = HALT_POLL_NS) -> dict[str, str]:
    """How this machine's idle cores wait (Linux): the cpuidle driver and governor, and the
    ``haltpoll`` driver's poll time when it has one; what cannot be read is left out."""
    found = {}
    for name, path in (
        ("driver", cpuidle / "current_driver"),
        ("governor", cpuidle / "current_governor_ro"),
        ("governor", cpuidle / "current_governor"),
        ("guest_halt_poll_ns", halt_poll_ns),
    ):
        try:
            found.setdefault(name, path.read_text().strip())
        except OSError:
            continue
    return found


def wake_up(*, batches: int = BATCHES, round_trips: int = ROUND_TRIPS) -> dict:
    """Time ``batches`` batches of ``round_trips`` one-byte round trips to a child process, each on
    a core of its own when there are two: ``round_trip_us`` (the median of the batches' means), the
    fastest and slowest batch, and how the machine's idle cores wait (:func:`idle_states`)."""
    if batches < 1 or round_trips < 1:
        raise ValueError("the probe needs at least 1 batch of at least 1 round trip")
    child = subprocess.Popen([sys.executable, "-c", ECHO], stdin=subprocess.PIPE, stdout=subprocess.PIPE, bufsize=0)
    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    try:
        if len(cores) > 1:
            # One core each: two processes the scheduler puts on one core wake each other without
            # waking a core (2.6 µs here against 28-68 µs across two), and where it puts them varies.
            os.sched_setaffinity(child.pid, {cores[1]})
            os.sched_setaffinity(0, {cores[0]})
        send, receive = child.stdin.fileno(), child.stdout.fileno()
        means = []
        for _ in range(batches + 1):  # the first batch warms up both processes, and is not kept
            started = time.perf_counter()
            for _ in range(round_trips):
                os.write(send, b"x")
                if os.read(receive, 1) != b"x":
                    raise RuntimeError("the echoing child stopped answering")
            means.append((time.perf_counter() - started) / round_trips * 1e6)
    finally:
        if len(cores) > 1:
            os.sched_setaffinity(0, cores)
        child.stdin.close()
        child.wait(timeout=5)
        child.stdout.close()
    means = means[1:]
    return {
        "round_trip_us": round(statistics.median(means), 1),
        "fastest_batch_us": round(min(means), 1),
        "slowest_batch_us": round(max(means), 1),
        "batches": batches,
        "round_trips": round_trips,
        "one_core_each": len(cores) > 1,
        "idle": idle_states(),
    }


def describe(probe: dict) -> str:
    """One line for the top of a table: the round trip and how idle cores wait."""
    idle = probe.get("idle") or {}
    how = ", ".join(f"{name} {value}" for name, value in idle.items()) or "not readable here"
    return (
        f"machine wake-up: one round trip through a pipe between two processes "
        f"{'on a core each' if probe.get('one_core_each') else 'on one core'} {probe['round_trip_us']:.1f} µs "
        f"(median of {probe['batches']} × {probe['round_trips']:,}; batches {probe['fastest_batch_us']:.1f}-"
        f"{probe['slowest_batch_us']:.1f} µs; idle cores: {how}): every round trip of a row or a floor pays it"
    )


def measured() -> tuple[dict | None, str]:
    """The probe and its line, as a command prints it before its rows; a probe that could not run
    (no child process here, one that stopped answering) is None, its line saying why."""
    try:
        probe = wake_up()
    except (OSError, RuntimeError, subprocess.SubprocessError) as exc:
        return None, f"machine wake-up: not measured ({exc})"
    return probe, describe(probe)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batches", type=int, default=BATCHES, help=f"batches timed (default {BATCHES})")
    parser.add_argument(
        "--round-trips", type=int, default=ROUND_TRIPS, help=f"round trips per batch (default {ROUND_TRIPS})"
    )
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    options = parser.parse_args(argv)
    if options.batches < 1 or options.round_trips < 1:
        parser.error("give --batches 1 or more and --round-trips 1 or more")
    probe = wake_up(batches=options.batches, round_trips=options.round_trips)
    print(json.dumps(probe) if options.json else describe(probe))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
