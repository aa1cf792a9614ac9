"""The burst itself: ``manage.py flashsale`` against real gunicorn pods, Locust, PostgreSQL and Redis.

Each test starts gunicorn on the test database, so the rows must be committed:
``transaction=True``. The suite's Redlock nodes (ports 7579+) are the ones the command uses.
"""

from __future__ import annotations

import csv
import json
import re
import socket
import time
from io import StringIO
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command

from inventory.audit import audit
from inventory.models import BurstRun, Order, Product
from loadtests.management.commands.flashsale import Command as Flashsale
from loadtests.options import try_writing_in
from loadtests.report.base import BREAKDOWN_PARTS, ms
from loadtests.report.page import render_report
from loadtests.report.sentences import sentence
from processes.needs import project_cluster
from tests.helpers import flashsale_refused
from tests.slots import ETCD_BASE_PORT, LOCUST_MASTER_PORT

#: The bursts run on one xdist worker (make test): two at once would each measure the other.
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("burst")]

SKU = "flash-burst"
#: Every key of a run in the burst JSON (docs/burst.md, "The burst JSON"), present on every row.
RUN_KEYS = {
    "row",
    "scenario",
    "pods",
    "requests",
    "stock_initial",
    "stock_final",
    "orders",
    "oversold",
    "undersold",
    "lost",
    "status_counts",
    "errors_5xx",
    "rps",
    "p50_ms",
    "p95_ms",
    "p99_ms",
    "duration_s",
    "invariants_ok",
    "problems",
    "server_purchases",
    "conflicts",
    "retries",
    "constraint_hits",
    "arrival_window_s",
    "drain_s",
    "sold_out_after_s",
    "transport_errors",
    "peak_db_connections",
    "floor_ratio",
    "server_timing",
    "hold_p50",
    "hold_p99",
    "timeline",
    "latency_histogram_ms",
    "balancer",
    "server",
    "locust_workers",
    "transport_resends",
    "balancer_answers",
    "locust_report",
    "cpu_ms",
}


def burst(tmp_path, **options) -> tuple[dict, str, CommandError | None]:
    """Run the command; return its JSON document, what it printed and its error (if it failed)."""
    path = tmp_path / "burst.json"
    out = StringIO()
    error = None
    try:
        call_command(
            "flashsale",
            sku=SKU,
            json_path=str(path),
            master_port=LOCUST_MASTER_PORT,
            stdout=out,
            stderr=StringIO(),
            **options,
        )
    except CommandError as exc:
        error = exc
    assert path.exists(), f"flashsale wrote no JSON: {error}\n{out.getvalue()}"
    return json.loads(path.read_text()), out.getvalue(), error


def rows(document: dict) -> dict[str, dict]:
    return {run["row"]: run for run in document["runs"]}


def assert_floor_row(floor: dict, *, requests: int) -> None:
    assert floor["floor_ratio"] is None and floor["sold_out_after_s"] is None
    assert floor["status_counts"] == {"200": requests}
    assert floor["server_purchases"] == requests and floor["invariants_ok"] is True
    assert floor["server_timing"]["total_ms"]["p50"] >= 0 and floor["server_timing"]["lock_wait_ms"] is None


def locust_csv_count(html_report: str) -> int:
    """The ``POST purchase`` requests that Locust's own ``--csv`` stats table beside ``html_report`` counts."""
    with open(html_report.removesuffix(".html") + "_stats.csv", newline="") as table:
        [row] = [row for row in csv.DictReader(table) if (row["Type"], row["Name"]) == ("POST", "purchase")]
    return int(row["Request Count"])


def locust_html_count(html_report: str) -> int:
    """The ``purchase`` requests that Locust's HTML page ``html_report`` counts (from its embedded stats)."""
    text = Path(html_report).read_text()
    return int(re.search(r'"name": "purchase"[^}]*?"num_requests": (\d+)', text).group(1))


