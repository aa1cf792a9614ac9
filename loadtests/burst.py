"""The burst runner behind ``manage.py flashsale``: one row of a comparison, start to audit.

:func:`run_row` resets the sale, starts ``plan.pods`` independent gunicorn instances ("pods",
each on its own free 127.0.0.1 port with its own workers and connection pools), starts
``plan.locust_processes`` Locust processes that each prepare their own share of the shoppers
(``loadtests/locustfile.py``), opens the sale for all of them at one wall-clock moment, samples
stock, progress and PostgreSQL connections while it runs, stops every process it started (also on
error or Ctrl-C), merges the processes' summaries (``loadtests/figures.py``), audits the database
and stores a :class:`~inventory.models.BurstRun`.

The floor row (``backend="floor"``) runs the same shoppers against ``/api/products/<sku>/floor``,
the purchase request path without storage: it sells nothing and is not audited.

gunicorn gets the database, Redis and lock settings of *this* process explicitly in its
environment, so the burst hits the same database whether the command runs from a shell or
inside a pytest-django test (whose database is ``test_<name>``).
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import tempfile
import threading
import time
from contextlib import nullcontext
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Callable
from urllib.parse import quote, urlencode

import psycopg
from django.conf import settings
from django.db import connection
from django.utils import timezone

from inventory.backends import strategy_class
from inventory.models import BurstRun, Product
from inventory.services import audit, reset_sale

from .faultrun import FaultRun
from .figures import merge, timeline
from .judge import judge
from .processes import Child, ChildError, free_port, stop_all, wait_until_answers

LOCUSTFILE = Path(__file__).resolve().parent / "locustfile.py"
FLOOR = "floor"
SCENARIOS = ("spike", "deep", "flash")
SAMPLE_INTERVAL_S = 0.25
CONNECTION_SAMPLE_INTERVAL_S = 0.05
#: Shoppers one Locust process releases within the arrival target on this machine (measured).
SHOPPERS_PER_PROCESS = 2500
#: The pods run at a lower CPU priority than the Locust processes: on one machine they share the
#: cores, and a server that takes the CPU from its own load generator slows the spike it is measured
#: by. On separate machines (as in production) the two never compete; this approximates that.
POD_NICE = 5
#: Seconds a shopper's preparation may take at most, on top of a fixed allowance.
PREPARE_ALLOWANCE_S, PREPARE_PER_SHOPPER_S = 60.0, 0.02


class BurstError(RuntimeError):
    """The burst could not be run (a process did not start, a service is missing)."""


@dataclass(frozen=True)
class BurstPlan:
    requests: int
    stock: int
    scenario: str = "spike"
    sku: str = "flash-burst"
    pods: int = 1
    users: int = 100  # closed-loop concurrency (deep, flash), across all Locust processes
    workers: int = 4
    threads: int = 4
    pool_max_size: int = 4  # connections per gunicorn worker process
    pool_timeout_s: float = 1.0
    locust_processes: int = 1
    max_retries: int = 3
    countdown_s: float = 1.0
    timeout_s: float = 180.0
    fault: str | None = None  # a name of inventory.faults.FAULT_NAMES, injected into every row
    fenced: bool = True  # False: the pods run with INVENTORY_FENCED=0 (the storage check off)

    @property
    def sale_stock(self) -> int:
        """Units on sale: ``deep`` puts one on the shelf per purchase, so every purchase reaches the strategy."""
        return self.requests if self.scenario == "deep" else self.stock

    @property
    def prepare_timeout_s(self) -> float:
        return PREPARE_ALLOWANCE_S + PREPARE_PER_SHOPPER_S * self.requests


def default_locust_processes(*, scenario: str, requests: int) -> int:
    """Enough processes for the spike to leave within its target; one for the closed loops."""
    return max(1, math.ceil(requests / SHOPPERS_PER_PROCESS)) if scenario == "spike" else 1


@dataclass
class Progress:
    """What the live progress line shows; handed to the caller's callback every sample."""

    backend: str
    requests: int
    phase: str = "starting"  # starting, preparing, countdown, burst
    prepared: int = 0
    sent: int = 0
    answered: int = 0
    stock: int | None = None
    opens_in_s: float = 0.0
    elapsed_s: float = 0.0  # since the opening
    finished: bool = False  # the last sample: every Locust process has exited
    opened_at: float | None = None  # wall clock of the opening
    samples: list[tuple[float, float, int | None]] = field(default_factory=list)  # (wall clock, since opening, stock)


