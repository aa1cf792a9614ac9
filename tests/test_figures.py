"""The burst's figures: merging Locust workers' reports, percentiles, histogram, Server-Timing, medians."""

from __future__ import annotations

from collections import Counter

import pytest

from loadtests.figures import (
    add_breakdown,
    latency_histogram,
    log_buckets,
    median_run,
    merge,
    parse_server_timing,
    percentile,
    timeline,
)


def summary(**fields) -> dict:
    base = {
        "limit": 2,
        "prepared": 2,
        "sent": 2,
        "answered": 2,
        "busy": 0,
        "client_retries": 0,
        "transport_errors": 0,
        "page_failures": 0,
        "conflicts": 0,
        "retries": 0,
        "constraint_hits": 0,
        "status_counts": {"409": 2},
        "outcomes": {"sold_out": 2},
        "latencies_ms": [10.0, 20.0],
        "server_timing": {"total": [1.0, 2.0]},
        "first_sent_at": 100.0,
        "last_sent_at": 100.1,
        "last_answered_at": 101.0,
        "last_confirmed_at": None,
    }
    return {**base, **fields}


def test_merge_adds_counts_and_takes_times_across_processes():
    merged = merge(
        [
            summary(status_counts={"201": 1, "409": 1}, last_confirmed_at=100.5, client_retries=3, conflicts=1),
            summary(
                first_sent_at=99.9,
                last_sent_at=100.3,
                last_answered_at=102.0,
                latencies_ms=[30.0, 40.0],
                server_timing={"lock": [5.0], "total": [3.0, 4.0]},
            ),
        ]
    )
    assert merged["sent"] == merged["answered"] == 4
    assert merged["status_counts"] == {"201": 1, "409": 3}
    assert merged["outcomes"] == {"sold_out": 4}
    assert (merged["client_retries"], merged["conflicts"]) == (3, 1)
    assert merged["arrival_window_s"] == pytest.approx(0.4)  # 99.9 → 100.3, across processes
    assert merged["drain_s"] == pytest.approx(2.1)  # 99.9 → 102.0
    assert merged["sold_out_after_s"] == pytest.approx(0.6)  # 99.9 → last 201 at 100.5
    assert merged["rps"] == pytest.approx(4 / 2.1, abs=0.1)
    assert (merged["p50_ms"], merged["p99_ms"]) == (20.0, 40.0)  # over the union, not per process
    assert merged["server_timing"]["total_ms"] == {"p50": 2.0, "p99": 4.0}
    assert merged["server_timing"]["lock_wait_ms"] == {"p50": 5.0, "p99": 5.0}
    assert merged["server_timing"]["db_ms"] is None  # no response carried it
    assert sum(count for _, count in merged["latency_histogram_ms"]) == 4


def test_hold_percentiles_come_from_the_answers_that_carried_hold():
    """hold_p50 / hold_p99 over the union of every worker's hold durations; answers without hold
    (refused before any section) do not count, and a run where none carried it has None."""
    holds = [float(ms) for ms in range(1, 101)]  # 1 … 100 ms across two workers
    merged = merge(
        [
            summary(server_timing={"hold": holds[:30], "total": [1.0, 2.0]}),
            summary(server_timing={"hold": holds[30:], "total": [3.0]}),
        ]
    )
    assert (merged["hold_p50"], merged["hold_p99"]) == (50.0, 99.0)
    assert merged["server_timing"]["lock_hold_ms"] == {"p50": 50.0, "p99": 99.0}
    assert merged["hold_p50"] == merged["server_timing"]["lock_hold_ms"]["p50"]
    floor = merge([summary(server_timing={"total": [0.1, 0.2]})])
    assert floor["hold_p50"] is floor["hold_p99"] is None


def test_the_breakdown_is_the_mean_of_the_answers_whose_section_ran():
    """Each worker sums the parts of the answers that carried ``outside`` (a section ran); a part an
    answer lacks adds 0, an answer refused before any section (or queued, then busy) adds nothing, so
    the merged means over every worker's answers add up: queue + lock + hold + outside = total."""
    sections = [
        parse_server_timing(
            "queue;dur=4, lock;dur=2, hold;dur=6, commit;dur=1, rtt;dur=3, sql;dur=7, outside;dur=3, total;dur=15"
        ),
        parse_server_timing(
            "lock;dur=1, hold;dur=5, commit;dur=0.5, rtt;dur=2, sql;dur=6, outside;dur=2, db;dur=3, total;dur=8"
        ),
    ]
    first, second = Counter(), Counter()
    add_breakdown(first, sections[0])
    add_breakdown(first, parse_server_timing("db;dur=0.2, total;dur=0.5"))  # sold out from the shelf's read
    add_breakdown(first, parse_server_timing("queue;dur=3000, total;dur=3000"))  # left the queue busy
    add_breakdown(second, sections[1])
    merged = merge([summary(breakdown=dict(first)), summary(breakdown=dict(second))])
    assert merged["breakdown"] == {
        "answers": 2,
        "queue_wait_ms": 2.0,
        "lock_wait_ms": 1.5,
        "lock_hold_ms": 5.5,
        "commit_ms": 0.75,
        "sql_ms": 2.5,
        "outside_ms": 2.5,
        "sql_statements": 6.5,
        "total_ms": 11.5,
    }
    parts = merged["breakdown"]
    assert sum(parts[key] for key in ("queue_wait_ms", "lock_wait_ms", "lock_hold_ms", "outside_ms")) == 11.5
    assert merge([summary()])["breakdown"] is None  # the floor: no section ran