@pytest.mark.django_db(transaction=True)
def test_spike_across_two_pods_and_two_locust_workers(tmp_path):
    document, printed, error = burst(
        tmp_path,
        scenario="spike",
        backends="db",
        requests=600,
        stock=20,
        pods=2,
        locust_workers=2,
    )

    assert error is None, f"{error}\n{printed}"
    assert document["command"] and document["started_at"] and document["runs"][0]["row"] == "floor"
    # What a round trip costs on this machine, printed before the rows and kept with them.
    assert document["machine"]["wake_up"]["round_trip_us"] > 0
    assert printed.startswith("machine wake-up: one round trip through a pipe"), printed
    by_backend = rows(document)
    assert set(by_backend) == {"floor", "db"}
    for run in by_backend.values():
        assert set(run) >= RUN_KEYS, RUN_KEYS - set(run)
        assert (run["scenario"], run["pods"], run["requests"]) == ("spike", 2, 600)
        assert run["transport_errors"] == run["errors_5xx"] == 0
        assert 0 <= run["arrival_window_s"] <= 1.0 and run["drain_s"] >= run["arrival_window_s"]
        assert run["peak_db_connections"] >= 1
        assert all(len(point) == 4 for point in run["timeline"])
        assert run["timeline"][-1][2:] == [600, 600]  # purchases sent and answered, over both processes
        assert sum(count for _, count in run["latency_histogram_ms"]) == 600
    assert_floor_row(by_backend["floor"], requests=600)
    db = by_backend["db"]
    assert db["requests"] == db["server_purchases"] == 600  # both Locust processes' shares; both pods' logs
    # Locust's own CSV table counts what its page counts (written once more at the master's quit, it
    # once missed the sale's last second), and both count all 1,200 (the floor round's and the sale's): the row
    # lets its Locust workers send their last stats before it stops them (SIGKILLed as the sale
    # ended, a worker starved of a core lost them: 861 of 1,200 in a fresh clone's run).
    assert locust_csv_count(db["locust_report"]) == locust_html_count(db["locust_report"]) == 2 * 600
    assert db["status_counts"]["201"] == 20 and sum(db["status_counts"].values()) == 600
    assert (db["stock_initial"], db["stock_final"], db["orders"], db["oversold"], db["undersold"]) == (20, 0, 20, 0, 0)
    assert db["invariants_ok"] is True
    assert 0 < db["sold_out_after_s"] <= db["drain_s"]
    assert "against issue 28's targets" not in printed  # set on the deep scenario, not on a spike
    assert db["floor_ratio"] == pytest.approx(db["rps"] / by_backend["floor"]["rps"], rel=0.01)
    assert all(stock >= 0 for _, stock, _, _ in db["timeline"])
    assert Order.objects.filter(product__sku=SKU).count() == 20
    assert list(BurstRun.objects.values_list("strategy", flat=True)) == ["db"]  # the floor is not audited
    stored = BurstRun.objects.get().sentence
    assert stored == sentence(db) and stored.startswith("db: sold 20 of 20 units, none oversold;")
    assert f"{db['floor_ratio']:.2f}× floor" in stored  # the floor ratio is known when the run is stored
    assert "db: 600/600 purchases sent" in printed


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("backend", ["redis", "redlock"])
def test_spike_sells_exactly_the_stock(backend, request, tmp_path):
    request.getfixturevalue("fresh_redlock_nodes" if backend == "redlock" else "redis_client")
    document, printed, error = burst(tmp_path, backends=backend, requests=500, stock=20, floor_round=False)

    assert error is None, f"{error}\n{printed}"
    run = rows(document)[backend]
    assert run["status_counts"]["201"] == run["orders"] == 20 and run["stock_final"] == 0
    assert run["oversold"] == run["undersold"] == run["errors_5xx"] == run["transport_errors"] == 0
    assert run["requests"] == 500 and run["server_purchases"] == 500 + run["client_retries"]
    assert run["invariants_ok"] is True and run["floor_ratio"] is None and run["floor"] is None  # --no-floor
    assert [r["row"] for r in document["runs"]] == [backend]


@pytest.mark.django_db(transaction=True)
def test_deep_puts_one_unit_per_purchase_and_every_purchase_buys(tmp_path):
    document, printed, error = burst(tmp_path, scenario="deep", backends="db", requests=300, users=20)

    assert error is None, f"{error}\n{printed}"
    db = rows(document)["db"]
    assert db["scenario"] == "deep" and db["stock_initial"] == 300  # one unit a purchase (--stock is refused)
    assert db["status_counts"] == {"201": 300} and db["orders"] == 300 and db["stock_final"] == 0
    assert db["floor_ratio"] > 0 and db["invariants_ok"] is True
    assert Product.objects.get(sku=SKU).stock == 0
    # What a request cost in CPU by who spent it, the purchase round's and its floor round's.
    cost, floor_cost = db["cpu_ms"], db["floor"]["cpu_ms"]
    assert cost["pods"] > 0 and cost["locust"] > 0 and floor_cost["pods"] > 0 and floor_cost["locust"] > 0
    assert cost["total"] == pytest.approx(sum(ms for part, ms in cost.items() if part != "total"), abs=0.01)
    assert "  cpu ms a request: pods " in printed and "; floor round " in printed


