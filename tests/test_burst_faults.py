"""Faults inside the burst: ``manage.py flashsale --fault NAME`` against real pods, Locust, PostgreSQL
and the real lock services, which the fault kills and restarts.

Each run is a small deep sale (every purchase through the lock); the assertions come from the
command's JSON and from the database. ``transaction=True``: the pods must see the committed rows.
"""

from __future__ import annotations

import itertools
import json
import re
import subprocess
import sys
import time
from io import StringIO

import pytest
from django.conf import settings
from django.core.management import CommandError, call_command
from django.db.models import Count

from inventory.models import BurstRun, Order, Product
from loadtests.faultrun import PAUSE_LEASE_DEFAULT_MS, PRIVATE_PORT_OFFSET, RESUME_LIMIT_S, FaultRun, timing_problem
from loadtests.figures import fault_phases, longest_gap, resumed_after
from loadtests.judge import GAP_LIMIT_S, judge
from loadtests.management.commands.flashsale import Command as Flashsale
from loadtests.plan import BurstPlan
from loadtests.pods import database_url
from processes.nodes import RedisNode
from processes.pidfile import child_pids
from tests.helpers import flashsale_refused
from tests.slots import LOCUST_MASTER_PORT

SKU = "flash-burst"
REQUESTS = 600
PAUSE_REQUESTS = 1500
KILL_POD_REQUESTS = 1500


def test_phases_split_purchases_by_send_time_and_resumption_counts_from_the_recovery():
    # [sent, answered, status, lock ms, resends] on the wall clock; the sale opened at 100.0.
    purchases = [
        [100.1, 100.2, 201, 1.0, []],
        [100.9, 103.5, 201, 900.0, [101.2]],
        [101.5, 101.6, 503, 5.0, [101.6]],
        [102.0, 102.1, 201, 2.0, []],
        [102.1, 102.4, 503, 1.0, [102.4]],
        [102.2, 102.6, 201, 3.0, []],
    ]

    phases = fault_phases(purchases, opened_at=100.0, injected_at=101.0, recovered_at=102.0)

    assert [(p["name"], p["start_s"], p["end_s"]) for p in phases] == [
        ("before", 0.0, 1.0),
        ("during", 1.0, 2.0),
        ("after", 2.0, 3.5),
    ]
    assert [p["status_counts"] for p in phases] == [{"201": 2}, {"503": 1}, {"201": 2, "503": 1}]
    # By answer time: the purchase sent before the fault was answered 503 during it.
    assert [p["busy_answers"] for p in phases] == [0, 2, 1]
    assert phases[0]["p99_ms"] == pytest.approx(2600.0)
    # The purchase sent during the fault and confirmed at 103.5 is not the first one after 102.0.
    assert resumed_after(purchases, recovered_at=102.0) == pytest.approx(0.1)
    assert resumed_after(purchases, recovered_at=None) is None
    assert resumed_after(purchases, recovered_at=103.6) is None
    assert [p["name"] for p in fault_phases(purchases, opened_at=100.0, injected_at=None, recovered_at=None)] == [
        "before"
    ]


def test_the_longest_gap_counts_from_a_second_after_the_recovery_to_the_end():
    # [sent, answered, status, ...]: confirmations at 103.0, 103.4, 110.0; a 503 answered at 111.5.
    purchases = [
        [101.0, 101.5, 201, 1.0, []],
        [102.5, 103.0, 201, 1.0, []],
        [103.3, 103.4, 201, 1.0, []],
        [103.5, 110.0, 201, 9000.0, []],
        [104.0, 111.5, 503, 5000.0, []],
    ]
    # From 102.0: 102→103 (1.0), 103→103.4, 103.4→110 (6.6), 110→111.5 (the end).
    assert longest_gap(purchases, since=102.0) == pytest.approx(6.6)
    assert longest_gap(purchases[:3], since=102.0) == pytest.approx(1.0)
    assert longest_gap(purchases, since=None) is None
    assert longest_gap(purchases, since=112.0) is None  # the run ended before the window opened


def test_the_judge_fails_a_fault_run_whose_gap_exceeds_the_limit():
    plan = BurstPlan(requests=1, stock=1, scenario="deep", fault="restart-redis")
    figures = {
        "constraint_hits": 0,
        "timeline": [],
        "transport_errors": 0,
        "page_failures": 0,
        "sent": 1,
        "answered": 1,
        "client_retries": 0,
        "server_purchases": 1,
        "arrival_window_s": 0.0,
        "fault": "restart-redis",
    }
    for gap, failed in ((None, False), (GAP_LIMIT_S, False), (GAP_LIMIT_S + 0.01, True)):
        problems = judge(
            backend="redis", plan=plan, figures={**figures, "longest_gap_s": gap}, report=None, errors_5xx=0
        )
        assert bool(problems) is failed, (gap, problems)
    assert "no purchase was confirmed for 2.01s after restart-redis recovered (limit 2s)" in problems


