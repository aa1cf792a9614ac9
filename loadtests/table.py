"""The table ``manage.py flashsale`` prints: one row per run, a fault run's phases under it, the ratio to the floor."""

from __future__ import annotations

from loadtests.plan import FLOOR

from . import cpu
from .report.sentences import ARTICLE_CLAIM

COLUMNS = [
    ("row", 11),
    ("via", 7),
    ("server", 6),
    ("requests", 8),
    ("2xx", 5),
    ("409", 5),
    ("503", 4),
    ("5xx", 3),
    ("net", 3),
    ("stock", 5),
    ("orders", 6),
    ("oversold", 8),
    ("undersold", 9),
    ("window s", 8),
    ("drain s", 7),
    ("sold out s", 10),
    ("rps", 6),
    ("×floor", 6),
    ("floor s", 7),
    ("yard s", 6),
    ("p50 ms", 6),
    ("p99 ms", 6),
    ("lock p99", 8),
    ("hold p50", 8),
    ("db p99", 6),
    ("conns", 5),
    ("batch", 5),
    ("queue", 6),
    ("b p50", 5),
    ("sections", 8),
    ("ok", 3),
]


def table_row(values: list) -> str:
    cells = ("-" if value is None else str(value) for value in values)
    return "  ".join(
        cell.rjust(width) if i else cell.ljust(width)
        for i, ((_, width), cell) in enumerate(zip(COLUMNS, cells, strict=False))
    )


def fixed(value, digits: int = 0):
    return None if value is None else f"{value:.{digits}f}"


def run_cells(run: dict) -> list:
    counts = run["status_counts"]
    floor = run["row"] == FLOOR
    timing = run.get("server_timing") or {}
    return [
        run["row"] + (f" #{run['round']}" if run.get("round") else ""),
        run.get("balancer", "none"),
        run.get("server", "wsgi"),  # an older document's rows all ran under gunicorn's threads
        run["requests"],
        sum(n for status, n in counts.items() if status.startswith("2")),
        counts.get("409", 0),
        counts.get("503", 0),
        run["errors_5xx"],
        run["transport_errors"],
        None if floor else run["stock_final"],
        None if floor else run["orders"],
        None if floor else run["oversold"],
        None if floor else run["undersold"],
        fixed(run["arrival_window_s"], 2),
        fixed(run["drain_s"], 2),
        fixed(run["sold_out_after_s"], 2),
        fixed(run["rps"]),
        fixed(run["floor_ratio"], 2),
        fixed((run.get("floor") or {}).get("drain_s") if not floor else run["drain_s"], 2),
        fixed(((run.get("floor") or {}).get("yardstick") or run.get("yardstick") or {}).get("drain_s"), 2),
        fixed(run["p50_ms"]),
        fixed(run["p99_ms"]),
        fixed((timing.get("lock_wait_ms") or {}).get("p99"), 1),
        fixed(run.get("hold_p50"), 1),
        fixed((timing.get("db_ms") or {}).get("p99"), 1),
        run["peak_db_connections"],
        None if floor else run.get("batch"),
        run.get("queue"),
        fixed(run.get("batch_p50")),
        run.get("sections"),
        "yes" if run["invariants_ok"] else "NO",
    ]


def hot_row_cells(shape: dict) -> list:
    """A hot-row limit shape (:mod:`loadtests.hotrow`) as a table row: its purchases asked, sold
    (``2xx``) and refused (``409``), the audit, its seconds (``drain s``), purchases/s, connections
    (``conns``) and purchases per commit (``batch``); the HTTP columns stay empty."""
    cells = {
        "row": shape["name"],
        "via": "psycopg",
        "requests": shape["purchases"],
        "2xx": shape["sold"],
        "409": shape["refused"],
        "stock": shape["stock_final"],
        "orders": shape["orders"],
        "oversold": shape["oversold"],
        "drain s": fixed(shape["seconds"], 2),
        "rps": fixed(shape["rps"]),
        "conns": shape["connections"],
        "batch": shape["batch"],
        "sections": shape["commits"],
        "ok": "yes" if shape["ok"] else "NO",
    }
    return [cells.get(title) for title, _ in COLUMNS]


def steps_line(run: dict) -> str | None:
    """Where the row's wall-clock time went: ``  time: pods 2.1 s, warm_up 0.4 s, ...``."""
    steps = run.get("steps_s")
    if not steps:
        return None
    total = sum(steps.values())
    return "  time: " + ", ".join(f"{name} {seconds:.1f}" for name, seconds in steps.items()) + f" (s; {total:.1f} s)"


def sales_line(run: dict) -> str | None:
    """A row that sold more than once: each sale's purchases/s, the floor rounds' and the ratio's range:
    ``  sales: 1231, 1187, 1302/s (median 1231); floor rounds 2247, 2101, 2190/s (best 2247); ×floor 0.53-0.62``."""
    sales = [sale["rps"] for sale in run.get("sales") or [] if sale.get("rps")]
    if len(sales) < 2:
        return None
    line = f"  sales: {', '.join(f'{rps:.0f}' for rps in sales)}/s (median {run['rps']:.0f})"
    floors = run.get("floor_rounds_rps") or []
    if floors:
        line += f"; floor rounds {', '.join(f'{rps:.0f}' for rps in floors)}/s (best {max(floors):.0f})"
        line += f"; ×floor {min(sales) / max(floors):.2f}-{max(sales) / max(floors):.2f}"
    return line


