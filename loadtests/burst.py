"""The burst runner behind ``manage.py flashsale``: one row of a comparison, start to audit.

:func:`run_row` resets the sale, starts ``plan.pods`` independent gunicorn instances ("pods",
each on its own free 127.0.0.1 port with its own workers and connection pools), HAProxy in front
of them with ``plan.balancer`` = ``"haproxy"``, one Locust master and ``plan.locust_workers``
workers that each prepare their share of the shoppers (``loadtests/locustfile.py``; the master
opens the sale for all of them with one message), samples stock, progress and PostgreSQL
connections while it runs, stops every process it started (also on error or Ctrl-C), reads the
master's summary of the purchases, audits the database and stores a
:class:`~inventory.models.BurstRun`.

The floor row (``backend="floor"``) runs the same shoppers against ``/api/products/<sku>/floor``,
the purchase request path without storage: it sells nothing and is not audited.

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

from .faultrun import FaultRun
from .figures import timeline, with_floor_ratio
from .judge import judge
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
    """Run one row (a strategy, or ``"floor"``) of the comparison and return it (the JSON keys);
    ``floor`` is this round's floor row, if one ran, for ``floor_ratio``.

    With ``plan.fault`` (not for the floor), the fault is injected into the row once a third of
    its purchases have been answered and recovered after its hold (:mod:`loadtests.faultrun`).
    """
    prepare_product(sku=plan.sku, stock=plan.sale_stock)
    started_at = timezone.now()
    run_dir = Path(settings.RUN_DIR) / "burst"
    run_dir.mkdir(parents=True, exist_ok=True)
    progress = Progress(backend=backend, requests=plan.requests)
    faulted = None
    if plan.fault and backend != FLOOR:
        faulted = FaultRun(
            plan.fault,
            backend=backend,
            fenced=plan.fenced,
            requests=plan.requests,
            database_url=database_url(),
            hold_s=plan.fault_hold_s,
        )
    env = {} if plan.fenced or backend == FLOOR else {"INVENTORY_FENCED": "0"}
    with tempfile.TemporaryDirectory(dir=run_dir) as scratch, faulted or nullcontext():
        row = Row(
            backend=backend,
            plan=plan,
            run_dir=run_dir,
            scratch=Path(scratch),
            env={**env, **(faulted.env if faulted else {})},
        )
        sampler = ConnectionSampler(database_url())
        sampler.start()
        try:
            if on_progress:
                on_progress(progress)
            row.start_pods()
            row.start_locusts()
            if faulted:
                faulted.start(pod_pid=row.first_pod_pid, answered=row.answered, pod=RestartablePod(row, 0))
            drive(row, progress, on_progress)
            if faulted:
                faulted.finish()
            summary = read_json(row.summary_path)
        except ChildError as exc:
            raise BurstError(str(exc)) from exc
        finally:
            row.stop()
            peak_connections = sampler.stop()
        figures = row_figures(row, summary, progress, faulted)
    row = record(
        backend=backend,
        plan=plan,
        figures=figures,
        started_at=started_at,
        peak_db_connections=peak_connections,
        floor=floor,
    )
    # Combining (BATCH): the size asked for, the sections run and the sizes they had.
    row.update(batch=plan.batch, **{key: figures.get(key) for key in ("sections", "batch_p50", "batch_p99")})
    return row


def row_figures(row: Row, summary: dict | None, progress: Progress, faulted: FaultRun | None) -> dict:
    """The Locust master's summary, with the server's count, the timeline and a fault's figures."""
    if summary is None:
        raise BurstError(
            f"the Locust master exited with code {row.master.process.returncode} and no summary: "
            f"{row.master.log_tail()}; workers: {' | '.join(worker.log_tail(2) for worker in row.workers)}"
        )
    figures = dict(summary)
    figures["server_purchases"] = row.server_purchases()
    figures["timeline"] = timeline(
        progress.samples,
        opened_at=progress.opened_at or 0.0,
        sent_times=figures["sent_times"],
        answer_times=figures["answer_times"],
    )
    figures["locust_report"] = f"{row.locust_report}.html"
    if faulted:
        figures.update(faulted.figures(figures["purchases"], opened_at=progress.opened_at or 0.0))
    return figures