def test_a_fault_that_outlasts_the_sale_says_recovery_was_not_observed():
    """Seen in a full run: kill-minority held its nodes down past the last purchase, and the row
    failed as "no order was confirmed after kill-minority recovered", read as broken invariants.
    Nothing was left to buy: the run could not show the sale resuming, which is another thing."""
    timing = {"error": None, "injected": 10.0, "recovered": 12.0}
    outlasted = timing_problem("kill-minority", **timing, resumed=None, last_answer=11.5)
    assert outlasted.startswith("recovery not observed: every purchase was answered before kill-minority recovered")
    assert "--fault-hold" in outlasted
    stuck = timing_problem("kill-minority", **timing, resumed=None, last_answer=14.0)
    assert stuck == "no order was confirmed after kill-minority recovered"  # answers after it, none confirmed
    assert timing_problem("kill-minority", **timing, resumed=0.4, last_answer=14.0) is None
    late = timing_problem("kill-minority", **timing, resumed=RESUME_LIMIT_S + 0.5, last_answer=20.0)
    assert late.startswith("sales resumed 2.50s after kill-minority recovered")
    assert timing_problem("kill-holder", **timing, resumed=RESUME_LIMIT_S + 0.5, last_answer=20.0) is None
    assert timing_problem("kill-pod", error=None, injected=None, recovered=None, resumed=None, last_answer=3.0) == (
        "the burst ended before kill-pod was injected: use more --requests"
    )


@pytest.fixture
def master_of_one_idle_worker():
    """A process with one child, as a gunicorn master whose one worker never enters its section."""
    spawn = "import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(30)'])"
    parent = subprocess.Popen([sys.executable, "-c", f"{spawn}; time.sleep(30)"])
    deadline = time.monotonic() + 5
    while not child_pids(parent.pid) and time.monotonic() < deadline:
        time.sleep(0.02)
    yield parent.pid
    for pid in child_pids(parent.pid):
        subprocess.run(["kill", "-CONT", str(pid)])
        subprocess.run(["kill", str(pid)])
    parent.kill()
    parent.wait()


@pytest.mark.django_db(transaction=True)
def test_a_pause_that_froze_no_holder_is_the_rows_problem(master_of_one_idle_worker):
    """pause-worker saw no worker inside its section in time and froze one outside it: the row
    passed, its figures read as a paused holder's, and only its description said "not inside"."""
    [worker] = child_pids(master_of_one_idle_worker)
    with FaultRun(
        "pause-worker", backend="redis", fenced=True, requests=30, database_url=database_url(), sku=SKU
    ) as run:
        run.fault.search_s = 0.05  # nobody is ever inside (the probe asks PostgreSQL): it gives up soon
        run.start(pod_pid=lambda: master_of_one_idle_worker, answered=lambda: 30)
        deadline = time.monotonic() + 10
        while run.timer.injected_wall is None and time.monotonic() < deadline:
            time.sleep(0.02)
        run.finish()  # recovered at once
        back = run.timer.recovered_wall
        purchases = [[back - 1.0, back - 0.5, 201, 1.0, []], [back + 0.05, back + 0.1, 201, 1.0, []]]
        figures = run.figures(purchases, opened_at=back - 2.0)

    assert (run.fault.pid, run.fault.holder) == (worker, False)
    assert figures["paused_into_section_ms"] is None
    assert figures["fault_problems"] == [
        f"no holder was paused: worker {worker} was frozen outside its section (none found inside in time), "
        "so this row shows nothing of a paused holder"
    ]


def test_an_unfenced_pause_of_no_holder_is_not_read_as_a_missed_race():
    run = {"row": "redlock", "fault": "pause-worker", "invariants_ok": False, "oversold": 0}
    run["problems"] = ["no holder was paused: worker 7 was frozen outside its section (none found inside in time)"]
    out = StringIO()
    with pytest.raises(CommandError, match=r"^no holder was paused in redlock: no holder was paused: worker 7"):
        Flashsale(stdout=out).check_runs([run], fault="pause-worker", unfenced=True)
    assert "the race was not hit" not in out.getvalue()
    assert "pause-worker froze no holder in redlock: the run shows nothing of the race" in out.getvalue()


