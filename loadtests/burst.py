"""The burst runner behind ``manage.py flashsale``: one backend's flash sale, start to audit.

For a backend, :func:`run_burst` resets the sale, starts gunicorn with that backend on a free
127.0.0.1 port, runs Locust headless (``loadtests/locustfile.py``) until exactly ``requests``
purchase POSTs have been answered, stops both (process groups, also on error or Ctrl-C),
audits the database and stores a :class:`~inventory.models.BurstRun`.

gunicorn gets the database, Redis and Redlock settings of *this* process explicitly in its
environment, so the burst hits the same database whether the command runs from a shell or
inside a pytest-django test (whose database is ``test_<name>``).
"""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Callable
from urllib.parse import quote, urlencode

from django.conf import settings
from django.db import connection
from django.utils import timezone

from inventory.backends import strategy_class
from inventory.models import BurstRun, Product
from inventory.services import audit, reset_sale

LOCUSTFILE = Path(__file__).resolve().parent / "locustfile.py"
SAMPLE_INTERVAL_S = 0.25
READY_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 10.0


class BurstError(RuntimeError):
    """The burst could not be run (a process did not start, a service is missing)."""


@dataclass(frozen=True)
class BurstPlan:
    requests: int
    stock: int
    sku: str = "flash-burst"
    users: int = 100
    workers: int = 4
    threads: int = 4
    timeout_s: float = 180.0


@dataclass
class Progress:
    """What the live progress line shows; handed to the caller's callback every sample."""

    backend: str
    requests: int
    sent: int = 0
    stock: int | None = None
    elapsed_s: float = 0.0
    finished: bool = False  # the last sample: Locust has exited
    timeline: list[list] = field(default_factory=list)


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


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def server_environment(*, backend: str, port: int, plan: BurstPlan, access_log: Path) -> dict[str, str]:
    inventory = settings.INVENTORY
    env = {k: v for k, v in os.environ.items() if k != "ALLOW_UNSAFE_BACKEND"}
    env.update(
        DJANGO_SETTINGS_MODULE="shop.settings",
        DATABASE_URL=database_url(),
        REDIS_URL=inventory["REDIS_URL"],
        REDLOCK_URLS=",".join(inventory["REDLOCK_URLS"]),
        REDLOCK_BASE_PORT=str(settings.REDLOCK_BASE_PORT),
        LOCK_TTL_MS=str(inventory["LOCK_TTL_MS"]),
        ACQUIRE_TIMEOUT_MS=str(inventory["ACQUIRE_TIMEOUT_MS"]),
        INVENTORY_BACKEND=backend,
        GUNICORN_BIND=f"127.0.0.1:{port}",
        GUNICORN_WORKERS=str(plan.workers),
        GUNICORN_THREADS=str(plan.threads),
        # The server's own count of purchase POSTs, to check Locust's against.
        GUNICORN_ACCESSLOG=str(access_log),
    )
    env["INVENTORY_FENCED"] = "1" if inventory["OPTIONS"]["FENCED"] else "0"
    env.update(strategy_class(backend).server_env(inventory))
    return env


