"""The report's shared ground: where it is written, its error, and the small number helpers every part uses."""

from __future__ import annotations

import math
from pathlib import Path

#: Where ``make demo`` and ``manage.py report`` write the report; the admin dashboard links it.
LATEST_REPORT = Path(__file__).resolve().parents[2] / "artifacts" / "report.html"


DEFAULT_JSON = LATEST_REPORT.with_name("burst.json")


STYLE = (Path(__file__).resolve().parent / "report.css").read_text()


#: Strategies that exist to fail: overselling is what they are meant to show.
CONTROLS = {"local", "unsafe"}


MISSING = "–"


class ReportError(ValueError):
    """The burst JSON cannot be rendered; the message says what is wrong with it."""


# Reading figures: every key may be missing, and a present key may hold something unexpected.


def number(value: object) -> float | None:
    """``value`` if it is a finite number (not a bool), else None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return value


def figure(run: dict, key: str) -> float | None:
    """``run[key]`` if it is a finite number of 0 or more, else None: no figure a run records (a
    rate, a time, a count, a ratio) can be below 0, so a negative one is missing, as a wrong type is."""
    value = number(run.get(key))
    return None if value is None or value < 0 else value


def status_count(run: dict, status: str) -> int | None:
    counts = run.get("status_counts")
    if not isinstance(counts, dict):
        return None
    value = counts.get(status, 0)
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def timing(run: dict, part: str, quantile: str) -> float | None:
    split = run.get("server_timing")
    if not isinstance(split, dict) or not isinstance(split.get(part), dict):
        return None
    return figure(split[part], quantile)


def count(value: float) -> str:
    """1912 → "1,912"."""
    return f"{value:,.0f}"


def ms(value: float) -> str:
    return f"{value:.1f}" if value < 10 else f"{value:,.0f}"


def ratio(value: float) -> str:
    return f"{value:.2f}×"


def plural(n: float, one: str, many: str) -> str:
    return f"{count(n)} {one if n == 1 else many}"


def validate(data: object) -> list[dict]:
    """The runs of a burst document; :class:`ReportError` saying what is wrong otherwise."""
    if not isinstance(data, dict):
        raise ReportError(f'the top level must be a JSON object with a "runs" list, not {type(data).__name__}')
    runs = data.get("runs")
    if not isinstance(runs, list):
        raise ReportError('there is no "runs" list at the top level')
    named = []
    for i, run in enumerate(runs):
        if not isinstance(run, dict):
            raise ReportError(f"runs[{i}] must be an object, not {type(run).__name__}")
        if "row" not in run and "backend" in run:
            run = {**run, "row": run["backend"]}  # a document written before the key was renamed
        if not isinstance(run.get("row"), str) or not run["row"].strip():
            raise ReportError(f'runs[{i}] has no "row" name (a strategy, or floor)')
        named.append(run)
    return named


def with_floor_ratios(runs: list[dict]) -> list[dict]:
    """The runs, each with ``floor_ratio`` filled from the first floor row when the JSON lacks it."""
    floor_rps = next((figure(r, "rps") for r in runs if r["row"] == "floor" and figure(r, "rps")), None)
    filled = []
    for run in runs:
        if run["row"] != "floor" and figure(run, "floor_ratio") is None and floor_rps and figure(run, "rps"):
            run = {**run, "floor_ratio": figure(run, "rps") / floor_rps}
        filled.append(run)
    return filled


def batched(runs: list[dict]) -> bool:
    """True when some row of the document ran with purchases sharing sections (BATCH > 1)."""
    return any(isinstance(run.get("batch"), int) and run["batch"] > 1 for run in runs)


def row_label(run: dict, *, with_batch_1: bool = False) -> str:
    """The row's name (a strategy, or floor) with its BATCH size when purchases shared sections
    (``redis ×64``), and ``×1`` too when ``with_batch_1`` (a document where rows ran batched, so that
    ``db ×1`` and ``db ×64`` never read alike); ``shared`` after it when they queued in Redis
    (``redis ×64 shared``)."""
    batch = run.get("batch")
    if run["row"] == "floor" or isinstance(batch, bool) or not isinstance(batch, int):
        return run["row"]
    shared = " shared" if batch > 1 and run.get("queue") == "shared" else ""
    return run["row"] + (f" ×{batch}" if batch > 1 or (with_batch_1 and batch == 1) else "") + shared


#: A purchase's server time, part by part, as the row's ``breakdown`` keys them: queue, guard wait,
#: hold and outside follow one another (their sum is the total); the commit lies inside the hold.
BREAKDOWN_PARTS = ("queue_wait_ms", "lock_wait_ms", "lock_hold_ms", "outside_ms")


def breakdown_of(run: dict) -> dict | None:
    """The row's ``breakdown`` (means over the purchases whose section ran), each part a number
    (0.0 when missing), with ``locked``: whether its strategy took a lock. None when it has none."""
    found = run.get("breakdown")
    if not isinstance(found, dict) or not figure(found, "answers"):
        return None
    keys = (*BREAKDOWN_PARTS, "commit_ms", "sql_statements", "total_ms", "answers")
    parts = {key: max(figure(found, key) or 0.0, 0.0) for key in keys}
    # The statements' round trips, where the run measured them (None in an older document's).
    trips = figure(found, "sql_ms")
    return {**parts, "sql_ms": trips, "locked": timing(run, "lock_wait_ms", "p50") is not None}