def breakdown_line(run: dict) -> str | None:
    """Where the server time of the row's purchases went (means over those whose section ran):
    ``  server ms: queue 1.2 + lock 3.4 + hold 5.6 (commit 0.3, 7 SQL in 2.5) + outside 2.1 = 12.3 (mean of
    300)``: the hold's SQL messages took 2.5 ms of round trips (an older run's breakdown has no such figure)."""
    parts = run.get("breakdown")
    if not parts:
        return None
    trips = f" in {parts['sql_ms']:.1f}" if parts.get("sql_ms") is not None else ""
    return (
        f"  server ms: queue {parts['queue_wait_ms']:.1f} + lock {parts['lock_wait_ms']:.1f} + hold "
        f"{parts['lock_hold_ms']:.1f} (commit {parts['commit_ms']:.1f}, {parts['sql_statements']:g} SQL{trips}) "
        f"+ outside {parts['outside_ms']:.1f} = {parts['total_ms']:.1f} (mean of {parts['answers']})"
    )


def cpu_line(run: dict) -> str | None:
    """What a request of the row's median sale cost in CPU, by process group (:mod:`loadtests.cpu`),
    beside its floor round's: ``  cpu ms a request: pods 1.83 + postgres 0.33 + locust 0.30 = 2.46;
    floor round 1.67 (pods 1.39 + locust 0.28): 1.47×``. On cores the two rounds keep busy, ×floor
    is about one over that last figure."""
    cost = run.get("cpu_ms")
    if not cost:
        return None
    line = f"  cpu ms a request: {_cpu_parts(cost)} = {cost['total']:.2f}"
    floor = (run.get("floor") or {}).get("cpu_ms")
    if floor and floor.get("total"):
        line += f"; floor round {floor['total']:.2f} ({_cpu_parts(floor)}): {cost['total'] / floor['total']:.2f}×"
    return line


def _cpu_parts(cost: dict) -> str:
    return " + ".join(f"{group} {cost[group]:.2f}" for group in cpu.ORDER if group in cost)


def phase_lines(run: dict) -> list[str]:
    """A fault run's phases under its row: seconds since the opening, final statuses and p99 of the
    purchases sent in it, the 503 answers received in it; then the longest lock wait, how soon
    sales resumed and the longest gap between sales after that."""
    lines = [f"  {run['fault']}: {run['fault_description']}"] if run.get("fault_description") else []
    for phase in run.get("phases") or []:
        counts = " ".join(f"{status}×{n}" for status, n in phase["status_counts"].items()) or "no purchases"
        lines.append(
            f"  {phase['name']:>6} {phase['start_s']:5.2f}–{phase['end_s']:5.2f} s  {counts}  "
            f"p99 {phase['p99_ms']:.0f} ms  503 answers {phase.get('busy_answers', 0)}"
        )
    for number, kill in enumerate(run.get("kills") or [], start=1):
        stalled = kill["stalled_s"]
        lines.append(
            f"  kill {number}: worker {kill['pid']} {'inside' if kill['holder'] else 'NOT inside'} its section; "
            f"stalled_s {'never resumed' if stalled is None else f'{stalled:.2f}'}; freed by {kill['freed_by']}"
        )
    if run.get("fault"):
        resumed = run.get("resumed_after_s")
        wait = run.get("max_lock_wait_ms")
        gap = run.get("longest_gap_s")
        lines.append(
            f"  {run['fault']}: longest lock wait {'-' if wait is None else f'{wait:.0f}'} ms, sales resumed "
            f"{'never' if resumed is None else f'{resumed:.2f} s'} after the recovery"
            + ("" if gap is None else f", longest gap without a sale from 1 s after it {gap:.2f} s")
        )
    return lines


def holder_note(runs: list[dict]) -> list[str]:
    """kill-holder's closing note: the article's claim beside each strategy's measured stalls and the
    timeout that bounds them, and how to shorten them."""
    killed = [run for run in runs if run.get("kills") is not None]
    if not killed:
        return []
    lines = [
        f'the article: "{ARTICLE_CLAIM}" Measured, seconds from each SIGKILL to the first order committed after it:'
    ]
    for run in killed:
        stalls = ", ".join("never" if k["stalled_s"] is None else f"{k['stalled_s']:.2f}" for k in run["kills"])
        timeout = run.get("lock_timeout_ms")
        bound = "no timeout: the row lock goes with the connection" if timeout is None else f"timeout {timeout} ms"
        lines.append(f"  {run['row']:<10} stalled_s {stalls or 'no kill'}  ({bound})")
    lines.append(
        "  released after the TTL, lease or session timeout, not at the disconnect (db excepted): shorten it "
        "(LOCK_TTL_MS; a short TTL kept alive by a watchdog) and a paused holder loses its lock sooner"
    )
    return lines