def test_merge_without_any_answer_has_no_times():
    merged = merge(
        [
            summary(
                sent=0,
                answered=0,
                latencies_ms=[],
                first_sent_at=None,
                last_sent_at=None,
                last_answered_at=None,
                status_counts={},
                server_timing={},
            )
        ]
    )
    assert merged["arrival_window_s"] is merged["drain_s"] is merged["sold_out_after_s"] is None
    assert merged["rps"] == 0.0 and merged["latency_histogram_ms"] == []


@pytest.mark.parametrize(
    "header, expected",
    [
        (
            "lock;dur=1.5, hold;dur=0.25, db;dur=3, total;dur=4.75",
            {"lock": 1.5, "hold": 0.25, "db": 3.0, "total": 4.75},
        ),
        ('db;desc="database";dur=2', {"db": 2.0}),
        ("cache, db;dur=abc, total;dur=1", {"total": 1.0}),
        ("", {}),
        (None, {}),
    ],
)
def test_parse_server_timing(header, expected):
    assert parse_server_timing(header) == expected


def test_histogram_buckets_are_log_spaced_and_inclusive():
    assert log_buckets(30) == [1, 2, 5, 10, 20, 50]
    assert latency_histogram([0.5, 1.0, 1.1, 50.0, 7.0]) == [[1, 2], [2, 1], [5, 0], [10, 1], [20, 0], [50, 1]]


def test_percentile_is_nearest_rank():
    values = list(range(1, 101))
    assert (percentile(values, 0.5), percentile(values, 0.99), percentile(values, 1.0)) == (50, 99, 100)
    assert percentile([], 0.5) == 0.0


def test_median_run_reports_median_and_range():
    runs = [{"rps": 300.0, "n": 1}, {"rps": 100.0, "n": 2}, {"rps": 200.0, "n": 3}, {"rps": 250.0, "n": 4}]
    row = median_run(runs)
    assert row["rps"] == 225.0 and row["rps_range"] == [100.0, 300.0] and row["repeats"] == 4
    assert row["n"] == 3  # the lower middle run's other figures


def test_median_run_keeps_each_rounds_rate_and_ratio_in_the_order_they_ran():
    runs = [
        {"rps": 300.0, "round": 2, "floor_ratio": 0.3},
        {"rps": 100.0, "round": 1, "floor_ratio": 0.1},
        {"rps": 200.0, "round": 3},
    ]
    assert median_run(runs)["rounds"] == [
        {"rps": 100.0, "floor_ratio": 0.1},
        {"rps": 300.0, "floor_ratio": 0.3},
        {"rps": 200.0, "floor_ratio": None},
    ]


def test_timeline_counts_sends_and_answers_from_the_clients_own_times():
    samples = [(99.0, -1.0, 10), (100.0, 0.0, 10), (100.5, 0.5, 4), (101.0, 1.0, 0)]
    points = timeline(samples, opened_at=100.0, sent_times=[100.0, 100.1, 100.2], answer_times=[100.4, 100.6, 101.0])
    assert points == [[0.0, 10, 1, 0], [0.5, 4, 3, 1], [1.0, 0, 3, 3]]  # before the opening: left out


def test_merge_orders_purchases_sent_and_answered_at_the_same_instant():
    """Seen in a spike of zookeeper (flashsale --sales 3, 2026-12-02): two purchases sent and answered
    within the same 0.1 ms with the same status, one whose section took the lock (a lock wait) and
    one answered sold out (None), made the master's merge compare a float with None; the master's
    handler raised, the round never ended and the row hung until its time limit."""
    took_lock = [100.0001, 100.5, 409, 3.2, [], []]
    sold_out = [100.0001, 100.5, 409, None, [], []]
    merged = merge([summary(purchases=[took_lock]), summary(purchases=[sold_out])])
    assert merged["purchases"] in ([took_lock, sold_out], [sold_out, took_lock])