@pytest.mark.django_db(transaction=True)
def test_batch_runs_every_strategy_alone_and_sharing_sections(tmp_path):
    document, printed, error = burst(
        tmp_path,
        scenario="deep",
        backends="db",
        requests=200,
        users=40,
        batch="1,8",
        batch_workers=2,
        floor_round=False,
    )

    assert error is None, f"{error}\n{printed}"
    # The batched row on its own layout: two workers, enough threads for the 40 shoppers to share
    # sections; the linger the pods inherit.
    assert (
        "4 workers × 4 threads (2 workers × 20 threads in BATCH>1 rows; a leader without a lock lingers 20 ms)"
        in printed
    )
    alone, batched = document["runs"]
    assert (alone["batch"], batched["batch"]) == (1, 8)
    assert (alone["sizing"]["workers"], batched["sizing"]["workers"]) == (4, 2)
    assert (alone["sizing"]["threads"], batched["sizing"]["threads"]) == (4, 20)
    assert (alone["sizing"]["batch_linger_ms"], batched["sizing"]["batch_linger_ms"]) == (None, 20)
    assert alone["sections"] == 200 and alone["batch_p50"] == alone["batch_p99"] == 1
    assert batched["sections"] < 200 and 1 < batched["batch_p99"] <= 8
    assert batched["server_timing"]["queue_wait_ms"]["p50"] >= 0 and alone["server_timing"]["queue_wait_ms"] is None
    for run in (alone, batched):
        assert run["status_counts"] == {"201": 200} and run["invariants_ok"] is True
        # Where each purchase's time went, from every answer's Server-Timing: means that add up.
        parts = run["breakdown"]
        assert parts["answers"] == 200 and parts["lock_wait_ms"] == 0  # db takes no lock: its row lock is in the hold
        beside = parts["queue_wait_ms"] + parts["lock_hold_ms"] + parts["outside_ms"]
        assert beside == pytest.approx(parts["total_ms"], abs=0.05)
        assert 0 < parts["commit_ms"] < parts["lock_hold_ms"] and parts["sql_statements"] >= 2
        assert 0 < parts["sql_ms"] < parts["lock_hold_ms"]  # the statements' round trips, inside the hold
        for key in ("commit_ms", "outside_ms", "sql_statements"):
            assert 0 < run["server_timing"][key]["p50"] <= run["server_timing"][key]["p99"]
    assert printed.count("(mean of 200)") == 2  # each row's breakdown line under it
    assert alone["breakdown"]["queue_wait_ms"] == 0 < batched["breakdown"]["queue_wait_ms"]
    # A batch's section sends about the statements of one purchase alone, whatever its size.
    assert batched["breakdown"]["sql_statements"] <= alone["breakdown"]["sql_statements"] + 1
    # The report of this run: each row named with its size, its time said and drawn from these means.
    html = render_report(document)
    assert "db ×1: sold 200 of 200 units" in html and "db ×8: sold 200 of 200 units" in html
    total = sum(batched["breakdown"][part] for part in BREAKDOWN_PARTS)  # as the sentence adds it
    said = f"db ×8: {ms(total)} ms per purchase on the server (mean of 200"
    # One per row, and in the batching section where the time went and what a request cost in CPU.
    assert said in html and html.count("chart-stacked") == 4
    assert "db ×8: " in html and "ms of CPU a purchase" in html
    # Issue 28's targets whose rows ran, read off them: no floor round here, so none against the floor.
    assert "against issue 28's targets" in printed and "  db batched ≥ 3× its own BATCH 1: " in printed
    assert "  db batch p50 ≥ 5: " in printed and "the floor:" not in printed


