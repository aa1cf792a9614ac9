"""``manage.py flashsale``: fire N purchase requests at each lock backend and audit the result."""
from __future__ import annotations

import json
import re
import signal
import threading
import time
from pathlib import Path

from django.core.management.base import BaseCommand, CommandError

from inventory.backends import STRATEGIES, ServiceError, services_running, strategy_class
from inventory.nodes import NodeError
from loadtests.burst import BurstError, BurstPlan, Progress, collect_static, run_burst

SKU_PATTERN = re.compile(r"^[-a-zA-Z0-9_]{1,64}$")
COLUMNS = [
    ("backend", 8), ("requests", 8), ("201", 5), ("409", 6), ("503", 5), ("5xx", 4), ("stock", 5),
    ("orders", 6), ("oversold", 8), ("undersold", 9), ("rps", 7), ("p50 ms", 7), ("p95 ms", 7),
    ("p99 ms", 7), ("ok", 3),
]


def table_row(values: list) -> str:
    return "  ".join(str(value).rjust(width) if i else str(value).ljust(width) for i, ((_, width), value) in enumerate(zip(COLUMNS, values)))


def run_cells(run: dict) -> list:
    counts = run["status_counts"]
    return [
        run["backend"], run["requests"], counts.get("201", 0), counts.get("409", 0), counts.get("503", 0),
        run["errors_5xx"], run["stock_final"], run["orders"], run["oversold"], run["undersold"],
        f"{run['rps']:.0f}", f"{run['p50_ms']:.0f}", f"{run['p95_ms']:.0f}", f"{run['p99_ms']:.0f}",
        "yes" if run["invariants_ok"] else "NO",
    ]


class Command(BaseCommand):
    help = (
        "Flash-sale burst: for each backend, reset the sale, start gunicorn with it, send exactly "
        "--requests purchase requests through Locust, audit the database, print a row. "
        "Exits non-zero when any run breaks an invariant."
    )

    def add_arguments(self, parser):
        parser.add_argument("--backends", default="db,redis,redlock", help=f"comma-separated: {', '.join(STRATEGIES)}")
        parser.add_argument("--requests", type=int, default=5000, help="purchase requests per backend (default 5000)")
        parser.add_argument("--stock", type=int, default=100, help="units on sale (default 100)")
        parser.add_argument("--sku", default="flash-burst", help="the burst's own product, created if missing")
        parser.add_argument("--users", type=int, default=BurstPlan.users, help=f"concurrent Locust users (default {BurstPlan.users})")
        parser.add_argument("--workers", type=int, default=BurstPlan.workers, help=f"gunicorn worker processes (default {BurstPlan.workers})")
        parser.add_argument("--threads", type=int, default=BurstPlan.threads, help=f"threads per gunicorn worker (default {BurstPlan.threads})")
        parser.add_argument(
            "--timeout", type=float, default=None,
            help="give up on one backend's burst after this many seconds (default: 180, or 50 ms a request if more)",
        )
        parser.add_argument("--json", dest="json_path", default="", help="write the runs as JSON here")

    def handle(self, *args, backends: str, requests: int, stock: int, sku: str, users: int, workers: int,
               threads: int, timeout: float | None, json_path: str, **options):
        if timeout is None:
            timeout = max(BurstPlan.timeout_s, requests * 0.05)
        names = [name.strip() for name in backends.split(",") if name.strip()]
        unknown = [name for name in names if name not in STRATEGIES]
        if not names or unknown:
            raise CommandError(f"unknown backend {', '.join(unknown) or '(none given)'}: use {', '.join(STRATEGIES)}")
        if len(set(names)) != len(names):
            raise CommandError(f"--backends names a backend twice: {backends}")
        for flag, value, least in (("--requests", requests, 1), ("--stock", stock, 0), ("--users", users, 1),
                                   ("--workers", workers, 1), ("--threads", threads, 1), ("--timeout", timeout, 1)):
            if value < least:
                raise CommandError(f"{flag} must be {least} or more, not {value:g}")
        if not SKU_PATTERN.match(sku):
            raise CommandError(f"--sku {sku!r}: use letters, digits, - and _ (at most 64)")
        plan = BurstPlan(requests=requests, stock=stock, sku=sku, users=users, workers=workers, threads=threads, timeout_s=timeout)

        controls = [name for name in names if strategy_class(name).control]
        if controls:
            self.stderr.write(
                f"warning: {', '.join(controls)} oversell(s) by design (controls); "
                "ALLOW_UNSAFE_BACKEND=1 is set for their gunicorn only"
            )
        runs = []
        previous_sigterm = self.stop_on_sigterm()
        try:
            with services_running(names) as started:
                if started:
                    self.stderr.write(f"started {', '.join(s.description for s in started)}; stopped at the end")
                collect_static()
                self.stdout.write(table_row([title for title, _ in COLUMNS]))
                for name in names:
                    try:
                        run = run_burst(backend=name, plan=plan, on_progress=self.progress_line())
                    except BurstError as exc:
                        raise CommandError(f"{name}: {exc}") from exc
                    except KeyboardInterrupt:
                        raise CommandError(f"{name}: interrupted; gunicorn and Locust were stopped") from None
                    finally:
                        self.end_progress_line()
                    runs.append(run)
                    self.stdout.write(table_row(run_cells(run)))
        except (ServiceError, NodeError, BurstError) as exc:
            raise CommandError(str(exc)) from exc
        finally:
            if previous_sigterm is not None:
                signal.signal(signal.SIGTERM, previous_sigterm)
        if json_path:
            path = Path(json_path)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps({"runs": runs}, indent=2) + "\n")
        broken = [f"{run['backend']} ({'; '.join(run['problems'])})" for run in runs if not run["invariants_ok"]]
        if broken:
            raise CommandError(f"invariants broken: {', '.join(broken)}")

    @staticmethod
    def stop_on_sigterm():
        """Treat SIGTERM like Ctrl-C, so the finally blocks stop gunicorn and Locust; the old handler."""
        if threading.current_thread() is not threading.main_thread():
            return None

        def interrupt(signum, frame):
            raise KeyboardInterrupt

        return signal.signal(signal.SIGTERM, interrupt)

    def progress_line(self):
        """A callback that shows one updating line on a terminal, a plain line a second otherwise."""
        tty = self.stdout.isatty()
        last = [0.0]

        def show(progress: Progress) -> None:
            stock = "?" if progress.stock is None else progress.stock
            text = (
                f"{progress.backend}: {progress.sent}/{progress.requests} purchase requests sent, "
                f"stock left {stock}, {progress.elapsed_s:.1f}s"
            )
            if tty:
                self.stdout.write(f"\r{text}\033[K", ending="")
                self.stdout.flush()
            elif progress.finished or time.monotonic() - last[0] >= 1.0:
                last[0] = time.monotonic()
                self.stdout.write(text)

        self._tty = tty
        return show

    def end_progress_line(self) -> None:
        if getattr(self, "_tty", False):
            self.stdout.write("\r\033[K", ending="")