def database_url() -> str:
    """A ``DATABASE_URL`` for the database this process is connected to (``test_…`` under pytest)."""
    db = connection.settings_dict
    credentials = quote(db.get("USER") or "", safe="")
    if db.get("PASSWORD"):
        credentials += ":" + quote(db["PASSWORD"], safe="")
    host = db.get("HOST") or ""
    if db.get("PORT"):
        host += f":{db['PORT']}"
    url = f"postgres://{credentials}{'@' if credentials else ''}{host}/{quote(db['NAME'], safe='')}"
    options = {
        k: v for k, v in (db.get("OPTIONS") or {}).items() if isinstance(v, (str, int)) and not isinstance(v, bool)
    }
    return f"{url}?{urlencode(options)}" if options else url


def server_environment(
    *, backend: str, port: int, plan: BurstPlan, access_log: Path, overrides: dict[str, str] | None = None
) -> dict[str, str]:
    """One pod's environment: this process's services, the strategy, the sizing of its workers;
    ``overrides`` last (a fault's private Redis, its shorter lease, the storage check off)."""
    inventory = settings.INVENTORY
    env = {k: v for k, v in os.environ.items() if k not in {"ALLOW_UNSAFE_BACKEND", "DATABASE_CONN_MAX_AGE"}}
    env["INVENTORY_FENCED"] = "1" if inventory["OPTIONS"]["FENCED"] else "0"
    env.update(
        DJANGO_SETTINGS_MODULE="shop.settings",
        DATABASE_URL=database_url(),
        DATABASE_POOL_MAX_SIZE=str(plan.pool_max_size),
        DATABASE_POOL_TIMEOUT=str(plan.pool_timeout_s),
        REDIS_URL=inventory["REDIS_URL"],
        REDLOCK_URLS=",".join(inventory["REDLOCK_URLS"]),
        REDLOCK_BASE_PORT=str(settings.REDLOCK_BASE_PORT),
        LOCK_TTL_MS=str(inventory["LOCK_TTL_MS"]),
        ACQUIRE_TIMEOUT_MS=str(inventory["ACQUIRE_TIMEOUT_MS"]),
        # The floor touches no strategy; any valid one lets the shop start.
        INVENTORY_BACKEND="db" if backend == FLOOR else backend,
        GUNICORN_BIND=f"127.0.0.1:{port}",
        GUNICORN_WORKERS=str(plan.workers),
        GUNICORN_THREADS=str(plan.threads),
        # Every prepared shopper's connection stays open through preparation and countdown.
        GUNICORN_KEEPALIVE=str(int(plan.prepare_timeout_s + plan.countdown_s + plan.timeout_s)),
        GUNICORN_WORKER_CONNECTIONS=str(plan.requests + plan.threads + 16),
        GUNICORN_BACKLOG=str(max(2048, plan.requests)),
        # The server's own count of purchase POSTs, to check Locust's against.
        GUNICORN_ACCESSLOG=str(access_log),
    )
    if backend != FLOOR:
        env.update(strategy_class(backend).server_env(inventory))
    env.update(overrides or {})
    return env


def collect_static() -> None:
    """Collect static files the way gunicorn will serve them.

    gunicorn runs with DEBUG off, where the manifest storage refuses to render a page whose
    stylesheet was never collected (every product page would be a 500).
    """
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "shop.settings",
        "DJANGO_DEBUG": "0",
        "DATABASE_URL": database_url(),
    }
    result = subprocess.run(
        [sys.executable, "manage.py", "collectstatic", "--noinput", "--verbosity", "0"],
        cwd=settings.BASE_DIR,
        env=env,
        capture_output=True,
        text=True,
    )
    if result.returncode != 0:
        lines = (result.stderr or result.stdout).strip().splitlines()
        raise BurstError(f"collectstatic failed: {lines[-1] if lines else result.returncode}")