@pytest.mark.django_db(transaction=True)
def test_deep_with_the_hot_row_reads_every_row_against_it(tmp_path):
    """--hot-row: the two shapes print before the strategy rows, stay in the JSON under hot_row, sell
    exactly their purchases, and are reset before the strategy row buys; each row's hot_row_ratio
    and hold figures."""
    document, printed, error = burst(tmp_path, scenario="deep", backends="atomic", requests=200, users=20, hot_row=True)

    assert error is None, f"{error}\n{printed}"
    one, many = document["hot_row"]
    assert [(shape["name"], shape["batch"]) for shape in (one, many)] == [("hot-row 1", 1), ("hot-row 64", 64)]
    # Each shape ran at 1, 2, 4 and 8 connections (64 at a time: 200 purchases give four of them
    # work) and keeps its fastest.
    assert [tried["connections"] for tried in one["tried"]] == [1, 2, 4, 8]
    assert [tried["connections"] for tried in many["tried"]] == [1, 2, 4, 4]
    for shape in (one, many):
        assert shape["rps"] == max(tried["rps"] for tried in shape["tried"])
        assert shape["connections"] in {
            tried["connections"] for tried in shape["tried"] if tried["rps"] == shape["rps"]
        }
    for shape in (one, many):
        assert (shape["sold"], shape["stock_final"], shape["orders"], shape["oversold"]) == (200, 0, 200, 0)
        assert shape["ok"] is True and shape["rps"] > 0
    assert many["commits"] == 4  # the best run's: 200 purchases in claims of 64
    atomic, floor = rows(document)["atomic"], rows(document)["floor"]
    # Kept to 3 decimals: half a step of rounding, not 1 % (a fresh clone's run at load 9 read 0.03 for 0.0303).
    assert atomic["hot_row_ratio"] == pytest.approx(atomic["rps"] / one["rps"], abs=0.0005)
    assert "hot_row_ratio" not in floor
    assert 0 < atomic["hold_p50"] <= atomic["hold_p99"]  # atomic: its transaction, BEGIN to COMMIT
    assert floor["hold_p50"] is None and floor["hold_p99"] is None
    assert atomic["orders"] == 200 and atomic["invariants_ok"] is True  # the hot row's orders were reset first
    assert not Order.objects.filter(strategy="hot-row").exists()
    table = printed.splitlines()
    header = next(i for i, line in enumerate(table) if line.startswith("row "))
    assert table[header + 1].startswith("hot-row 1 ") and table[header + 2].startswith("hot-row 64 ")
    assert "hold p50" in table[header]


@pytest.mark.django_db(transaction=True)
def test_flash_is_a_closed_loop_on_the_given_stock(tmp_path):
    document, printed, error = burst(
        tmp_path, scenario="flash", backends="db", requests=300, stock=5, users=20, floor_round=False
    )

    assert error is None, f"{error}\n{printed}"
    db = rows(document)["db"]
    assert (db["scenario"], db["stock_initial"], db["stock_final"], db["orders"]) == ("flash", 5, 0, 5)
    assert db["status_counts"] == {"201": 5, "409": 295} and db["invariants_ok"] is True


@pytest.mark.django_db(transaction=True)
def test_repeat_reports_the_median_and_range(tmp_path):
    document, printed, error = burst(tmp_path, backends="db", requests=100, stock=5, repeat=2)

    assert error is None, f"{error}\n{printed}"
    assert [run["row"] for run in document["runs"]] == ["floor", "db"]
    for run in document["runs"]:
        low, high = run["rps_range"]
        assert run["repeats"] == 2 and low <= run["rps"] <= high
    # Every repeat's own figures are kept too, in the order they ran.
    assert [(run["round"], run["row"]) for run in document["repeats"]] == [
        (1, "floor"),
        (1, "db"),
        (2, "floor"),
        (2, "db"),
    ]
    assert sorted(run["rps"] for run in document["repeats"] if run["row"] == "db") == rows(document)["db"]["rps_range"]
    assert BurstRun.objects.count() == 2
    assert "median of 2 runs" in printed


@pytest.mark.django_db(transaction=True)
def test_unsafe_spike_oversells_in_every_sale_and_the_audit_catches_each(tmp_path):
    document, printed, error = burst(tmp_path, backends="unsafe", requests=1000, stock=20, floor_round=False, sales=2)

    assert error is not None and "invariants broken: unsafe" in str(error)
    run = rows(document)["unsafe"]
    assert [sale["sku"] for sale in run["sales"]] == [SKU, f"{SKU}-2"]  # one product per sale
    # Each sale's product is audited on its own; the row's oversold units are both sales'.
    oversold = {sku: audit(sku=sku).oversold for sku in (SKU, f"{SKU}-2")}
    assert all(units > 0 for units in oversold.values()), oversold
    assert run["invariants_ok"] is False and run["oversold"] == sum(oversold.values())
    # The row's other audit columns cover the same sales, so they agree with its oversold units
    # (orders − units that left the shelf), as the table and the report's sentence set them side by side.
    reports = [audit(sku=sku) for sku in (SKU, f"{SKU}-2")]
    assert run["orders"] == sum(report.orders for report in reports)
    assert run["stock_initial"] == sum(report.initial for report in reports)
    assert run["stock_final"] == sum(report.stock for report in reports)
    assert run["orders"] - (run["stock_initial"] - run["stock_final"]) == run["oversold"] - run["lost"]
    # The BurstRun kept for the admin is its sale's product's own audit, as the database has it.
    stored = BurstRun.objects.get()
    assert (stored.orders, stored.oversold, stored.stock_final) == (
        audit(sku=stored.sku).orders,
        audit(sku=stored.sku).oversold,
        audit(sku=stored.sku).stock,
    )
    assert {problem.split(":")[0] for problem in run["problems"]} == {"sale 1", "sale 2"}
    assert BurstRun.objects.get().invariants_ok is False
    assert [line.split()[-1] for line in printed.splitlines() if line.startswith("unsafe ")] == ["NO"]


