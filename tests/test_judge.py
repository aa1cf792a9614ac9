"""The row's verdict on the pods' access-log count (loadtests/judge.py): balancer answers and resends."""

from __future__ import annotations

import pytest

from loadtests.judge import judge
from loadtests.plan import BurstPlan

PLAN = BurstPlan(requests=100, stock=10, scenario="deep")


def figures(**changes) -> dict:
    base = {
        "sent": 100,
        "answered": 100,
        "client_retries": 0,
        "balancer_answers": 0,
        "transport_resends": 0,
        "transport_errors": 0,
        "page_failures": 0,
        "constraint_hits": 0,
        "server_purchases": 100,
        "arrival_window_s": 0.5,
        "timeline": [],
    }
    return {**base, **changes}


@pytest.mark.parametrize(
    "changes, ok",
    [
        ({}, True),
        ({"server_purchases": 99}, False),  # a POST the pods never logged, with no reason
        ({"client_retries": 5, "server_purchases": 105}, True),  # the shop's 503s, resent
        ({"client_retries": 5, "balancer_answers": 5, "server_purchases": 100}, True),  # HAProxy's own 503s
        ({"client_retries": 5, "balancer_answers": 5, "server_purchases": 105}, False),  # more than reached them
        ({"transport_resends": 3, "server_purchases": 101}, True),  # two died unlogged
        ({"transport_resends": 3, "server_purchases": 99}, False),  # more than were resent
        # kill-holder: each SIGKILLed worker may have answered, unlogged, one request per thread (4)
        ({"transport_resends": 3, "kills": [{}], "server_purchases": 100}, True),
        ({"transport_resends": 3, "kills": [{}], "server_purchases": 96}, True),
        ({"transport_resends": 3, "kills": [{}], "server_purchases": 95}, False),
        # kill-pod: its pod's workers were SIGKILLed too, each thread maybe after an answer and before
        # its line (a fresh clone's full run, 2026-12-07: "logged 1499 purchase POSTs, Locust sent
        # 1550 ... 50 unanswered"): up to workers x threads (4 x 4) more than the resends
        ({"fault": "kill-pod", "transport_resends": 3, "server_purchases": 96}, True),
        ({"fault": "kill-pod", "transport_resends": 3, "server_purchases": 84}, True),
        ({"fault": "kill-pod", "transport_resends": 3, "server_purchases": 83}, False),
    ],
)
def test_the_access_log_count_allows_only_what_the_balancer_answered_or_a_dead_pod_lost(changes, ok):
    problems = judge(backend="db", plan=PLAN, figures=figures(**changes), report=None, errors_5xx=0)
    assert (problems == []) is ok, problems
    if not ok:
        assert "the pods logged" in problems[0]


def floor_round(**changes) -> dict:
    """A row's best floor round as flashsale keeps it (``floor`` in the JSON), before it was judged."""
    base = {"sent": 100, "answered": 100, "rps": 2000.0, "drain_s": 0.05, "status_counts": {"200": 100}}
    base.update(arrival_window_s=0.01, p50_ms=5.0, p95_ms=9.0, p99_ms=10.0, server_posts=100, server_timing={})
    return {**base, "timeline": [], "latency_histogram_ms": [], **changes}


def strategy_row(floor: dict) -> dict:
    keys = ("scenario", "fault", "fault_description", "fenced", "pods", "balancer", "server", "locust_workers")
    return {
        **dict.fromkeys(keys),
        "row": "db",
        "sizing": {},
        "floor": floor,
        "locust_report": None,
        "stock_initial": 10,
        "peak_db_connections": 5,
    }


@pytest.mark.parametrize(
    "changes, problem",
    [
        # Before, a floor round whose 40 shoppers got no HTTP answer (or a 403) was the table's
        # floor row with "ok yes", and every ×floor of its row was read against its rate.
        ({"status_counts": {"200": 60, "0": 40}}, "db's floor round: 40 answers other than 200 (40 × no answer)"),
        ({"status_counts": {"200": 97, "403": 3}}, "db's floor round: 3 answers other than 200 (3 × 403)"),
        ({"answered": 90, "status_counts": {"200": 90}}, "db's floor round: sent 100, 90 answered, not 100"),
    ],
)
def test_a_floor_round_that_did_not_answer_every_shopper_200_is_not_ok(changes, problem):
    from loadtests.burst import floor_row

    assert floor_row([strategy_row(floor_round())])["invariants_ok"] is True
    floor = floor_row([strategy_row(floor_round(**changes))])
    assert floor["invariants_ok"] is False and floor["problems"] == [problem]


def test_every_floor_round_of_a_row_is_judged_against_its_requests():
    from loadtests.judge import floor_problems

    assert floor_problems({"sent": 100, "answered": 100, "status_counts": {"200": 100}}, requests=100) == []
    assert floor_problems({"sent": 80, "answered": 80, "status_counts": {"200": 80}}, requests=100) == [
        "sent 80, 80 answered, not 100"
    ]


@pytest.mark.parametrize("confirmed, orders", [(10, 9), (9, 10)])
def test_confirmed_purchases_that_the_orders_do_not_match_break_the_row(confirmed, orders):
    """Before, a sale whose stock balanced its orders was ok whatever its shoppers were told: 10
    confirmations for 9 orders (a shopper told "confirmed" who holds nothing) passed."""
    from inventory.audit import AuditReport

    report = AuditReport(
        sku="flash-burst", initial=10, stock=10 - orders, sold=orders, ordered=orders, orders=orders,
        over_limit_customers=0, oversold=0, lost=0, undersold=0,
    )  # fmt: skip
    counts = {"201": confirmed, "409": 100 - confirmed}
    problems = judge(backend="db", plan=PLAN, figures=figures(status_counts=counts), report=report, errors_5xx=0)
    assert problems == [f"{confirmed} purchases were confirmed, but the database holds {orders} orders"]
    balanced = {"201": orders, "409": 100 - orders}
    assert judge(backend="db", plan=PLAN, figures=figures(status_counts=balanced), report=report, errors_5xx=0) == []