def prepare_product(*, sku: str, stock: int) -> Product:
    """The burst's own product, created if missing, on sale now with ``stock`` units and no orders."""
    Product.objects.get_or_create(
        sku=sku,
        defaults={"name": "Flash-burst phone", "price": Decimal("1.00"), "initial_stock": stock, "stock": stock},
    )
    Product.objects.filter(sku=sku).update(sale_starts_at=None, sale_ends_at=None, per_customer_limit=1)
    return reset_sale(sku=sku, stock=stock)


def read_json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def write_json(path: Path, data: dict) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)


def shares(total: int, parts: int) -> list[int]:
    """``total`` split into ``parts`` whole shares that differ by at most one and add up exactly."""
    return [total // parts + (1 if i < total % parts else 0) for i in range(parts)]


class ConnectionSampler(threading.Thread):
    """The most connections to the run's database seen at once (``pg_stat_activity``, every 50 ms),
    the runner's own included, the sampler's not."""

    QUERY = "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()"

    def __init__(self, url: str) -> None:
        super().__init__(name="pg-connection-sampler", daemon=True)
        self.url = url
        self.peak = 0
        self.error: str | None = None
        self._stop_event = threading.Event()

    def run(self) -> None:
        try:
            with psycopg.connect(self.url, autocommit=True, connect_timeout=5) as conn:
                while True:
                    self.peak = max(self.peak, conn.execute(self.QUERY).fetchone()[0])
                    if self._stop_event.wait(CONNECTION_SAMPLE_INTERVAL_S):
                        return
        except psycopg.Error as exc:
            self.error = str(exc).strip()

    def stop(self) -> int | None:
        self._stop_event.set()
        self.join(5)
        return None if self.error else self.peak


class Row:
    """The processes and files of one row while it runs."""

    def __init__(
        self, *, backend: str, plan: BurstPlan, run_dir: Path, scratch: Path, env: dict[str, str] | None = None
    ) -> None:
        self.backend = backend
        self.env = env or {}
        self.plan = plan
        self.run_dir = run_dir
        self.scratch = scratch
        self.pods: list[Child] = []
        self.ports: list[int] = []
        self.locusts: list[Child] = []
        self.start_file = scratch / "start.json"

    def access_log(self, pod: int) -> Path:
        return self.run_dir / f"{self.backend}-pod{pod}-access.log"

    def start_pods(self) -> None:
        for pod in range(self.plan.pods):
            port = free_port()
            self.access_log(pod).unlink(missing_ok=True)
            self.pods.append(
                Child(
                    f"gunicorn pod {pod}",
                    [sys.executable, "-m", "gunicorn", "-c", "gunicorn.conf.py"],
                    cwd=settings.BASE_DIR,
                    env=server_environment(
                        backend=self.backend,
                        port=port,
                        plan=self.plan,
                        access_log=self.access_log(pod),
                        overrides=self.env,
                    ),
                    log_path=self.run_dir / f"{self.backend}-pod{pod}-gunicorn.log",
                    nice=POD_NICE,
                )
            )
            self.ports.append(port)
        for pod, port in zip(self.pods, self.ports, strict=False):
            wait_until_answers(pod, f"http://127.0.0.1:{port}/api/products/{self.plan.sku}")

    def start_locusts(self) -> None:
        plan = self.plan
        closed = plan.scenario != "spike"
        hosts = ",".join(f"http://127.0.0.1:{port}" for port in self.ports)
        purchases = shares(plan.requests, plan.locust_processes)
        users = shares(plan.users, plan.locust_processes) if closed else purchases
        env = {k: v for k, v in os.environ.items() if not k.startswith("DJANGO_")}
        env["PYTHONPATH"] = str(settings.BASE_DIR)
        run_for = int(plan.prepare_timeout_s + plan.countdown_s + plan.timeout_s)
        offset = 0
        for index, (share, user_count) in enumerate(zip(purchases, users, strict=False)):
            user_count = max(1, min(user_count, share))
            self.locusts.append(
                Child(
                    f"locust {index}",
                    [
                        sys.executable,
                        "-m",
                        "locust",
                        "-f",
                        str(LOCUSTFILE),
                        "--headless",
                        "--only-summary",
                        "--loglevel",
                        "WARNING",
                        "--host",
                        hosts.split(",")[0],
                        "--hosts",
                        hosts,
                        "-u",
                        str(user_count),
                        "-r",
                        str(user_count),
                        "-t",
                        f"{run_for}s",
                        "--scenario",
                        "closed" if closed else "spike",
                        "--purchases",
                        str(share),
                        "--user-offset",
                        str(offset),
                        "--sku",
                        plan.sku,
                        "--max-retries",
                        str(plan.max_retries),
                        "--path",
                        "/api/products/{sku}/" + ("floor" if self.backend == FLOOR else "purchase"),
                        "--start-file",
                        str(self.start_file),
                        "--summary-json",
                        str(self.summary_path(index)),
                        "--progress-file",
                        str(self.progress_path(index)),
                    ],
                    cwd=settings.BASE_DIR,
                    env=env,
                    log_path=self.run_dir / f"{self.backend}-locust{index}.log",
                )
            )
            offset += user_count

    def summary_path(self, index: int) -> Path:
        return self.scratch / f"summary-{index}.json"

    def progress_path(self, index: int) -> Path:
        return self.scratch / f"progress-{index}.json"

    def progress_reports(self) -> list[dict]:
        return [read_json(self.progress_path(i)) or {} for i in range(len(self.locusts))]

    def answered(self) -> int:
        return sum(report.get("answered", 0) for report in self.progress_reports())

    def first_pod_pid(self) -> int | None:
        return self.pods[0].process.pid if self.pods else None

    def stop(self) -> None:
        stop_all([*self.locusts, *self.pods])

    def server_purchases(self) -> int:
        """Purchase POSTs that reached the pods, from their access logs (complete once they stopped)."""
        endpoint = "floor" if self.backend == FLOOR else "purchase"
        needle = f'"POST /api/products/{self.plan.sku}/{endpoint} '
        total = 0
        for pod in range(len(self.pods)):
            try:
                with open(self.access_log(pod), errors="replace") as lines:
                    total += sum(needle in line for line in lines)
            except OSError:
                pass
        return total


def run_row(*, backend: str, plan: BurstPlan, on_progress: Callable[[Progress], None] | None = None) -> dict:
    """Run one row (a strategy, or ``"floor"``) of the comparison and return it (the JSON keys).

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
            plan.fault, backend=backend, fenced=plan.fenced, requests=plan.requests, database_url=database_url()
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
                faulted.start(pod_pid=row.first_pod_pid, answered=row.answered)
            drive(row, progress, on_progress)
            if faulted:
                faulted.finish()
            summaries = [read_json(row.summary_path(i)) for i in range(len(row.locusts))]
        except ChildError as exc:
            raise BurstError(str(exc)) from exc
        finally:
            row.stop()
            peak_connections = sampler.stop()
        missing = [locust for locust, summary in zip(row.locusts, summaries, strict=False) if summary is None]
        if missing:
            raise BurstError(
                f"{missing[0].name} exited with code {missing[0].process.returncode} and no summary: "
                f"{missing[0].log_tail()}"
            )
        figures = merge(summaries)
        figures["server_purchases"] = row.server_purchases()
        figures["timeline"] = timeline(
            progress.samples,
            opened_at=progress.opened_at or 0.0,
            sent_times=figures["sent_times"],
            answer_times=figures["answer_times"],
        )
        if faulted:
            figures.update(faulted.figures(figures["purchases"], opened_at=progress.opened_at or 0.0))
    return record(
        backend=backend,
        plan=plan,
        figures=figures,
        started_at=started_at,
        peak_db_connections=peak_connections,
    )


def drive(row: Row, progress: Progress, on_progress: Callable[[Progress], None] | None) -> None:
    """Follow the Locust processes: preparation, the opening they are all told, the burst, their exit."""
    plan = row.plan
    began = time.monotonic()
    open_at = None  # wall clock
    while True:
        reports = row.progress_reports()
        progress.finished = not any(locust.running() for locust in row.locusts)
        progress.prepared = sum(report.get("prepared", 0) for report in reports)
        progress.sent = sum(report.get("sent", 0) for report in reports)
        progress.answered = sum(report.get("answered", 0) for report in reports)
        if open_at is None:
            if reports and all(report.get("phase") == "ready" for report in reports):
                open_at = progress.opened_at = time.time() + plan.countdown_s
                write_json(row.start_file, {"open_at": open_at})
            elif progress.finished or any(not locust.running() for locust in row.locusts):
                return  # a process gave up while preparing; its summary (or its absence) says why
            elif time.monotonic() - began > plan.prepare_timeout_s:
                raise BurstError(
                    f"preparing {plan.requests} shoppers took over {plan.prepare_timeout_s:.0f}s "
                    f"({progress.prepared} ready); see {row.locusts[0].log_path}"
                )
            progress.phase = "preparing"
        if open_at is not None:
            now = time.time()
            progress.opens_in_s = max(0.0, open_at - now)
            progress.phase = "countdown" if now < open_at else "burst"
            if now >= open_at:
                progress.elapsed_s = now - open_at
                progress.stock = Product.objects.filter(sku=plan.sku).values_list("stock", flat=True).first()
                progress.samples.append((now, progress.elapsed_s, progress.stock))
                if progress.elapsed_s > plan.timeout_s + 30:
                    raise BurstError(
                        f"locust still running after {progress.elapsed_s:.0f}s; see {row.locusts[0].log_path}"
                    )
        if on_progress:
            on_progress(progress)
        if progress.finished:
            return
        time.sleep(min(SAMPLE_INTERVAL_S, progress.opens_in_s or SAMPLE_INTERVAL_S))


def record(*, backend: str, plan: BurstPlan, figures: dict, started_at, peak_db_connections: int | None) -> dict:
    """Audit the database (not for the floor), judge the invariants, store the BurstRun, return the row."""
    # The floor sells nothing: there is nothing to audit.
    report = None if backend == FLOOR else audit(sku=plan.sku, told_sold_out=figures["outcomes"].get("sold_out", 0))
    busy = figures["busy"]
    errors_5xx = sum(n for status, n in figures["status_counts"].items() if int(status) >= 500) - busy
    problems = judge(
        backend=backend,
        plan=plan,
        figures=figures,
        report=report,
        errors_5xx=errors_5xx,
    )
    counts = figures["status_counts"]
    row = {
        "backend": backend,
        "scenario": plan.scenario,
        "fault": figures.get("fault"),
        "fault_description": figures.get("fault_description"),
        "fenced": plan.fenced,
        "pods": plan.pods,
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
        "resumed_after_s": figures.get("resumed_after_s"),
        "timeline": figures["timeline"],
        "latency_histogram_ms": figures["latency_histogram_ms"],
        "sizing": {
            "locust_processes": plan.locust_processes,
            "workers": plan.workers,
            "threads": plan.threads,
            "pool_max_size": plan.pool_max_size,
            "pool_timeout_s": plan.pool_timeout_s,
            "users": plan.requests if plan.scenario == "spike" else plan.users,
        },
    }
    if report is not None:
        BurstRun.objects.create(
            started_at=started_at,
            sku=plan.sku,
            timeline=figures["timeline"],
            **{
                k: row[k]
                for k in (
                    "backend",
                    "requests",
                    "stock_initial",
                    "stock_final",
                    "orders",
                    "oversold",
                    "undersold",
                    "status_counts",
                    "errors_5xx",
                    "rps",
                    "p50_ms",
                    "p95_ms",
                    "p99_ms",
                    "duration_s",
                    "invariants_ok",
                )
            },
        )
    return row
