"""``manage.py flashsale``: one flash sale per strategy, next to a floor row, audited and compared."""

from __future__ import annotations

import json
import os
import platform
import shlex
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

import psycopg
from django.core.management.base import BaseCommand, CommandError
from django.utils import timezone

from faults.base import OVERSELL_UNFENCED, FaultError
from inventory.services import reset_sale
from inventory.strategies import needs_of, strategy_class
from loadtests.balancer import BalancerError
from loadtests.burst import batch_linger_ms, floor_row, prepare_product, run_row
from loadtests.faultrun import NO_HOLDER_PAUSED, NOT_OBSERVED
from loadtests.figures import median_run, with_hot_row_ratio
from loadtests.hotrow import CONNECTION_COUNTS, HotRowError, best_shape, spare_connections
from loadtests.options import add_arguments, planned_rows, row_plan
from loadtests.plan import FLOOR, BurstError, BurstPlan, Progress, queue_of, via_of
from loadtests.pods import collect_static, database_url, wait_for_lingering_masters
from loadtests.report.machine import complete_machine
from loadtests.report.page import place_locust_reports, write_report
from loadtests.steadiness import describe, steadiness
from loadtests.table import (
    COLUMNS,
    breakdown_line,
    cpu_line,
    holder_note,
    hot_row_cells,
    phase_lines,
    run_cells,
    sales_line,
    steps_line,
    table_row,
)
from loadtests.targets import verdict_lines
from loadtests.wakeup import measured as wake_up_measured
from processes.children import sigterm_as_interrupt
from processes.needs import processes_running
from processes.nodes import NodeError
from processes.protocol import ProcessUnavailable

#: Connections left to everything else on the PostgreSQL server (psql, the runner, other clients).
SPARE_CONNECTIONS = 10
#: Purchases per commit of the hot row's batched shape when no --batch size above 1 was given.
HOT_ROW_BATCH = 64
#: How the problems of a row that broke nothing begin: its fault could not show what it is for.
UNSEEN = (NOT_OBSERVED, NO_HOLDER_PAUSED)