@pytest.mark.django_db(transaction=True)
def test_a_row_of_three_sales_is_its_median_sale_against_its_best_floor_round(tmp_path):
    document, printed, error = burst(tmp_path, backends="atomic", requests=300, stock=10, sales=3)

    assert error is None, f"{error}\n{printed}"
    by_backend = rows(document)
    run, floor = by_backend["atomic"], by_backend["floor"]
    sales = sorted(run["sales"], key=lambda sale: sale["rps"])
    assert [sale["sale"] for sale in run["sales"]] == [1, 2, 3]
    assert run["rps"] == sales[1]["rps"] and len(run["floor_rounds_rps"]) == 3
    assert floor["rps"] == pytest.approx(max(run["floor_rounds_rps"]), abs=0.1)
    assert run["floor_ratio"] == pytest.approx(run["rps"] / floor["rps"], rel=0.01)
    for sku in (SKU, f"{SKU}-2", f"{SKU}-3"):  # every sale sold its 10 units, no more
        assert Product.objects.get(sku=sku).stock == 0
        assert Order.objects.filter(product__sku=sku).count() == 10
    assert BurstRun.objects.get().sku == sales[1]["sku"]  # the row stored is its median sale
    assert "  sales: " in printed and "(median " in printed


@pytest.mark.django_db(transaction=True)
def test_a_row_that_fails_to_run_leaves_the_rows_before_it_in_the_json_and_the_report(tmp_path):
    """Seen by a helper: ``--strategies db,etcd`` whose etcd could not start ended in one line, but
    wrote neither --json nor --report: the db row, run and audited, was lost with it; and the two
    etcd members that had started were left running."""
    report = tmp_path / "report.html"
    cluster = project_cluster()
    was_running = cluster.running()
    cluster.wipe()  # the suite's cluster, if it ran, starts again afresh below
    try:
        with socket.socket() as taken:  # the first member's client port: that member cannot start
            taken.bind(("127.0.0.1", ETCD_BASE_PORT))
            taken.listen()
            started = time.monotonic()
            document, printed, error = burst(
                tmp_path, backends="db,etcd", requests=100, stock=5, report_path=str(report)
            )
            took = time.monotonic() - started

        assert error is not None and "etcd cluster not healthy" in str(error) and "\n" not in str(error)
        # The member that exited at once is named at once: the cluster's start waited its whole 20 s.
        assert "exited with" in str(error) and took < 15, (took, str(error))
        assert [run["row"] for run in document["runs"]] == ["floor", "db"]
        assert document["incomplete"] == str(error)
        assert rows(document)["db"]["invariants_ok"] is True and BurstRun.objects.count() == 1
        assert report.is_file() and "The command stopped before its other rows: etcd cluster not healthy" in (
            report.read_text()
        )
        # The two members that did start are stopped with the one that could not (they ran on before).
        assert [member.pid() for member in cluster] == [None, None, None]
    finally:
        cluster.wipe()
        if was_running:
            cluster.start()


