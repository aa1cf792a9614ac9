"""The burst runner behind ``manage.py flashsale``: one row of a comparison, start to audit.

:func:`run_row` resets the sale, starts ``plan.pods`` independent gunicorn instances ("pods",
each on its own free 127.0.0.1 port with its own workers and connection pools), HAProxy in front
of them with ``plan.balancer`` = ``"haproxy"``, warms every pod up (uncounted), starts one Locust
master and ``plan.locust_workers`` workers that each prepare their share of the shoppers
(``loadtests/locustfile.py``; the master opens the sale for all of them with one message), samples
stock, progress and PostgreSQL connections while it runs, stops every process it started (also on
error or Ctrl-C), reads the master's summary of the purchases, audits the database and stores a
:class:`~inventory.models.BurstRun`.

The floor is measured on every row's own pods: the row's shoppers first post to
``/api/products/<sku>/floor`` (the purchase request path without storage: it sells nothing), then,
on the same connections, buy. The row's ``floor_ratio`` is against that floor round, so a row is
never read against other pods, a colder start or a busier minute; :func:`floor_row` makes the
table's floor row from the best floor round of a command. A fault run has no floor round.

gunicorn gets the database, Redis and lock settings of *this* process explicitly in its
environment, so the burst hits the same database whether the command runs from a shell or
inside a pytest-django test (whose database is ``test_<name>``).

The plan, its error and the progress live in :mod:`loadtests.plan`, the row's processes (pods,
Locust, the connection sampler) in :mod:`loadtests.pods`; import each name from its own module.
"""

from __future__ import annotations

import tempfile
import time
from contextlib import nullcontext
from pathlib import Path
from typing import Callable

from django.conf import settings
from django.utils import timezone

from faults.demos import reset_product
from inventory.audit import audit
from inventory.models import BurstRun, Product
from processes.children import ChildError

from . import cpu
from .faultrun import FaultRun
from .figures import timeline, with_floor_ratio
from .judge import floor_problems, judge
from .plan import (
    FLOOR,
    SAMPLE_INTERVAL_S,
    BurstError,
    BurstPlan,
    Progress,
)
from .pods import (
    ConnectionSampler,
    RestartablePod,
    Row,
    database_url,
    read_json,
)
from .report.sentences import sentence


def prepare_product(*, sku: str, stock: int) -> Product:
    """The burst's own product, created if missing, on sale now with ``stock`` units and no orders."""
    return reset_product(sku=sku, name="Flash-burst phone", stock=stock, per_customer_limit=1)


def run_row(
    *,
    backend: str,
    plan: BurstPlan,
    floor: dict | None = None,
    on_progress: Callable[[Progress], None] | None = None,
) -> dict:
    """Run one row (a strategy, or ``"floor"``) of the comparison and return it (the JSON keys).

    A strategy's row runs its rounds on the same pods, shoppers and connections (:func:`row_rounds`):
    the floor endpoint (its ``floor`` figures, after an uncounted warm-up), then the purchase, and
    so ``plan.sales`` times, each sale of its own product. The row is its median sale by purchases
    per second (every sale audited and judged), its ``floor`` the best floor round, and its
    ``floor_ratio`` the one over the other, or against ``floor`` (an earlier floor row) when the
    row has none. With ``plan.fault`` the row runs one purchase round only, and the fault is
    injected once a third of its purchases have been answered and recovered after its hold
    (:mod:`loadtests.faultrun`).
    """
    for number in range(plan.sales):
        prepare_product(sku=plan.sale_sku(number), stock=plan.sale_stock)
    started_at = timezone.now()
    progress = Progress(backend=backend, requests=plan.requests, sales=len(sale_rounds(row_rounds(backend, plan))))
    faulted = fault_run(backend, plan)
    figures, peak_connections = run_processes(backend, plan, progress, faulted, on_progress)
    own_floor = figures.pop("floor_round", None)
    others = figures.pop("other_sales", [])
    row = record(
        backend=backend,
        plan=plan,
        figures=figures,
        started_at=started_at,
        peak_db_connections=peak_connections,
        floor=own_floor or floor,
        others=others,
    )
    row["floor"] = own_floor
    row["steps_s"] = progress.steps  # where the row's wall-clock time went
    # Combining (BATCH): the size asked for, the sections run and the sizes they had.
    row.update(batch=plan.batch, **{key: figures.get(key) for key in ("sections", "batch_p50", "batch_p99")})
    # Every sale's headline, and every floor round's rate: the spread behind the median and the best.
    row.update(sales=figures.get("sales") or [], floor_rounds_rps=figures.get("floor_rounds_rps") or [])
    return row


