"""The Locust master's shares and merge (loadtests/conductor.py) with the workers' shares (loadtests/sale.py):
pure logic, no processes."""

from __future__ import annotations

import pytest

from loadtests.conductor import Conductor
from loadtests.sale import Sale


def shared_sales(conductor: Conductor, users: dict[str, tuple[int, int]], total: int) -> dict[str, Sale]:
    for worker, (index, count) in users.items():
        conductor.count_users(worker, index=index, users=count)
    sales = {}
    for worker, share in conductor.shares(total).items():
        sales[worker] = Sale()
        sales[worker].take_share(**share)
    return sales


@pytest.mark.parametrize(
    "purchases, users",
    [
        (0, {"a": (0, 2500), "b": (1, 2500)}),  # the spike: one purchase per user
        (5001, {"a": (0, 2501), "b": (1, 2500)}),
        (300, {"a": (1, 40), "b": (0, 60), "c": (2, 0)}),  # closed loop; c got no users
        (7, {"a": (0, 5), "b": (1, 5)}),  # more users than purchases
    ],
)
def test_the_shares_add_up_to_exactly_the_purchases(purchases, users):
    total = sum(count for _, count in users.values())
    sales = shared_sales(Conductor(purchases=purchases), users, total)
    assert set(sales) == {worker for worker, (_, count) in users.items() if count}
    assert sum(sale.limit for sale in sales.values()) == (purchases or total)
    for worker, sale in sales.items():
        per_user = [sale.shoppers_of(i) for i in range(users[worker][1])]
        assert sum(per_user) == sale.limit and max(per_user) - min(per_user) <= 1


def test_no_share_until_the_counts_add_up_and_only_one():
    conductor = Conductor(purchases=0)
    conductor.count_users("a", index=0, users=10)
    conductor.count_users("b", index=1, users=5)  # b is still spawning towards 10
    assert conductor.shares(20) == {}
    conductor.count_users("b", index=1, users=10)
    first = conductor.shares(20)
    assert [share["offset"] for share in first.values()] == [0, 10]
    assert conductor.shares(20) == {}  # sent once


def test_the_gate_opens_once_every_worker_with_a_share_is_ready():
    conductor = Conductor(purchases=0)
    shared_sales(conductor, {"a": (0, 3), "b": (1, 3)}, 6)
    assert not conductor.mark_ready("stranger", opens_at=1.0)
    assert not conductor.mark_ready("a", opens_at=1.0)
    assert conductor.mark_ready("b", opens_at=2.0) and conductor.progress()["opens_at"] == 2.0
    assert not conductor.mark_ready("b", opens_at=3.0)  # the countdown started once


def test_reports_carry_each_purchase_once_and_finish_with_the_last():
    conductor = Conductor(purchases=0)
    sale = shared_sales(conductor, {"a": (0, 3)}, 3)["a"]
    for n in range(3):
        sale.prepared += 1
        sale.sent += 1
        sale.answered += 1
        sale.status_counts["201"] += 1
        sale.latencies_ms.append(10.0 * (n + 1))
        sale.sent_times.append(100.0 + n)
        sale.answer_times.append(100.5 + n)
        sale.purchases_done.append([100.0 + n, 100.5 + n, 201, None, []])
        sale.first_sent_at = sale.first_sent_at or 100.0
        sale.last_sent_at = sale.last_answered_at = 100.0 + n
        report = sale.report()
        assert report["finished"] is (n == 2) and len(report["purchases"]) == 1
        conductor.absorb("a", report)
    conductor.absorb("a", sale.report())  # an empty report after the end changes nothing
    summary = conductor.summary()
    assert conductor.finished and summary["phase"] == "done"
    assert (summary["sent"], summary["answered"], summary["status_counts"]) == (3, 3, {"201": 3})
    assert len(summary["purchases"]) == sum(n for _, n in summary["latency_histogram_ms"]) == 3
    assert summary["p50_ms"] == 20.0


def test_an_error_in_a_worker_ends_the_sale():
    conductor = Conductor(purchases=0)
    sale = shared_sales(conductor, {"a": (0, 3), "b": (1, 3)}, 6)["a"]
    sale.errors.append("KeyError: 'x'")
    conductor.absorb("a", sale.report())
    assert conductor.finished and conductor.summary()["errors"] == ["KeyError: 'x'"]


def answer(sale: Sale, *, sent: float, answered: float, status: int = 200) -> None:
    """One purchase's final answer, as the locustfile records it (its first send noted first)."""
    sale.sent += 1
    sale.note_sent(sent)
    sale.answered += 1
    sale.status_counts[str(status)] += 1
    sale.sent_times.append(sent)
    sale.answer_times.append(answered)
    sale.latencies_ms.append((answered - sent) * 1000)
    sale.purchases_done.append([sent, answered, status, None, []])
    sale.last_answered_at = answered


def test_the_first_send_is_the_earliest_send_not_the_first_answers():
    conductor = Conductor(purchases=0)
    sale = shared_sales(conductor, {"a": (0, 2)}, 2)["a"]
    answer(sale, sent=100.4, answered=100.5)  # sent last, answered first
    answer(sale, sent=100.0, answered=103.0)
    conductor.absorb("a", sale.report())
    summary = conductor.summary()
    assert summary["first_sent_at"] == 100.0 and summary["arrival_window_s"] == 0.4
    assert summary["drain_s"] == 3.0


def test_rounds_open_one_after_the_other_and_keep_their_own_figures():
    conductor = Conductor(purchases=0, rounds=2)
    sales = shared_sales(conductor, {"a": (0, 1), "b": (1, 1)}, 2)
    for sale in sales.values():
        sale.rounds, sale.gates = 2, [object(), object()]
        sale.on_round_end = lambda ended: conductor.absorb(ended.node, ended.report(whole=True))
    sales["a"].node, sales["b"].node = "a", "b"
    assert conductor.mark_ready("a", opens_at=1.0) is False and conductor.mark_ready("b", opens_at=1.0)
    conductor.open(1.0)
    answer(sales["a"], sent=1.0, answered=1.1)
    stale = sales["a"].report()  # a periodic report built before the round's last one...
    sales["a"].on_round_end(sales["a"])
    conductor.absorb("a", stale)  # ...and delivered after it: nothing counted twice
    assert not conductor.finished
    assert not conductor.mark_ready("a", opens_at=2.0, round=1)  # b has not answered round 0 yet
    answer(sales["b"], sent=1.0, answered=1.3)
    sales["b"].on_round_end(sales["b"])
    assert conductor.finished
    conductor.next_round()
    assert (conductor.round, conductor.phase, conductor.progress()["round"]) == (1, "preparing", 1)
    assert conductor.mark_ready("b", opens_at=2.0, round=1)  # a was ready for round 1 already
    conductor.open(2.0)
    for name in ("a", "b"):
        sales[name].start_round(1)
        answer(sales[name], sent=2.0, answered=2.2, status=201)
        sales[name].on_round_end(sales[name])
    conductor.next_round()
    whole = conductor.sale_summary()
    assert conductor.phase == "ended" and [r["status_counts"] for r in whole["rounds"]] == [{"200": 2}, {"201": 2}]
    assert whole["status_counts"] == {"201": 2} and whole["answered"] == 2 and whole["drain_s"] == 0.2
    assert whole["rounds"][0]["answered"] == 2 and whole["rounds"][0]["drain_s"] == 0.3