@pytest.mark.django_db
@pytest.mark.parametrize(
    "options, message",
    [
        ({"backends": "db,mutex"}, "unknown strategy mutex"),
        ({"backends": "floor"}, "unknown strategy floor"),
        ({"backends": ""}, "unknown strategy (none given)"),
        ({"backends": "db,db"}, "names a strategy twice"),
        ({"scenario": "burst"}, "--scenario 'burst'"),
        ({"requests": 0}, "--requests must be 1 or more"),
        ({"stock": -1}, "--stock must be 0 or more"),
        # Seen by a helper: 3,000,000,000 passed and the run ended in a traceback; nan and inf
        # passed, and a burst with an endless timeout never gives up.
        ({"stock": 3_000_000_000}, "--stock 3000000000: the units on sale would be more than the stock column"),
        ({"timeout": float("nan")}, "--timeout must be 1 or more, not nan"),
        ({"timeout": float("inf")}, "--timeout must be 1 or more, not inf"),
        ({"users": 0}, "--users must be 1 or more"),
        ({"pods": 0}, "--pods must be 1 or more"),
        ({"repeat": 0}, "--repeat must be 1 or more"),
        ({"sales": 0}, "--sales must be 1 or more"),
        (
            {"sales": 2, "scenario": "deep", "fault": "kill-holder"},
            "--fault runs one sale a row (the fault is injected into it): drop --sales",
        ),
        ({"locust_workers": 11}, "--locust-workers 11 is more than --requests 10"),
        ({"pods": 100, "workers": 8}, "lower --pods or --workers"),
        ({"sku": "not a slug!"}, "--sku"),
        # Seen by a helper: passed, and the second sale's product, <sku>-2, was too long for its column.
        (
            {"sku": "s" * 63, "sales": 2},
            f"--sku {'s' * 63}: --sales 2 names its sales' products up to {'s' * 63}-2, longer than 64 characters: "
            "give a shorter --sku",
        ),
        ({"balancer": "nginx"}, "--balancer 'nginx': use one or both of none, haproxy"),
        ({"balancer": "haproxy,haproxy"}, "each once"),
        ({"master_port": 0}, "--master-port 0: use a port from 1 to 65535"),
        ({"server": "tornado"}, "--server 'tornado': use one or both of wsgi, asgi, each once"),
        ({"server": "asgi,asgi"}, "--server 'asgi,asgi': use one or both of wsgi, asgi, each once"),
        (
            {"server": "wsgi,asgi", "backends": "db,etcd"},
            "--server asgi cannot run etcd (etcd: etcd3gw is a blocking client: its waits for the lock would "
            "stall the event loop): run it with --server wsgi",
        ),
        ({"batch": "1,0"}, "--batch '1,0'"),
        ({"batch": "1,x"}, "--batch '1,x'"),
        ({"batch": "8,8"}, "--batch '8,8'"),
        ({"batch": "1,8", "batch_threads": 0}, "--batch-threads must be 1 or more"),
        ({"batch": "1,8", "batch_workers": 0}, "--batch-workers must be 1 or more, not 0"),
        ({"batch": "1,8", "queue": "redis"}, "--queue 'redis': use one or both of local, shared, each once"),
        ({"batch": "1,8", "queue": "shared,shared"}, "--queue 'shared,shared'"),
        (
            {"hot_row": True},
            "--hot-row runs in the deep scenario (one unit on the shelf per purchase): use --scenario deep, not spike",
        ),
        ({"hot_row": True, "scenario": "flash"}, "--hot-row runs in the deep scenario"),
    ],
)
def test_bad_arguments_start_nothing(options, message, tmp_path):
    path = tmp_path / "burst.json"
    options = {"backends": "db", "requests": 10, "stock": 1, "json_path": str(path), **options}
    assert message in flashsale_refused(options, output=path)


@pytest.mark.django_db
@pytest.mark.parametrize(
    "options, message",
    [
        (
            {"queue": "shared"},
            "--queue shared: only a --batch size above 1 queues (a BATCH=1 row queues nowhere): "
            "add one, e.g. --batch 1,64, or drop --queue",
        ),
        ({"queue": "local,shared", "batch": "1"}, "--queue local,shared: only a --batch size above 1 queues"),
        (
            {"scenario": "deep", "stock": 5},
            "--stock 5: the deep scenario puts one unit on the shelf per purchase (--requests): "
            "drop --stock, or sell --stock units with --scenario spike or flash",
        ),
        (
            {"batch_workers": 2},
            "--batch-workers 2: only a row with a --batch size above 1 runs on it (a BATCH=1 row keeps --workers): "
            "add one, e.g. --batch 1,64, or drop --batch-workers",
        ),
        ({"batch_threads": 50, "batch": "1"}, "--batch-threads 50: only a row with a --batch size above 1 runs on it"),
        # Seen by a helper: --yardstick with --no-floor ran the plain client after every row and threw its
        # figure away (it is kept beside the floor round); with --fault it was not run at all.
        (
            {"yardstick": True, "floor_round": False},
            "--yardstick is read against the floor round, which --no-floor leaves out: drop one",
        ),
        (
            {"yardstick": True, "scenario": "deep", "backends": "redis", "fault": "restart-redis"},
            "--yardstick is read against the floor round, which --fault (a fault run has no floor round) leaves out",
        ),
        # Seen by a helper: kill-holder took --fault-hold 5 and held nothing; a pause-worker hold shorter than
        # etcd's 2 s lease failed only when etcd's row began, after the rows before it, whose figures were lost.
        (
            {"scenario": "deep", "backends": "redis", "fault": "kill-holder", "fault_hold": 5.0},
            "--fault-hold 5: kill-holder holds nothing",
        ),
        (
            {"scenario": "deep", "backends": "redis,etcd", "fault": "pause-worker", "fault_hold": 1.5},
            "--fault-hold 1.5: pause-worker must freeze a holder past its lease (etcd 2000 ms)",
        ),
    ],
)
def test_an_option_no_row_would_use_is_refused_before_the_run(options, message, tmp_path, monkeypatch):
    """Seen by a helper: ``--queue shared`` with only ``--batch 1`` (no row queues), ``--stock``
    with ``--scenario deep`` (its shelf is --requests) and ``--batch-workers``/``--batch-threads``
    with no batched row ran, the option silently ignored."""
    monkeypatch.setattr(Flashsale, "run_rows", lambda *args, **kwargs: pytest.fail(f"the rows ran with {options}"))
    path = tmp_path / "burst.json"
    options = {"backends": "db", "requests": 10, "json_path": str(path), **options}
    assert message in flashsale_refused(options, output=path)