def drive(row: Row, progress: Progress, on_progress: Callable[[Progress], None] | None) -> None:
    """Follow the Locust master: preparation, the opening it announces, the burst, its exit."""
    plan = row.plan
    began = time.monotonic()
    while True:
        report = row.progress_report()
        progress.finished = not row.master.running()
        progress.prepared = report.get("prepared", 0)
        progress.sent, progress.answered = report.get("sent", 0), report.get("answered", 0)
        progress.opened_at = report.get("opened_at")
        if progress.opened_at is None:
            if progress.finished or any(not worker.running() for worker in row.workers):
                return  # a process gave up while preparing; the summary (or its absence) says why
            if time.monotonic() - began > plan.prepare_timeout_s:
                raise BurstError(
                    f"preparing {plan.requests} shoppers took over {plan.prepare_timeout_s:.0f}s "
                    f"({progress.prepared} ready); see {row.master.log_path}"
                )
            opens_at = report.get("opens_at")
            progress.phase = "countdown" if opens_at else "preparing"
            progress.opens_in_s = max(0.0, opens_at - time.time()) if opens_at else 0.0
        else:
            now = time.time()
            progress.phase = "burst"
            progress.elapsed_s = now - progress.opened_at
            progress.stock = Product.objects.filter(sku=plan.sku).values_list("stock", flat=True).first()
            progress.samples.append((now, progress.elapsed_s, progress.stock))
            if progress.elapsed_s > plan.timeout_s + 30:
                raise BurstError(f"locust still running after {progress.elapsed_s:.0f}s; see {row.master.log_path}")
        if on_progress:
            on_progress(progress)
        if progress.finished:
            return
        time.sleep(SAMPLE_INTERVAL_S)


def record(
    *, backend: str, plan: BurstPlan, figures: dict, started_at, peak_db_connections: int | None, floor: dict | None
) -> dict:
    """Audit the database (not for the floor), judge the invariants, store the BurstRun with the
    report's sentence for it, return the row."""
    # The floor sells nothing: there is nothing to audit.
    report = None if backend == FLOOR else audit(sku=plan.sku, told_sold_out=figures["outcomes"].get("sold_out", 0))
    busy = figures["busy"]
    errors_5xx = sum(n for status, n in figures["status_counts"].items() if int(status) >= 500) - busy
    problems = judge(backend=backend, plan=plan, figures=figures, report=report, errors_5xx=errors_5xx)
    counts = figures["status_counts"]
    row = {
        "backend": backend,
        "scenario": plan.scenario,
        "fault": figures.get("fault"),
        "fault_description": figures.get("fault_description"),
        "fenced": plan.fenced,
        "pods": plan.pods,
        "balancer": plan.balancer,
        "locust_workers": plan.locust_workers,
        "requests": figures["sent"],
        "stock_initial": report.initial if report else plan.sale_stock,
        "stock_final": report.stock if report else plan.sale_stock,
        "orders": report.orders if report else 0,
        "oversold": report.oversold if report else 0,
        "undersold": report.undersold if report else 0,
        "lost": report.lost if report else 0,
        "status_counts": counts,
        "errors_5xx": errors_5xx,
        "rps": figures["rps"],
        "p50_ms": figures["p50_ms"],
        "p95_ms": figures["p95_ms"],
        "p99_ms": figures["p99_ms"],
        "duration_s": figures["duration_s"],
        "invariants_ok": not problems,
        "problems": problems,
        "server_purchases": figures["server_purchases"],
        "conflicts": figures["conflicts"],
        "retries": figures["retries"],
        "constraint_hits": figures["constraint_hits"],
        "client_retries": figures["client_retries"],
        "transport_resends": figures["transport_resends"],
        "balancer_answers": figures["balancer_answers"],
        "busy": busy,
        "arrival_window_s": figures["arrival_window_s"],
        "drain_s": figures["drain_s"],
        "sold_out_after_s": figures["sold_out_after_s"] if backend != FLOOR else None,
        "transport_errors": figures["transport_errors"],
        "peak_db_connections": peak_db_connections,
        "floor_ratio": None,
        "server_timing": figures["server_timing"],
        "max_lock_wait_ms": figures["max_lock_wait_ms"],
        "phases": figures.get("phases", []),
        **{key: figures.get(key) for key in ("resumed_after_s", "longest_gap_s", "kills", "lock_timeout_ms")},
        "locust_report": figures["locust_report"],
        "timeline": figures["timeline"],
        "latency_histogram_ms": figures["latency_histogram_ms"],
        "sizing": sizing(plan),
    }
    with_floor_ratio(row, floor)
    if report is not None:
        store(row, plan=plan, figures=figures, started_at=started_at)
    return row


def sizing(plan: BurstPlan) -> dict:
    """How the row was sized: Locust workers, gunicorn workers and threads, pools, shoppers."""
    return {
        "locust_workers": plan.locust_workers,
        "workers": plan.workers,
        "threads": plan.threads,
        "pool_max_size": plan.pool_max_size,
        "pool_timeout_s": plan.pool_timeout_s,
        "users": plan.requests if plan.scenario == "spike" else plan.users,
    }


#: The run's figures a BurstRun keeps: its fields, but for those ``store`` fills in itself.
STORED_FIGURES = [
    field.name
    for field in BurstRun._meta.concrete_fields
    if field.name not in {"id", "started_at", "sku", "timeline", "sentence"}
]


def store(row: dict, *, plan: BurstPlan, figures: dict, started_at) -> None:
    """Keep the audited row as a :class:`~inventory.models.BurstRun` (the admin's history)."""
    BurstRun.objects.create(
        started_at=started_at,
        sku=plan.sku,
        timeline=figures["timeline"],
        sentence=sentence(row),
        **{name: row[name] for name in STORED_FIGURES},
    )