def _die_with_parent() -> None:
    """In the child before exec: get SIGTERM if the runner dies, even by SIGKILL (Linux only)."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


class Child:
    """A subprocess in its own process group, logging to a file; stopped group-wide."""

    def __init__(self, name: str, args: list[str], *, env: dict[str, str], log_path: Path) -> None:
        self.name = name
        self.log_path = log_path
        log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = open(log_path, "wb")
        self.process = subprocess.Popen(
            args,
            cwd=settings.BASE_DIR,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=_die_with_parent if sys.platform == "linux" else None,
        )

    def running(self) -> bool:
        return self.process.poll() is None

    def log_tail(self, lines: int = 5) -> str:
        try:
            text = self.log_path.read_text(errors="replace").strip().splitlines()
        except OSError:
            return ""
        return " | ".join(line.strip() for line in text[-lines:])

    def stop(self, sig: int = signal.SIGTERM) -> None:
        """Signal the whole group, wait, then SIGKILL what is left. Safe to call twice."""
        try:
            if self.running():
                self._signal_group(sig)
                try:
                    self.process.wait(STOP_TIMEOUT_S)
                except subprocess.TimeoutExpired:
                    pass
            # Leftovers in the group (gunicorn workers of a killed arbiter) die too.
            self._signal_group(signal.SIGKILL)
            self.process.wait(STOP_TIMEOUT_S)
        finally:
            self._log.close()

    def _signal_group(self, sig: int) -> None:
        try:
            os.killpg(self.process.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def collect_static() -> None:
    """Collect static files the way gunicorn will serve them.

    gunicorn runs with DEBUG off, where the manifest storage refuses to render a page whose
    stylesheet was never collected (every product page would be a 500).
    """
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "shop.settings", "DJANGO_DEBUG": "0", "DATABASE_URL": database_url()}
    result = subprocess.run(
        [sys.executable, "manage.py", "collectstatic", "--noinput", "--verbosity", "0"],
        cwd=settings.BASE_DIR, env=env, capture_output=True, text=True,
    )
    if result.returncode != 0:
        lines = (result.stderr or result.stdout).strip().splitlines()
        raise BurstError(f"collectstatic failed: {lines[-1] if lines else result.returncode}")


def wait_until_answers(server: Child, url: str) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        if not server.running():
            raise BurstError(f"gunicorn exited with code {server.process.returncode}: {server.log_tail()}")
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                if response.status == 200:
                    return
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass
        time.sleep(0.1)
    raise BurstError(f"gunicorn did not answer {url} within {READY_TIMEOUT_S:.0f}s; see {server.log_path}")


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


def run_burst(*, backend: str, plan: BurstPlan, on_progress: Callable[[Progress], None] | None = None) -> dict:
    """Run one backend's burst and return its row (the JSON keys, plus ``problems``)."""
    prepare_product(sku=plan.sku, stock=plan.stock)
    started_at = timezone.now()
    run_dir = Path(settings.RUN_DIR) / "burst"
    run_dir.mkdir(parents=True, exist_ok=True)
    port = free_port()
    base_url = f"http://127.0.0.1:{port}"
    progress = Progress(backend=backend, requests=plan.requests)
    server = locust = None
    access_log = run_dir / f"{backend}-access.log"
    access_log.unlink(missing_ok=True)
    with tempfile.TemporaryDirectory(dir=run_dir) as scratch:
        summary_path = Path(scratch) / "summary.json"
        progress_path = Path(scratch) / "progress.json"
        try:
            server = Child(
                "gunicorn",
                [sys.executable, "-m", "gunicorn", "-c", "gunicorn.conf.py"],
                env=server_environment(backend=backend, port=port, plan=plan, access_log=access_log),
                log_path=run_dir / f"{backend}-gunicorn.log",
            )
            wait_until_answers(server, f"{base_url}/api/products/{plan.sku}")
            locust = Child(
                "locust",
                [
                    sys.executable, "-m", "locust", "-f", str(LOCUSTFILE), "--headless", "--only-summary",
                    "--loglevel", "WARNING", "--host", base_url,
                    "-u", str(plan.users), "-r", str(plan.users), "-t", f"{int(plan.timeout_s)}s",
                    "--purchases", str(plan.requests), "--sku", plan.sku,
                    "--summary-json", str(summary_path), "--progress-file", str(progress_path),
                ],
                env={k: v for k, v in os.environ.items() if not k.startswith("DJANGO_")},
                log_path=run_dir / f"{backend}-locust.log",
            )
            began = time.monotonic()
            while True:
                progress.finished = not locust.running()
                progress.elapsed_s = time.monotonic() - began
                progress.sent = (read_json(progress_path) or {}).get("sent", progress.sent)
                progress.stock = Product.objects.filter(sku=plan.sku).values_list("stock", flat=True).first()
                progress.timeline.append([round(progress.elapsed_s, 2), progress.stock, progress.sent])
                if on_progress:
                    on_progress(progress)
                if progress.finished:
                    break
                if progress.elapsed_s > plan.timeout_s + 30:
                    raise BurstError(f"locust still running after {progress.elapsed_s:.0f}s; see {locust.log_path}")
                time.sleep(SAMPLE_INTERVAL_S)
            summary = read_json(summary_path)
            if summary is None:
                raise BurstError(f"locust exited with code {locust.process.returncode} and no summary: {locust.log_tail()}")
        finally:
            for child in (locust, server):
                if child is not None:
                    child.stop()
    summary["server_purchases"] = count_purchases(access_log, sku=plan.sku)
    return record(backend=backend, plan=plan, summary=summary, progress=progress, started_at=started_at)


def count_purchases(access_log: Path, *, sku: str) -> int:
    """Purchase POSTs that reached gunicorn, from its access log (complete once it has stopped)."""
    needle = f'"POST /api/products/{sku}/purchase '
    try:
        with open(access_log, errors="replace") as lines:
            return sum(needle in line for line in lines)
    except OSError:
        return 0


def record(*, backend: str, plan: BurstPlan, summary: dict, progress: Progress, started_at) -> dict:
    """Audit the database, judge the invariants, store the BurstRun, return the row."""
    status_counts = summary["status_counts"]
    report = audit(sku=plan.sku, told_sold_out=summary.get("outcomes", {}).get("sold_out", status_counts.get("409", 0)))
    # A 503 with Retry-After is the shop's "busy, try again" (allowed); any other 5xx, or a
    # request that got no HTTP answer at all ("0"), is an error.
    errors_5xx = sum(n for status, n in status_counts.items() if int(status) >= 500 or int(status) == 0)
    errors_5xx -= summary["busy"]
    problems = report.problems
    if errors_5xx:
        problems.append(f"{errors_5xx} server errors")
    if summary["page_failures"]:
        problems.append(f"{summary['page_failures']} product pages failed")
    if summary["sent"] != plan.requests or summary["answered"] != plan.requests:
        problems.append(f"sent {summary['sent']} purchase requests, {summary['answered']} answered, not {plan.requests}")
    if summary["server_purchases"] != summary["sent"]:
        problems.append(f"gunicorn logged {summary['server_purchases']} purchase requests, Locust sent {summary['sent']}")
    if min((point[1] for point in progress.timeline if point[1] is not None), default=0) < 0:
        problems.append("stock went below 0 during the burst")
    row = {
        "backend": backend,
        "requests": summary["sent"],
        "stock_initial": report.initial,
        "stock_final": report.stock,
        "orders": report.orders,
        "oversold": report.oversold,
        "undersold": report.undersold,
        "status_counts": status_counts,
        "errors_5xx": errors_5xx,
        "rps": summary["rps"],
        "p50_ms": summary["p50_ms"],
        "p95_ms": summary["p95_ms"],
        "p99_ms": summary["p99_ms"],
        "invariants_ok": not problems,
        "lost": report.lost,
        "duration_s": summary["duration_s"],
        "server_purchases": summary["server_purchases"],
        "problems": problems,
    }
    BurstRun.objects.create(
        started_at=started_at,
        sku=plan.sku,
        timeline=progress.timeline,
        **{k: v for k, v in row.items() if k not in {"lost", "problems", "server_purchases"}},
    )
    return row