@pytest.mark.django_db
def test_one_file_for_both_outputs_is_refused_before_the_run(tmp_path):
    """Seen by reading write_outputs: --json P --report P wrote the JSON, then the HTML over it."""
    path = tmp_path / "both"
    with pytest.raises(CommandError) as excinfo:
        call_command(
            "flashsale", backends="db", requests=10, json_path=str(path), report_path=str(path), stdout=StringIO()
        )
    assert str(excinfo.value) == f"--report {path}: is the --json file too: give each its own file"
    assert not Product.objects.filter(sku=SKU).exists()


@pytest.mark.django_db
@pytest.mark.parametrize("sku, sales", [("phone-x", 1), ("phone", 2)])
def test_a_sku_of_the_shops_own_product_is_refused_before_the_run(sku, sales, make_product, tmp_path, monkeypatch):
    """Seen by a helper: ``flashsale --sku phone-x`` (a product on the storefront) took that product
    as the burst's own: its orders deleted, renamed "Flash-burst phone" and taken off the home page.
    With --sales 2 the second sale's product, ``<sku>-2``, is taken the same way."""
    from inventory.services import purchase

    product = make_product("phone-x", stock=5, name="Phone X")
    assert purchase(sku="phone-x", customer="alice", quantity=1).confirmed
    monkeypatch.setattr(Flashsale, "run_rows", lambda *args, **kwargs: pytest.fail("the rows ran"))
    if sales > 1:
        Product.objects.filter(pk=product.pk).update(sku="phone-2")
    taken = "phone-x" if sales == 1 else "phone-2"
    with pytest.raises(CommandError) as excinfo:
        call_command("flashsale", backends="db", requests=10, sku=sku, sales=sales, stdout=StringIO())
    assert str(excinfo.value) == (
        f"--sku {sku}: {taken} is a product of the shop (on its home page), and the burst resets its product's "
        "sale, deleting its orders: give the burst a sku of its own, e.g. the default flash-burst"
    )
    product.refresh_from_db()
    assert (product.name, product.listed, product.stock, Order.objects.filter(product=product).count()) == (
        "Phone X",
        True,
        4,
        1,
    )
    assert not BurstRun.objects.exists()


@pytest.mark.django_db
@pytest.mark.parametrize("flag, name", [("json_path", "--json"), ("report_path", "--report")])
def test_an_output_under_a_file_is_refused_before_the_run(flag, name, tmp_path):
    """Seen with ``--json README.md/x.json``: the burst ran, then ended in a traceback
    (FileExistsError) with its figures unwritten."""
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    options = {"backends": "db", "requests": 10, "stock": 1, flag: str(blocker / "out")}
    with pytest.raises(CommandError) as excinfo:
        call_command("flashsale", stdout=StringIO(), stderr=StringIO(), **options)
    assert str(excinfo.value) == f"{name} {blocker / 'out'}: {blocker} is a file, not a folder: give a path in a folder"
    assert not Product.objects.filter(sku=SKU).exists()
    assert not BurstRun.objects.exists()