def floor_row(runs: list[dict]) -> dict | None:
    """The table's floor row: the best floor round among ``runs`` (each row measured its own, on
    its own pods, right before its purchases), or None when no row ran one."""
    measured = [run for run in runs if run.get("floor") and run["floor"].get("rps")]
    if not measured:
        return None
    best = max(measured, key=lambda run: run["floor"]["rps"])
    floor = best["floor"]
    counts = floor["status_counts"] or {}
    errors_5xx = sum(n for status, n in counts.items() if int(status) >= 500)
    # Its own judgement (a document's row from before it: every shopper answered, no 5xx, no transport error).
    problems = floor.get("problems")
    if problems is None:
        problems = floor_problems(floor, requests=floor["sent"])
    plan_keys = ("scenario", "fault", "fault_description", "fenced", "pods", "balancer", "server", "locust_workers")
    plan_keys += ("sizing",)
    return {
        **{key: best[key] for key in plan_keys},
        **{key: floor[key] for key in ("rps", "drain_s", "arrival_window_s", "p50_ms", "p95_ms", "p99_ms")},
        "row": FLOOR,
        "floor_of": best["row"],
        "yardstick": floor.get("yardstick"),
        "requests": floor["sent"],
        "status_counts": counts,
        "errors_5xx": errors_5xx,
        "transport_errors": counts.get("0", 0),
        "server_purchases": floor["server_posts"],
        "duration_s": floor["drain_s"],
        "sold_out_after_s": None,
        "floor_ratio": None,
        "invariants_ok": not problems,
        "problems": [f"{best['row']}'s floor round: {problem}" for problem in problems],
        **{key: 0 for key in ("orders", "oversold", "undersold", "lost", "busy", "conflicts", "retries")},
        **{key: 0 for key in ("constraint_hits", "client_retries", "transport_resends", "balancer_answers")},
        "locust_report": best["locust_report"],
        "stock_initial": best["stock_initial"],
        "stock_final": best["stock_initial"],
        **{key: floor[key] for key in ("server_timing", "timeline", "latency_histogram_ms")},
        "phases": [],
        "hold_p50": None,  # the floor takes no lock and runs no transaction
        "hold_p99": None,
        "breakdown": None,
        "cpu_ms": floor.get("cpu_ms"),
        "peak_db_connections": best["peak_db_connections"],  # the row's: its pods, both rounds
        "batch": 1,
        "queue": None,
    }


def row_rounds(backend: str, plan: BurstPlan) -> list[tuple[str, str]]:
    """The rounds a row's shoppers post, in order, as (endpoint, SKU): ``plan.sales`` sales, each of
    its own product (:meth:`BurstPlan.sale_sku`) and each right after a floor round on it; the
    purchase alone under a fault or with ``--no-floor``; the floor row, floor rounds only."""
    rounds = []
    for number in range(plan.sales if not plan.fault else 1):
        sku = plan.sale_sku(number)
        if backend == FLOOR:
            rounds.append(("floor", sku))
            continue
        if plan.floor_round and not plan.fault:
            rounds.append(("floor", sku))
        rounds.append(("purchase", sku))
    return rounds


def fault_run(backend: str, plan: BurstPlan) -> FaultRun | None:
    if not plan.fault or backend == FLOOR:
        return None
    return FaultRun(
        plan.fault,
        backend=backend,
        fenced=plan.fenced,
        requests=plan.requests,
        database_url=database_url(),
        sku=plan.sku,
        hold_s=plan.fault_hold_s,
    )


