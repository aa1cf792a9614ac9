"""The processes of one burst row: the pods' environment and gunicorn instances, the Locust
processes that shop them, the files they report through, and the PostgreSQL connection sampler."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path
from urllib.parse import quote, urlencode

import psycopg
from django.conf import settings
from django.db import connection

from inventory.strategies import strategy_class
from processes.children import Child, free_port, stop_all, wait_until_answers

from .plan import FLOOR, BurstError, BurstPlan

LOCUSTFILE = Path(__file__).resolve().parent / "locustfile.py"
CONNECTION_SAMPLE_INTERVAL_S = 0.05
#: The pods run at a lower CPU priority than the Locust processes: on one machine they share the
#: cores, and a server that takes the CPU from its own load generator slows the spike it is measured
#: by. On separate machines (as in production) the two never compete; this approximates that.
POD_NICE = 5


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
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in {"ALLOW_UNSAFE_STRATEGY", "ALLOW_UNSAFE_BACKEND", "DATABASE_CONN_MAX_AGE"}
    }
    env["INVENTORY_FENCED"] = "1" if inventory["OPTIONS"]["FENCED"] else "0"
    env["INVENTORY_BATCH"] = str(plan.batch)
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
        INVENTORY_STRATEGY="db" if backend == FLOOR else backend,
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
            self.pods[-1].start()
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
            self.locusts[-1].start()
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