@pytest.mark.django_db
@pytest.mark.parametrize(
    "flag, name, value", [("json_path", "--json", "/proc/no-such/x.json"), ("report_path", "--report", "/proc/x.html")]
)
def test_an_output_in_a_folder_that_cannot_be_made_is_refused_before_the_run(flag, name, value, monkeypatch):
    """Seen as root (2026-12-05): ``--json /proc/nope/x.json`` passed the check (``os.access`` says
    root may write anywhere), the burst ran, then ended in a FileNotFoundError traceback with its
    figures unwritten; ``--report /sys/x.html`` in a PermissionError making ``locust/`` beside it.
    The check now makes the folder and a file in it, and removes them."""
    monkeypatch.setattr(Flashsale, "run_rows", lambda *args, **kwargs: pytest.fail("the rows ran"))
    with pytest.raises(CommandError) as excinfo:
        call_command("flashsale", backends="db", requests=10, stdout=StringIO(), stderr=StringIO(), **{flag: value})
    # Root is told the folder cannot be made (or written); another user that it may not write there.
    assert re.fullmatch(rf"{name} {value}: (cannot|this user may not) write in /proc.*", str(excinfo.value))
    assert not Product.objects.filter(sku=SKU).exists()


def test_the_output_check_leaves_no_folder_behind(tmp_path):
    """A good path's missing folders are made to try them and removed; the writer makes them again."""
    try_writing_in(tmp_path / "a" / "b", "--json", "x")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.django_db(transaction=True)
def test_rows_through_haproxy_interleave_with_direct_ones_and_say_so(tmp_path):
    document, printed, error = burst(
        tmp_path, scenario="spike", backends="db", requests=400, stock=20, pods=2, balancer="none,haproxy"
    )

    assert error is None, f"{error}\n{printed}"
    runs = document["runs"]
    assert [(run["row"], run["balancer"]) for run in runs] == [
        ("floor", "none"),
        ("floor", "haproxy"),
        ("db", "none"),
        ("db", "haproxy"),
    ]
    for run in runs:
        assert run["locust_workers"] == 1 and run["invariants_ok"] is True, run["problems"]
        assert run["requests"] == run["server_purchases"] == 400  # HAProxy resent no POST
        assert run["arrival_window_s"] <= 1.0 and run["transport_errors"] == 0
    via_haproxy = runs[3]
    assert via_haproxy["status_counts"]["201"] == 20 and via_haproxy["oversold"] == 0
    assert via_haproxy["floor_ratio"] == pytest.approx(via_haproxy["rps"] / runs[1]["rps"], rel=0.01)
    assert Order.objects.filter(product__sku=SKU).count() == 20


@pytest.mark.django_db(transaction=True)
def test_rows_on_wsgi_and_asgi_run_side_by_side_and_say_so(tmp_path, redis_client):
    """``--server wsgi,asgi``: every row on gunicorn's threads, then on uvicorn workers (the purchase
    on the event loop, the asyncio lock for redis), each against the floor of its own server."""
    document, printed, error = burst(
        tmp_path, scenario="spike", backends="db,redis", requests=400, stock=20, server="wsgi,asgi"
    )

    assert error is None, f"{error}\n{printed}"
    runs = document["runs"]
    assert [(run["row"], run["server"]) for run in runs] == [
        ("floor", "wsgi"),
        ("floor", "asgi"),
        ("db", "wsgi"),
        ("db", "asgi"),
        ("redis", "wsgi"),
        ("redis", "asgi"),
    ]
    for run in runs:
        assert run["invariants_ok"] is True, run["problems"]
        # uvicorn's access log counts them as gunicorn's does: every purchase, and every resend of one
        assert run["requests"] == 400 and run["server_purchases"] == 400 + run["client_retries"], printed
        assert run["errors_5xx"] == run["transport_errors"] == 0
    for run in runs[2:]:
        assert (run["status_counts"]["201"], run["oversold"], run["undersold"]) == (20, 0, 0)
        assert run["floor"]["rps"] and run["floor_ratio"] == pytest.approx(run["rps"] / run["floor"]["rps"], rel=0.01)
    assert runs[5]["server_timing"]["lock_wait_ms"]["p50"] >= 0  # the asyncio lock's wait, in Server-Timing
    header = next(line for line in printed.splitlines() if line.startswith("row ")).split()
    assert header[:3] == ["row", "via", "server"]
    assert [line.split()[2] for line in printed.splitlines() if line.startswith(("db ", "redis "))] == [
        "wsgi",
        "asgi",
        "wsgi",
        "asgi",
    ]