def run_processes(
    backend: str,
    plan: BurstPlan,
    progress: Progress,
    faulted: FaultRun | None,
    on_progress: Callable[[Progress], None] | None,
) -> tuple[dict, int | None]:
    """Start the row's pods and Locust, drive the sale, stop them all: (figures, peak connections)."""
    run_dir = Path(settings.RUN_DIR) / "burst"
    run_dir.mkdir(parents=True, exist_ok=True)
    env = {} if plan.fenced or backend == FLOOR else {"INVENTORY_FENCED": "0"}
    with tempfile.TemporaryDirectory(dir=run_dir) as scratch, faulted or nullcontext():
        row = Row(
            backend=backend,
            plan=plan,
            run_dir=run_dir,
            scratch=Path(scratch),
            env={**env, **(faulted.env if faulted else {})},
            rounds=row_rounds(backend, plan),
        )
        sampler = ConnectionSampler(database_url())
        sampler.start()
        since = [time.monotonic()]
        try:
            if on_progress:
                on_progress(progress)
            row.reserve_ports()
            row.start_locusts()  # Locust starts while the pods boot; it prepares nobody before row.go()
            row.start_pods()
            progress.meter = lambda: cpu.snapshot(row.cpu_roots())
            progress.step("pods", since)
            row.warm_up()
            progress.step("warm_up", since)
            row.go()
            if faulted:
                faulted.start(pod_pid=row.first_pod_pid, answered=row.answered, pod=RestartablePod(row, 0))
            drive(row, progress, on_progress, since)
            if faulted:
                faulted.finish()
            summary = read_json(row.summary_path)
            yardstick = row.yardstick() if plan.yardstick and not faulted else None
            if yardstick:
                progress.step("yardstick", since)
        except ChildError as exc:
            raise BurstError(str(exc)) from exc
        finally:
            progress.meter = None
            row.stop()
            peak_connections = sampler.stop()
            progress.step("stop", since)
        figures = row_figures(row, summary, progress, faulted)
        if yardstick is not None and figures.get("floor_round"):
            figures["floor_round"]["yardstick"] = yardstick
        return figures, peak_connections


def row_figures(row: Row, summary: dict | None, progress: Progress, faulted: FaultRun | None) -> dict:
    """The Locust master's figures of the row's median sale (its rounds' ``sale_rounds``, by
    purchases per second) with the server's count, the timeline and a fault's figures; the other
    sales' under ``other_sales`` (each to be audited), every sale's headline under ``sales``, and
    the best floor round's figures under ``floor_round`` if any ran."""
    if summary is None:
        raise BurstError(
            f"the Locust master exited with code {row.master.process.returncode} and no summary: "
            f"{row.master.log_tail()}; workers: {' | '.join(worker.log_tail(2) for worker in row.workers)}"
        )
    rounds = summary.get("rounds") or [summary]
    # A sale cut short (an error in the locustfile) leaves fewer rounds: its last one is judged.
    played = list(zip(row.rounds, rounds, strict=False))
    sales = [
        sale_figures(row, progress, number, endpoint, sku, summary=dict(figures))
        for number, ((endpoint, sku), figures) in enumerate(played)
        if endpoint == "purchase" or row.backend == FLOOR
    ]
    if not sales:
        number = len(played) - 1
        sales = [sale_figures(row, progress, number, *row.rounds[number], summary=dict(rounds[number]))]
    chosen = best_of(sales) if row.backend == FLOOR else median_of(sales)
    figures = dict(chosen)
    figures["other_sales"] = [sale for sale in sales if sale is not chosen]
    figures["sales"] = [sale_headline(sale) for sale in sales]
    floors = [(number, sku, floor) for number, ((endpoint, sku), floor) in enumerate(played) if endpoint == "floor"]
    if floors and row.backend != FLOOR:
        # Every floor round is judged, not only the best: a row's ×floor is read against one of them.
        figures["floor_problems"] = [
            f"floor round {sum(kind == 'floor' for kind, _ in row.rounds[: number + 1])}: {problem}"
            for number, _, floor in floors
            for problem in floor_problems(floor, requests=row.plan.requests)
        ]
        number, sku, best = max(floors, key=lambda found: found[2].get("rps") or 0)
        figures["floor_round"] = floor_figures(best, server_posts=row.server_purchases("floor", sku))
        figures["floor_round"]["problems"] = floor_problems(best, requests=row.plan.requests)
        figures["floor_round"]["cpu_ms"] = round_cpu(progress, number, best)
        figures["floor_rounds_rps"] = [round(floor.get("rps") or 0, 1) for _, _, floor in floors]
    if faulted:
        figures.update(faulted.figures(figures["purchases"], opened_at=progress.opened_at or 0.0))
    return figures


