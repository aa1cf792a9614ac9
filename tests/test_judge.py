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
    ],
)
def test_the_access_log_count_allows_only_what_the_balancer_answered_or_a_dead_pod_lost(changes, ok):
    problems = judge(backend="db", plan=PLAN, figures=figures(**changes), report=None, errors_5xx=0)
    assert (problems == []) is ok, problems
    if not ok:
        assert "the pods logged" in problems[0]