def fault_run(tmp_path, requests: int = REQUESTS, **options) -> tuple[dict, str, CommandError | None]:
    path = tmp_path / "burst.json"
    out = StringIO()
    error = None
    try:
        call_command(
            "flashsale",
            sku=SKU,
            scenario="deep",
            requests=requests,
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


def assert_fault_row(run: dict, *, fault: str, backend: str, requests: int = REQUESTS) -> None:
    """The fault's keys, its three phases covering every purchase, and every invariant held."""
    assert (run["row"], run["fault"], run["scenario"]) == (backend, fault, "deep")
    assert [phase["name"] for phase in run["phases"]] == ["before", "during", "after"]
    assert run["phases"][0]["start_s"] == 0.0
    for earlier, later in itertools.pairwise(run["phases"]):
        assert earlier["end_s"] == later["start_s"]
    assert sum(sum(phase["status_counts"].values()) for phase in run["phases"]) == requests
    assert run["phases"][0]["status_counts"].get("201", 0) >= requests // 3 - 100  # injected after a third
    assert all(phase["p99_ms"] > 0 for phase in run["phases"] if phase["status_counts"])
    busy = run["client_retries"] + run["status_counts"].get("503", 0)
    assert sum(phase["busy_answers"] for phase in run["phases"]) == busy
    assert 0 <= run["resumed_after_s"] <= RESUME_LIMIT_S
    assert run["max_lock_wait_ms"] is not None
    assert run["max_lock_wait_ms"] <= settings.INVENTORY["ACQUIRE_TIMEOUT_MS"] + 1000
    assert run["invariants_ok"] is True, run["problems"]
    assert (run["oversold"], run["lost"], run["errors_5xx"], run["transport_errors"]) == (0, 0, 0, 0)
    # From the database: every confirmed purchase is one order, and the stock fell by exactly that.
    product = Product.objects.get(sku=SKU)
    orders = Order.objects.filter(product=product).count()
    assert orders == run["status_counts"].get("201", 0) == run["orders"]
    assert product.initial_stock - product.stock == orders
    assert BurstRun.objects.get(strategy=backend).invariants_ok is True


@pytest.mark.slow
@pytest.mark.xdist_group("burst")
@pytest.mark.django_db(transaction=True)
# One failure in six runs alone after the 1 s hold, its output not kept: rerun up to twice until seen.
@pytest.mark.flaky(reruns=2)
def test_kill_minority_of_redlock_nodes_keeps_selling(fresh_redlock_nodes, tmp_path):
    # The nodes come back after 1 s: with the short hold the 600 purchases took 3.8 s in all, and
    # with the fault's default hold (about 2 s) none were left to show the sales resuming. Since the
    # users share the round's purchases (loadtests/sale.py) 600 were all sold within the hold on
    # this machine ("recovery not observed", 3 of 3 tries): three times as many.
    document, printed, error = fault_run(
        tmp_path, 3 * REQUESTS, backends="redlock", fault="kill-minority", fault_hold=1.0
    )

    assert error is None, f"{error}\n{printed}"
    [run] = document["runs"]  # no floor row in a fault run
    assert_fault_row(run, fault="kill-minority", backend="redlock", requests=3 * REQUESTS)
    assert "2 of 5 Redlock nodes" in run["fault_description"]
    assert "  during " in printed and "sales resumed" in printed
    assert all(node.ping() for node in fresh_redlock_nodes)  # the killed two were restarted


@pytest.mark.slow
@pytest.mark.xdist_group("burst")
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("server", ["wsgi", "asgi"])
# Seen once in a fresh clone's full run (2026-12-05, asgi): the fault's search found no worker
# inside its section in its window and froze one that was not (the row says so); 4 of 4 alone passed.
@pytest.mark.flaky(reruns=2)
def test_pause_worker_freezes_a_holder_past_its_lease_on_either_server(server, tmp_path):
    # The article's pause in a real server: a worker stopped inside its section (on ASGI: its
    # whole event loop, every purchase in flight on it) past the lease; the rest sell on, and its
    # late write meets the storage check. 1,500 purchases: enough left after the recovery to
    # show the sale resuming.
    document, printed, error = fault_run(
        tmp_path, requests=PAUSE_REQUESTS, backends="redis", fault="pause-worker", server=server
    )

    assert error is None, f"{error}\n{printed}"
    [run] = document["runs"]
    assert run["server"] == server
    assert_fault_row(run, fault="pause-worker", backend="redis", requests=PAUSE_REQUESTS)
    assert re.search(r"inside its section, \d+ ms into it \(lease 1000 ms\)$", run["fault_description"]), run[
        "fault_description"
    ]
    # Someone waited out what was left of the frozen holder's lease (LOCK_TTL_MS 1,000 under this
    # fault): at least 500 ms when it was frozen early in its section, as the fault aims to (CI,
    # 2026-12-04: a holder frozen late left 312 ms to wait, and this test asked for 500). 200 ms for
    # the grant before its transaction began and the probe's own delay.
    left_ms = PAUSE_LEASE_DEFAULT_MS - run["paused_into_section_ms"]
    assert run["max_lock_wait_ms"] >= min(500, left_ms - 200), run["paused_into_section_ms"]
    assert BurstRun.objects.get(strategy="redis").server == server  # the admin's history names it too


@pytest.mark.slow
@pytest.mark.xdist_group("burst")
@pytest.mark.django_db(transaction=True)
def test_restart_redis_restarts_a_private_node_never_the_shops_redis(redis_client, tmp_path):
    private = RedisNode(port=settings.REDLOCK_BASE_PORT + PRIVATE_PORT_OFFSET, run_dir=tmp_path)

    document, printed, error = fault_run(tmp_path, backends="redis", fault="restart-redis")

    assert error is None, f"{error}\n{printed}"
    [run] = document["runs"]
    assert_fault_row(run, fault="restart-redis", backend="redis")
    assert f"port {private.port}" in run["fault_description"]
    assert not private.ping()  # stopped at the end
    # The pods locked on the private node: the shop's own Redis never saw a lock key.
    assert not [key for key in redis_client.keys("*") if b"lock" in key]


@pytest.mark.slow
@pytest.mark.xdist_group("burst")
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("balancer", ["none", "haproxy"])
# Flaky in a full run (3 of 7 on 2026-12-02: a few purchases unanswered after every resend), never
# alone: the invariants must still hold in one of three runs. Two causes found since: HAProxy marked
# the saturated live pod down (health check timeout; now CHECK_TIMEOUT_S) and, on an idle machine,
# 600 purchases were all answered before the killed pod was back (now KILL_POD_REQUESTS).
@pytest.mark.flaky(reruns=2)
def test_kill_pod_resends_in_flight_purchases_once_each(balancer, tmp_path):
    # Enough purchases that some are sent after the pod is back: at 600 an idle machine answered
    # them all before the restarted pod's gunicorn was up ("recovery not observed").
    document, printed, error = fault_run(
        tmp_path, KILL_POD_REQUESTS, backends="redis", fault="kill-pod", pods=2, balancer=balancer
    )

    assert error is None, f"{error}\n{printed}"
    [run] = document["runs"]
    assert run["balancer"] == balancer and "whole pod" in run["fault_description"]
    assert (run["oversold"], run["lost"], run["transport_errors"], run["errors_5xx"]) == (0, 0, 0, 0), run["problems"]
    assert run["invariants_ok"] is True, run["problems"]
    assert run["transport_resends"] >= 1  # the purchases in flight on the killed pod were resent
    assert 0 <= run["resumed_after_s"] <= RESUME_LIMIT_S
    # One pod of two stays up, and the killed one is marked down at its first refused connection:
    # HAProxy never answers busy itself (a pod that is busy is not dead).
    assert run["balancer_answers"] == 0, f"HAProxy answered {run['balancer_answers']} purchases itself"
    # From the database: one order per Idempotency-Key, every confirmed purchase one order.
    orders = Order.objects.filter(product__sku=SKU)
    keys = orders.values("idempotency_key").annotate(n=Count("id"))
    assert orders.count() == keys.count() == run["status_counts"]["201"] == KILL_POD_REQUESTS
    assert not orders.filter(idempotency_key="").exists()


@pytest.mark.parametrize(
    "options, message",
    [
        ({"backends": "redlock", "fault": "kill-minority", "scenario": "spike"}, "use --scenario deep, not spike"),
        (
            {"backends": "redis", "fault": "kill-majority"},
            "--fault kill-majority does not apply to redis: use --strategies redlock",
        ),
        ({"backends": "redlock,redis", "fault": "restart-redis"}, "does not apply to redlock: use --strategies redis"),
        ({"backends": "db", "fault": "pause-worker"}, "use --strategies etcd,redis,redlock"),
        ({"backends": "redlock", "fault": "kill-etcd-member"}, "use --strategies etcd"),
        ({"backends": "etcd", "fault": "kill-zk-member"}, "use --strategies zookeeper"),
        ({"backends": "optimistic", "fault": "kill-holder"}, "use --strategies db,etcd,redis,redlock,zookeeper"),
        ({"backends": "db", "fault": "bogus"}, "unknown fault 'bogus'"),
        ({"backends": "atomic", "unfenced": True}, "atomic has none"),
        ({"backends": "redis", "fault_hold": 0.1}, "--fault-hold needs a --fault"),
        (
            {"backends": "redis", "fault": "restart-redis", "fault_hold": -1.0},
            "--fault-hold -1: give 0 seconds or more",
        ),
    ],
)
@pytest.mark.django_db
def test_bad_fault_combinations_start_nothing(options, message, tmp_path):
    path = tmp_path / "burst.json"
    options = {"scenario": "deep", "requests": 10, "json_path": str(path), **options}
    assert message in flashsale_refused(options, output=path)
    assert not RedisNode(port=settings.REDLOCK_BASE_PORT + PRIVATE_PORT_OFFSET, run_dir=tmp_path).ping()
