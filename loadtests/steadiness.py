"""How steady this machine's CPU is: the same fixed job, timed several times in a row.

A ratio of two burst rounds (``×floor``) can repeat no better than the machine's own speed does
over the length of a round. On a quiet 2-core machine here, a fixed job of about 2 s, run twelve
times in a row with nothing else running, took 1.68-2.19 s (1.31×), and a 0.2 s job 1.65× (docs/burst.md,
"The instrument on two cores"). ``flashsale --steadiness`` runs this probe before its rows and
prints the spread beside the table; ``python -m loadtests.steadiness`` runs it alone.

The job is pure Python arithmetic in one thread (no I/O, no allocation worth the name): what
varies is the CPU time the machine gives it, not the job.
"""

from __future__ import annotations

import argparse
import json
import time

#: Iterations of the job per calibration step, and how long one job should take.
CALIBRATION_ITERATIONS = 200_000
JOBS, JOB_S = 6, 0.75
#: The shortest job the probe times, and the longest: each run is kept to the millisecond, and a
#: shorter job would read 0.000 s (no spread to compute); a longer one is not a probe any more.
SHORTEST_JOB_S, LONGEST_JOB_S = 0.01, 3600.0


def job(iterations: int) -> float:
    """Seconds one fixed job of ``iterations`` took."""
    started = time.perf_counter()
    total = 0
    for number in range(iterations):
        total += number * number % 7
    return time.perf_counter() - started


def steadiness(*, jobs: int = JOBS, job_s: float = JOB_S) -> dict:
    """Time ``jobs`` runs of a job sized to take about ``job_s`` seconds: each run's seconds, the
    slowest over the fastest (``spread``) and the job's size."""
    if jobs < 2 or not SHORTEST_JOB_S <= job_s <= LONGEST_JOB_S:  # nan compares false
        raise ValueError(f"the probe needs at least 2 jobs of {SHORTEST_JOB_S:g} to {LONGEST_JOB_S:g} seconds")
    iterations = max(1, int(CALIBRATION_ITERATIONS * job_s / job(CALIBRATION_ITERATIONS)))
    seconds = [round(job(iterations), 3) for _ in range(jobs)]
    return {"iterations": iterations, "seconds": seconds, "spread": round(max(seconds) / min(seconds), 3)}


def describe(probe: dict) -> str:
    """One line for the table: the job's times and their spread."""
    seconds = probe["seconds"]
    return (
        f"machine steadiness: one fixed CPU job took {min(seconds):.2f}-{max(seconds):.2f} s over {len(seconds)} runs "
        f"in a row ({probe['spread']:.2f}x): two runs' ×floor that differ by less are within this machine's noise"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=JOBS, help=f"runs of the job (default {JOBS})")
    parser.add_argument("--seconds", type=float, default=JOB_S, help=f"about how long one job takes (default {JOB_S})")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    options = parser.parse_args(argv)
    if options.jobs < 2 or not SHORTEST_JOB_S <= options.seconds <= LONGEST_JOB_S:  # nan compares false
        parser.error(f"give --jobs 2 or more and --seconds from {SHORTEST_JOB_S:g} to {LONGEST_JOB_S:g}")
    probe = steadiness(jobs=options.jobs, job_s=options.seconds)
    print(json.dumps(probe) if options.json else describe(probe))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