class Command(BaseCommand):
    help = (
        "Flash sale per strategy next to a floor row: reset the sale, start --pods gunicorn instances with the "
        "strategy, prepare the shoppers, release their purchases (spike: all at once; deep, flash: closed loop), "
        "audit the database, print a row. Exits non-zero when any run breaks an invariant."
    )

    def add_arguments(self, parser):
        add_arguments(parser)

    def handle(self, *args, **options):
        rows = planned_rows(options, pool_size=self.pool_size)
        self.batched = rows.batched
        repeat, fault, unfenced = options["repeat"], options.get("fault"), options.get("unfenced", False)
        started_at = timezone.now()
        probe = self.probe_steadiness() if options.get("steadiness") else None
        self.wake_up = self.probe_wake_up()
        self.hot_rows: list[dict] = []  # the hot-row limit's shapes (--hot-row), run before the strategy rows
        self.finished: list[dict] = []  # every strategy row run so far, kept should a later one fail
        try:
            with sigterm_as_interrupt():  # the rows' finally blocks stop gunicorn and Locust on SIGTERM too
                runs = self.run_rows(
                    rows.keys, rows.plan, repeat=repeat, unfenced=unfenced, vias=rows.vias, hot_row=rows.hot_row
                )
        except CommandError as exc:
            self.write_unfinished(exc, options, started_at=started_at, probe=probe, vias=rows.vias)
            raise
        keys = rows.keys if fault else [(FLOOR, 1, "local"), *rows.keys]
        medians = runs if repeat == 1 else self.medians(runs, keys, rows.vias)
        for run in [*runs, *medians]:
            with_hot_row_ratio(run, self.hot_rows)
        if not fault:
            for line in verdict_lines(medians):
                self.stdout.write(line)
        document = self.document(medians, started_at, wake_up=self.wake_up)
        if probe:
            document["machine"]["steadiness"] = probe
        if self.hot_rows:
            document["hot_row"] = self.hot_rows
        if repeat > 1:
            document["repeats"] = runs  # every repeat's own figures; "runs" holds the medians
        self.write_outputs(document, json_path=options["json_path"], report_path=options.get("report_path", ""))
        self.check_runs(runs, fault=fault, unfenced=unfenced)

    def write_unfinished(self, error: CommandError, options: dict, *, started_at, probe, vias) -> None:
        """A row failed to run (or the run was interrupted): the rows that ran before it, audited and
        stored, still go to --json and --report, each floor row the best floor round among them, and
        the document says why it ends there (``incomplete``)."""
        if not self.finished or not (options["json_path"] or options.get("report_path")):
            return
        floors = [floor_row([run for run in self.finished if via_of(run) == via]) for via in vias]
        document = self.document([*filter(None, floors), *self.finished], started_at, wake_up=self.wake_up)
        document["incomplete"] = str(error)
        if probe:
            document["machine"]["steadiness"] = probe
        if self.hot_rows:
            document["hot_row"] = self.hot_rows
        self.write_outputs(document, json_path=options["json_path"], report_path=options.get("report_path", ""))
        self.stdout.write(f"the {len(self.finished)} row(s) that ran before it are in the outputs")

    def probe_wake_up(self) -> dict | None:
        """What a round trip between two processes costs here, before anything of the burst starts
        (printed first): the unit every row's and the floor's round trips are made of."""
        probe, line = wake_up_measured()
        self.stdout.write(line)
        return probe

    def probe_steadiness(self) -> dict:
        """The machine's own noise, measured before anything of the burst starts (printed first)."""
        probe = steadiness()
        self.stdout.write(describe(probe))
        return probe

    def check_runs(self, runs: list[dict], *, fault: str | None, unfenced: bool) -> None:
        """kill-holder's note; say what --unfenced was expected to show; refuse (exit non-zero) when a
        run broke an invariant, or its fault could not show what it is for."""
        for line in holder_note(runs):
            self.stdout.write(line)
        failed = [run for run in runs if not run["invariants_ok"]]
        # A fault that outlasted the sale, or a pause that froze no holder, broke nothing: the run
        # only could not show what the fault is for.
        unseen = [run for run in failed if all(p.startswith(UNSEEN) for p in run["problems"])]
        broken = [f"{run['row']} ({'; '.join(run['problems'])})" for run in failed if run not in unseen]
        if unfenced and fault in OVERSELL_UNFENCED:
            self.stdout.write(unfenced_line(runs, fault))
        if broken:
            raise CommandError(f"invariants broken: {', '.join(broken)}")
        if unseen:
            rows = ", ".join(run["row"] for run in unseen)
            first = unseen[0]["problems"][0]
            raise CommandError(f"{next(p for p in UNSEEN if first.startswith(p))} in {rows}: {first}")

    def run_rows(
        self,
        keys: list[tuple[str, int, str]],
        plan: BurstPlan,
        *,
        repeat: int,
        unfenced: bool,
        vias: list[tuple[str, str]],
        hot_row: bool = False,
    ) -> list[dict]:
        """Every row (the floor first, unless a fault runs) through each balancer and on each server in
        turn (``vias``), ``repeat`` times, with the processes the strategies need running; each row
        printed as it ends. A row is a strategy at a BATCH size on a queue. With ``hot_row`` the hot-row limit's
        two rows come first."""
        fault = plan.fault
        names = list(dict.fromkeys(name for name, _, _ in keys))
        controls = [name for name in names if strategy_class(name).control]
        if controls:
            self.stderr.write(
                f"warning: {', '.join(controls)} oversell(s) by design (controls); "
                "ALLOW_UNSAFE_STRATEGY=1 is set for their gunicorn only"
            )
        runs: list[dict] = []
        try:
            # Each row starts (and stops) only the processes its own strategy needs: see run_round.
            collect_static()
            self.stdout.write(
                f"{plan.scenario}: {plan.requests} purchases per row, {plan.sale_stock} units, {plan.pods} pod(s) "
                f"× {plan.workers} workers × {plan.threads} threads"
                + (f" ({self.batched} in BATCH>1 rows; {_linger()})" if max(size for _, size, _ in keys) > 1 else "")
                + f", pool {plan.pool_max_size} per worker at most, "
                f"Locust master + {plan.locust_workers} worker(s)"
            )
            if fault:
                self.stdout.write(
                    f"fault {fault}, injected after a third of the purchases were answered; no floor row"
                    + ("; storage check off (INVENTORY_FENCED=0)" if unfenced else "")
                )
            self.stdout.write(table_row([title for title, _ in COLUMNS]))
            if hot_row:
                self.hot_rows = self.run_hot_row(plan, largest=max(size for _, size, _ in keys))
            for round_number in range(1, repeat + 1):
                runs += self.run_round(keys, plan, vias, round_number=round_number if repeat > 1 else None)
        except (ProcessUnavailable, NodeError, BurstError, FaultError, BalancerError) as exc:
            raise CommandError(str(exc)) from exc
        finally:
            wait_for_lingering_masters()  # their Locust reports are complete, and no process is left
        return runs

    def run_round(
        self,
        keys: list[tuple[str, int, str]],
        plan: BurstPlan,
        vias: list[tuple[str, str]],
        *,
        round_number: int | None,
    ) -> list[dict]:
        """Every row once through each balancer and on each server, each printed as it ends; then the
        floor row of each (balancer, server) (the best of its rows' floor rounds), placed first."""
        runs: list[dict] = []
        for name, size, queue in keys:
            for balancer, server in vias:
                # Only this row's own processes run beside it (an etcd cluster or a ZooKeeper ensemble
                # idling beside every other row would take its share of the two cores).
                with processes_running(needs_of([name])) as started:
                    if started:
                        self.stderr.write(f"{name}: started {', '.join(s.description for s in started)} for this row")
                    plan_row = replace(row_plan(plan, size, self.batched, queue), balancer=balancer, server=server)
                    run = self.run_one(name, plan_row, floor=None)
                if round_number:
                    run["round"] = round_number
                runs.append(run)
                self.finished.append(run)
                self.stdout.write(table_row(run_cells(run)))
                lines = [steps_line(run), sales_line(run), breakdown_line(run), cpu_line(run), *phase_lines(run)]
                for line in filter(None, lines):
                    self.stdout.write(line)
        floors = [floor_row([run for run in runs if via_of(run) == via]) for via in vias]
        for floor in (floor for floor in floors if floor):
            if round_number:
                floor["round"] = round_number
            self.stdout.write(table_row(run_cells(floor)) + f"   (best floor round: {floor['floor_of']}'s pods)")
        return [floor for floor in floors if floor] + runs

    def run_hot_row(self, plan: BurstPlan, *, largest: int) -> list[dict]:
        """The hot-row limit (:mod:`loadtests.hotrow`) on the burst's own product, each shape printed as
        a row: --requests purchases at each connection count of CONNECTION_COUNTS up to --users (and
        what PostgreSQL has to spare), the best count kept, one per commit, then the largest --batch
        size (or 64) per commit; the sale reset before each run and afterwards."""
        batch = largest if largest > 1 else HOT_ROW_BATCH
        dsn = database_url()
        shapes = []
        product = prepare_product(sku=plan.sku, stock=plan.sale_stock)
        try:
            spare = min(plan.users, spare_connections(dsn, keep=SPARE_CONNECTIONS))
            counts = tuple(count for count in CONNECTION_COUNTS if count <= spare)
            if not counts:
                raise CommandError("--hot-row: PostgreSQL has no connection to spare for the hot row")
            for size in (1, batch):
                shape, tried = best_shape(
                    dsn,
                    product_id=product.pk,
                    purchases=plan.requests,
                    batch=size,
                    counts=counts,
                    reset=lambda: reset_sale(sku=plan.sku, stock=plan.sale_stock),
                )
                tried_rps = [{"connections": run.connections, "rps": run.rps} for run in tried]
                shapes.append({**shape.as_dict(), "tried": tried_rps})
                self.stdout.write(
                    table_row(hot_row_cells(shape.as_dict()))
                    + "   (best of "
                    + ", ".join(f"{t.rps:.0f}/s at {t.connections}" for t in tried)
                    + " connections)"
                )
                if not shape.ok:
                    raise CommandError(
                        f"{shape.name}: the audit does not balance: sold {shape.sold}, {shape.orders} units ordered, "
                        f"stock {shape.stock_final}, oversold {shape.oversold}"
                    )
        except psycopg.Error as exc:
            raise CommandError(f"--hot-row: {str(exc).strip().splitlines()[0]}") from exc
        except HotRowError as exc:
            raise CommandError(f"--hot-row: {exc}") from exc
        finally:
            reset_sale(sku=plan.sku, stock=plan.sale_stock)  # the rows after it start from a clean sale
        return shapes

    def write_outputs(self, document: dict, *, json_path: str, report_path: str) -> None:
        """The runs as JSON at ``json_path`` and the HTML report at ``report_path``, each if given;
        Locust's own reports copied beside the HTML report."""
        if report_path:
            place_locust_reports([*document.get("repeats", []), *document["runs"]], report_path)
        if json_path:
            Path(json_path).parent.mkdir(parents=True, exist_ok=True)
            Path(json_path).write_text(json.dumps(document, indent=2) + "\n")
        if report_path:
            written = write_report({**document, "machine": complete_machine(document["machine"])}, report_path)
            self.stdout.write(f"report: {written}")

    def run_one(self, name: str, plan: BurstPlan, *, floor: dict | None) -> dict:
        try:
            return run_row(backend=name, plan=plan, floor=floor, on_progress=self.progress_line())
        except BurstError as exc:
            raise CommandError(f"{name}: {exc}") from exc
        except KeyboardInterrupt:
            raise CommandError(f"{name}: interrupted; gunicorn and Locust were stopped") from None
        finally:
            self.end_progress_line()

    def medians(self, runs: list[dict], keys: list[tuple[str, int, str]], vias: list[tuple[str, str]]) -> list[dict]:
        """Per row, balancer and server: the median run (:func:`median_run`), every repeat's problems,
        its ratio to the floor's median through the same balancer on the same server."""
        self.stdout.write(f"median of {runs[-1]['round']} runs (rps range in the JSON):")
        rows, floors = [], {}
        for name, size, queue in keys:
            for via in vias:
                mine = [
                    run
                    for run in runs
                    if (run["row"], run["batch"], queue_of(run), via_of(run)) == (name, size, queue, via)
                ]
                row = median_run(mine)
                row.pop("round", None)
                row["problems"] = [f"run {run['round']}: {problem}" for run in mine for problem in run["problems"]]
                row["invariants_ok"] = not row["problems"]
                # Each run was read against its own pods' floor round: the median of those ratios.
                ratios = [run["floor_ratio"] for run in mine if run.get("floor_ratio") is not None]
                row["floor_ratio"] = round(statistics.median(ratios), 3) if ratios else None
                floors[via] = row if name == FLOOR else floors.get(via)
                rows.append(row)
                self.stdout.write(table_row(run_cells(row)))
        if (FLOOR, 1, "local") in keys and len(vias) > 1 and floors[vias[0]]["rps"]:
            for via in vias[1:]:
                ratio = floors[via]["rps"] / floors[vias[0]]["rps"]
                self.stdout.write(f"median floor {' on '.join(via)}: {ratio:.2f}× the floor {' on '.join(vias[0])}")
        return rows

    @staticmethod
    def document(rows: list[dict], started_at, *, wake_up: dict | None = None) -> dict:
        machine = {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version()}
        return {
            "command": " ".join(shlex.quote(arg) for arg in sys.argv),
            "started_at": started_at.isoformat(),
            "machine": {**machine, "wake_up": wake_up} if wake_up else machine,
            "runs": rows,
        }

    @staticmethod
    def pool_size(*, pods: int, workers: int, threads: int) -> int:
        """Connections per gunicorn worker: one per thread, fewer if all pods' workers would not fit
        in what PostgreSQL has free now (max_connections − reserved − in use − a spare few)."""
        try:
            with psycopg.connect(database_url(), autocommit=True, connect_timeout=5) as conn:
                limit = int(conn.execute("SHOW max_connections").fetchone()[0])
                reserved = int(conn.execute("SHOW superuser_reserved_connections").fetchone()[0])
                in_use = conn.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend'"
                ).fetchone()[0]
        except psycopg.Error as exc:
            raise CommandError(f"PostgreSQL does not answer ({str(exc).strip()}): start it") from exc
        free = limit - reserved - in_use - SPARE_CONNECTIONS
        per_worker = min(threads, free // (pods * workers))
        if per_worker < 1:
            raise CommandError(
                f"{pods} pod(s) × {workers} workers need at least {pods * workers} connections; PostgreSQL has "
                f"{max(free, 0)} to spare (max_connections {limit}): lower --pods or --workers, "
                "or raise max_connections"
            )
        return per_worker

    def progress_line(self):
        """A callback that shows one updating line on a terminal, a plain line a second otherwise."""
        tty = self.stdout.isatty()
        last = [0.0]

        def show(progress: Progress) -> None:
            text = (
                f"{progress.backend}: {progress.sale_label if progress.phase in ('floor', 'burst') else ''}"
                + {
                    "starting": "starting the pods",
                    "preparing": f"preparing shoppers {progress.prepared}/{progress.requests}",
                    "countdown": f"{progress.prepared} shoppers ready, the sale opens in {progress.opens_in_s:.1f}s",
                    "floor": f"floor round on the same pods: {progress.sent}/{progress.requests} sent, "
                    f"{progress.answered} answered",
                    "burst": (
                        f"{progress.sent}/{progress.requests} purchases sent, {progress.answered} answered, "
                        f"stock left {'?' if progress.stock is None else progress.stock}, {progress.elapsed_s:.1f}s"
                    ),
                }[progress.phase]
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


def _linger() -> str:
    """What the batched rows' leaders without a lock do first (``INVENTORY_BATCH_LINGER_MS``)."""
    linger = batch_linger_ms()
    return f"a leader without a lock lingers {linger} ms" if linger else "no linger"


def unfenced_line(runs: list[dict], fault: str) -> str:
    """What an --unfenced run of ``fault`` was expected to show, and what it showed: the oversell, no
    oversell (the race was not hit), or nothing of it (a pause that froze no holder)."""
    expected = f"expected: with the storage check off, {fault} lets a second holder write from a stale read; "
    oversold = sum(run["oversold"] for run in runs)
    if oversold:
        return expected + f"the audit found {oversold} unit(s) oversold, which the fence prevents"
    missed = [run["row"] for run in runs if any(p.startswith(NO_HOLDER_PAUSED) for p in run["problems"])]
    if missed:
        return expected + f"{fault} froze no holder in {', '.join(missed)}: the run shows nothing of the race"
    return expected + "this time no unit was oversold (the race was not hit)"