def sale_figures(row: Row, progress: Progress, number: int, endpoint: str, sku: str, *, summary: dict) -> dict:
    """Round ``number``'s figures as one sale: the master's summary, with its product, the POSTs
    its pods logged, its timeline and the Locust report it belongs to."""
    summary.pop("rounds", None)
    opened_at = summary.get("opened_at") or progress.opened_at or 0.0
    summary.update(
        sku=sku,
        sale=sum(kind == endpoint for kind, _ in row.rounds[: number + 1]),
        server_purchases=row.server_purchases(endpoint, sku),
        timeline=timeline(
            progress.samples_of(number),
            opened_at=opened_at,
            sent_times=summary["sent_times"],
            answer_times=summary["answer_times"],
        ),
        locust_report=f"{row.locust_report}.html",
        cpu_ms=round_cpu(progress, number, summary),
    )
    return summary


def round_cpu(progress: Progress, number: int, summary: dict) -> dict | None:
    """Round ``number``'s CPU a request by process group (:mod:`loadtests.cpu`): from its opening
    to its end, over its answered requests; None without the two snapshots."""
    at = progress.cpu_at
    return cpu.per_request(at.get(f"countdown_{number}"), at.get(f"round_{number}"), summary.get("answered") or 0)


def sale_rounds(rounds: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """The rounds that are sales: the purchase rounds, or the floor's own rounds on the floor row."""
    purchases = [one for one in rounds if one[0] == "purchase"]
    return purchases or rounds


def median_of(sales: list[dict]) -> dict:
    """The sale with the median purchases per second (the lower middle one for an even count)."""
    return sorted(sales, key=lambda sale: sale.get("rps") or 0)[(len(sales) - 1) // 2]


def best_of(sales: list[dict]) -> dict:
    return max(sales, key=lambda sale: sale.get("rps") or 0)


def sale_headline(sale: dict) -> dict:
    """What the row keeps of each of its sales: enough to show their spread."""
    return {key: sale.get(key) for key in ("sale", "sku", "rps", "drain_s", "sold_out_after_s", "arrival_window_s")}


def floor_figures(summary: dict, *, server_posts: int) -> dict:
    """What a row keeps of its floor round: enough to read the row against it (and to build the
    floor row of the table from the best one)."""
    kept = ("sent", "answered", "rps", "drain_s", "arrival_window_s", "p50_ms", "p95_ms", "p99_ms", "status_counts")
    opened_at = summary.get("opened_at") or 0.0
    last = max(summary.get("answer_times") or [opened_at])
    steps = int((last - opened_at) / SAMPLE_INTERVAL_S) + 2
    samples = [(opened_at + k * SAMPLE_INTERVAL_S, k * SAMPLE_INTERVAL_S, None) for k in range(steps)]
    return {
        **{key: summary.get(key) for key in kept},
        "server_posts": server_posts,
        "server_timing": summary.get("server_timing") or {},
        "latency_histogram_ms": summary.get("latency_histogram_ms") or [],
        "timeline": timeline(
            samples, opened_at=opened_at, sent_times=summary["sent_times"], answer_times=summary["answer_times"]
        ),
    }


def drive(
    row: Row, progress: Progress, on_progress: Callable[[Progress], None] | None, since: list[float] | None = None
) -> None:
    """Follow the Locust master: preparation, the floor round, the opening of the last round, the
    burst, its exit; each step's seconds noted in ``progress.steps`` as it ends."""
    began = time.monotonic()
    since = since or [began]
    while True:
        report = row.progress_report()
        note_steps(progress, report, since)
        # The summary is written before the master quits (it then writes Locust's own reports).
        progress.finished = not row.master.running() or row.summary_path.exists()
        progress.prepared = report.get("prepared", 0)
        progress.sent, progress.answered = report.get("sent", 0), report.get("answered", 0)
        number = report.get("round", 0)
        endpoint, sku = row.rounds[min(number, len(row.rounds) - 1)]
        opened_at = report.get("opened_at")
        progress.sale = sum(kind == "purchase" for kind, _ in row.rounds[: number + 1])
        if opened_at is None or report.get("phase") not in ("open", "done", "ended"):
            if waiting_gave_up(row, progress, report, began):
                return
        elif endpoint == "floor":
            progress.phase = "floor"
        else:
            sample_burst(row, progress, opened_at, number=number, sku=sku)
        if progress.finished:
            note_the_end(progress, len(row.rounds), since)
        if on_progress:
            on_progress(progress)
        if progress.finished:
            return
        time.sleep(SAMPLE_INTERVAL_S)


def note_the_end(progress: Progress, rounds: int, since: list[float]) -> None:
    """The master has written its summary (or quit): every round that opened has ended. A report
    read just before the master's last one still says the last round is open; its end, and its
    closing CPU snapshot, are noted here then (before, that round had no CPU figures)."""
    for number in range(rounds):
        if f"countdown_{number}" in progress.steps and f"round_{number}" not in progress.steps:
            progress.step(f"round_{number}", since)


def note_steps(progress: Progress, report: dict, since: list[float]) -> None:
    """Shoppers prepared (the first countdown began), each round's countdown and each round's end."""
    number, phase = report.get("round", 0), report.get("phase")
    opened = phase in ("open", "done", "ended")
    steps = progress.steps
    if (phase == "countdown" or opened or number) and "prepare" not in steps:
        progress.step("prepare", since)
    for ended in range(number):
        if f"round_{ended}" not in steps:
            progress.step(f"round_{ended}", since)
    if opened and f"countdown_{number}" not in steps:
        progress.step(f"countdown_{number}", since)
    if phase in ("done", "ended") and f"round_{number}" not in steps:
        progress.step(f"round_{number}", since)
    if phase == "countdown" and progress.meter is not None:
        # The round's opening CPU snapshot is the last look before it opens: a round shorter than a
        # sample (300 floor requests take 0.1 s on a fast machine) may open and end between two looks.
        progress.cpu_at[f"countdown_{number}"] = progress.meter()


def waiting_gave_up(row: Row, progress: Progress, report: dict, began: float) -> bool:
    """Before the last round opens: True when a process gave up (its summary says why); a
    preparation over its time limit is an error."""
    plan = row.plan
    if progress.finished or any(not worker.running() for worker in row.workers):
        return True
    if time.monotonic() - began > plan.prepare_timeout_s + plan.timeout_s * (len(row.rounds) - 1):
        raise BurstError(
            f"preparing {plan.requests} shoppers took over {plan.prepare_timeout_s:.0f}s "
            f"({progress.prepared} ready); see {row.master.log_path}"
        )
    opens_at = report.get("opens_at")
    progress.phase = "countdown" if opens_at else "preparing"
    progress.opens_in_s = max(0.0, opens_at - time.time()) if opens_at else 0.0
    return False


def sample_burst(row: Row, progress: Progress, opened_at: float, *, number: int, sku: str) -> None:
    """Round ``number``, a sale of ``sku``, is open: a sample of its stock (its timeline), and the time limit."""
    now = time.time()
    progress.opened_at = opened_at
    progress.phase = "burst"
    progress.elapsed_s = now - opened_at
    progress.stock = Product.objects.filter(sku=sku).values_list("stock", flat=True).first()
    progress.samples_of(number).append((now, progress.elapsed_s, progress.stock))
    if progress.elapsed_s > row.plan.timeout_s + 30:
        raise BurstError(f"locust still running after {progress.elapsed_s:.0f}s; see {row.master.log_path}")


def record(
    *,
    backend: str,
    plan: BurstPlan,
    figures: dict,
    started_at,
    peak_db_connections: int | None,
    floor: dict | None,
    others: list[dict] = (),
) -> dict:
    """Audit the database (not for the floor) after every sale of the row, judge the invariants of
    each, store the BurstRun of the row (its median sale ``figures``, with that sale's own audit)
    with the report's sentence for it, return the row. A problem of any sale is the row's; its
    audit (stock before and after, orders, oversold, undersold and lost units) is that of all its
    sales, so that its orders less the units that left the shelf are its oversold units."""
    report, errors_5xx, mine = judged(backend, plan, figures)
    own = audited(report, plan)
    totals = dict(own)
    problems = [f"sale {figures['sale']}: {problem}" for problem in mine] if others else list(mine)
    problems += figures.get("floor_problems", [])
    for other in others:
        other_report, _, theirs = judged(backend, plan, other)
        problems += [f"sale {other['sale']}: {problem}" for problem in theirs]
        for key, value in audited(other_report, plan).items():
            totals[key] += value
    row = {
        "row": backend,
        "scenario": plan.scenario,
        "fault": figures.get("fault"),
        "fault_description": figures.get("fault_description"),
        "fenced": plan.fenced,
        "pods": plan.pods,
        "balancer": plan.balancer,
        "server": plan.server,
        "queue": plan.queue if plan.batch > 1 else None,  # a BATCH=1 row queues nowhere
        "locust_workers": plan.locust_workers,
        **totals,
        "errors_5xx": errors_5xx,
        "invariants_ok": not problems,
        "problems": problems,
        "peak_db_connections": peak_db_connections,
        "floor_ratio": None,
        "sold_out_after_s": figures["sold_out_after_s"] if backend != FLOOR else None,
        **{key: figures.get(key) for key in ROW_FIGURES},
        "requests": figures["sent"],
        "phases": figures.get("phases", []),
        "sizing": sizing(plan),
    }
    with_floor_ratio(row, floor)
    if report is not None:
        store({**row, **own}, plan=plan, figures=figures, started_at=started_at)
    return row


def judged(backend: str, plan: BurstPlan, figures: dict) -> tuple:
    """One sale's audit (None for the floor, which sells nothing), its server errors (5xx but the
    503s that said busy) and its problems."""
    sku = figures.get("sku", plan.sku)
    report = None if backend == FLOOR else audit(sku=sku, told_sold_out=figures["outcomes"].get("sold_out", 0))
    errors_5xx = sum(n for status, n in figures["status_counts"].items() if int(status) >= 500) - figures["busy"]
    return report, errors_5xx, judge(backend=backend, plan=plan, figures=figures, report=report, errors_5xx=errors_5xx)


#: The Locust master's figures a row carries as they are (None when a run has no such figure).
ROW_FIGURES = (
    "status_counts",
    "rps",
    "p50_ms",
    "p95_ms",
    "p99_ms",
    "duration_s",
    "server_purchases",
    "conflicts",
    "retries",
    "constraint_hits",
    "client_retries",
    "transport_resends",
    "balancer_answers",
    "busy",
    "arrival_window_s",
    "drain_s",
    "transport_errors",
    "server_timing",
    "hold_p50",
    "hold_p99",
    "breakdown",
    "max_lock_wait_ms",
    "resumed_after_s",
    "longest_gap_s",
    "paused_into_section_ms",
    "kills",
    "lock_timeout_ms",
    "locust_report",
    "timeline",
    "latency_histogram_ms",
    "cpu_ms",
)


def audited(report, plan: BurstPlan) -> dict:
    """The database's audit of the row (the floor's: its stock untouched, nothing sold)."""
    return {
        "stock_initial": report.initial if report else plan.sale_stock,
        "stock_final": report.stock if report else plan.sale_stock,
        "orders": report.orders if report else 0,
        "oversold": report.oversold if report else 0,
        "undersold": report.undersold if report else 0,
        "lost": report.lost if report else 0,
    }


def sizing(plan: BurstPlan) -> dict:
    """How the row was sized: Locust workers, gunicorn workers and threads, pools, shoppers, and a
    batched row's linger (``INVENTORY_BATCH_LINGER_MS``, which its pods inherit; None at BATCH 1)."""
    return {
        "locust_workers": plan.locust_workers,
        "workers": plan.workers,
        "threads": plan.threads,
        "pool_max_size": plan.pool_max_size,
        "pool_timeout_s": plan.pool_timeout_s,
        "users": plan.requests if plan.scenario == "spike" else plan.users,
        "batch_linger_ms": batch_linger_ms() if plan.batch > 1 else None,
    }


def batch_linger_ms() -> int:
    """``INVENTORY_BATCH_LINGER_MS`` as this process reads it: the batched rows' pods inherit it."""
    return settings.INVENTORY["OPTIONS"].get("BATCH_LINGER_MS") or 0


#: The run's figures a BurstRun keeps: its fields, but for those ``store`` fills in itself.
STORED_FIGURES = [
    field.name
    for field in BurstRun._meta.concrete_fields
    if field.name not in {"id", "started_at", "sku", "strategy", "timeline", "sentence"}
]


#: What a row of a document written before a key existed stands for (every such run was on WSGI).
OLDER_ROWS_LACK = {"server": "wsgi"}


def store(row: dict, *, plan: BurstPlan, figures: dict, started_at) -> None:
    """Keep the audited row as a :class:`~inventory.models.BurstRun` (the admin's history)."""
    BurstRun.objects.create(
        started_at=started_at,
        sku=figures.get("sku", plan.sku),
        strategy=row["row"],
        timeline=figures["timeline"],
        sentence=sentence(row),
        **{
            name: row.get(name, OLDER_ROWS_LACK[name]) if name in OLDER_ROWS_LACK else row[name]
            for name in STORED_FIGURES
        },
    )
