"""The report's servers section: computed from a strategy's row on WSGI pods and its row on ASGI pods."""

from __future__ import annotations

from loadtests.report.page import render_report
from loadtests.report.servers import server_sentence


def row(backend: str, *, server: str | None, rps: float, floor_ratio: float, hold_p50: float) -> dict:
    run = {
        "row": backend,
        "batch": 1,
        "requests": 3000,
        "rps": rps,
        "floor_ratio": floor_ratio,
        "floor": {"rps": rps / floor_ratio},
        "hold_p50": hold_p50,
        "p99_ms": 900.0,
        "server_timing": {"db_ms": {"p50": 1.0, "p99": 4.0}},
        "invariants_ok": True,
    }
    if server:
        run["server"] = server
    return run


def test_the_sentence_compares_the_servers_and_says_where_the_time_went():
    wsgi = row("redis", server="wsgi", rps=800.0, floor_ratio=0.5, hold_p50=2.0)
    asgi = row("redis", server="asgi", rps=600.0, floor_ratio=0.6, hold_p50=3.5)
    assert server_sentence(wsgi, asgi) == (
        "redis: on ASGI 0.75× its purchases/s on WSGI (600 against 800); ×floor 0.60 on ASGI's own floor, "
        "0.50 on WSGI's; hold p50 3.5 ms against 2.0 ms"
    )
    assert server_sentence(wsgi, {**asgi, "rps": None}) is None
    assert server_sentence(wsgi, {**asgi, "hold_p50": None}).endswith("0.50 on WSGI's")


def test_the_section_appears_only_with_a_strategy_run_on_both_servers():
    floor = {"row": "floor", "batch": 1, "rps": 1000.0, "requests": 3000}
    wsgi = row("redis", server="wsgi", rps=800.0, floor_ratio=0.5, hold_p50=2.0)
    asgi = row("redis", server="asgi", rps=600.0, floor_ratio=0.6, hold_p50=3.5)
    html = render_report({"runs": [floor, wsgi, asgi]})
    assert 'id="servers"' in html and "redis: on ASGI 0.75× its purchases/s on WSGI" in html
    assert "redis (on ASGI)" in html
    older = row("redis", server=None, rps=800.0, floor_ratio=0.5, hold_p50=2.0)  # a document from before
    assert 'id="servers"' not in render_report({"runs": [floor, older]})
    assert 'id="servers"' in render_report({"runs": [floor, older, asgi]})
