"""The report's batching section: computed from a strategy's BATCH=1 row and its batched row; where
their purchases' time went (sentences and the stacked breakdown chart); the hot-row limit."""

from __future__ import annotations

import re

import pytest

from loadtests.report.batching import batching_sentence
from loadtests.report.page import render_report
from loadtests.report.sentences import sentences, time_sentence


def row(backend: str, *, batch: int, rps: float, sections: int | None, drain_s: float, locked: bool = True) -> dict:
    return {
        "row": backend,
        "batch": batch,
        "requests": 3000,
        "rps": rps,
        "sections": sections,
        "drain_s": drain_s,
        "batch_p50": batch if batch > 1 else 1,
        "p99_ms": 900.0,
        "server_timing": {"lock_wait_ms": {"p50": 3.0, "p99": 9.0} if locked else None},
        "invariants_ok": True,
    }


def test_the_sentence_says_purchases_per_acquisition_and_the_gain():
    alone = row("redis", batch=1, rps=100.0, sections=3000, drain_s=30.0)
    batched = row("redis", batch=64, rps=620.0, sections=73, drain_s=4.8)
    assert batching_sentence(alone, batched) == (
        "redis ×64: 41 purchases per lock acquisition, 6.20× the same lock one purchase at a time"
    )
    unguarded = row("atomic", batch=64, rps=300.0, sections=300, drain_s=10.0, locked=False)
    assert batching_sentence(
        row("atomic", batch=1, rps=150.0, sections=3000, drain_s=20.0, locked=False), unguarded
    ) == ("atomic ×64: 10 purchases per transaction, 2.00× the same strategy one purchase at a time")
    assert batching_sentence(alone, {**batched, "sections": None}) is None


def test_the_section_appears_only_with_a_strategy_run_both_ways():
    floor = {"row": "floor", "batch": 1, "rps": 1000.0, "requests": 3000}
    alone = row("redis", batch=1, rps=100.0, sections=3000, drain_s=30.0)
    batched = row("redis", batch=64, rps=620.0, sections=73, drain_s=4.8)
    html = render_report({"runs": [floor, alone, batched]})
    assert 'id="batching"' in html and "41 purchases per lock acquisition" in html
    assert "redis ×64" in html
    assert 'id="batching"' not in render_report({"runs": [floor, alone]})


def timed(run: dict, queue: float, lock: float, hold: float, outside: float, commit: float, sql: float) -> dict:
    """``run`` with a breakdown (means over 3,000 purchases whose section ran), stock and hold figures."""
    parts = {"queue_wait_ms": queue, "lock_wait_ms": lock, "lock_hold_ms": hold, "outside_ms": outside}
    return {
        **run,
        **{"stock_initial": 3000, "stock_final": 0, "orders": 3000, "oversold": 0},
        "hold_p50": hold,
        "hold_p99": hold * 3,
        "breakdown": {
            "answers": 3000,
            **parts,
            "commit_ms": commit,
            "sql_statements": sql,
            "total_ms": sum(parts.values()),
        },
    }


HOT_ROW = [
    {"name": "hot-row 1", "batch": 1, "connections": 20, "sold": 3000, "seconds": 3.3, "rps": 900.0, "commits": 3000},
    {"name": "hot-row 64", "batch": 64, "connections": 4, "sold": 3000, "seconds": 0.75, "rps": 4000.0, "commits": 47},
]


def deep_document() -> dict:
    """A floor, db and redis alone and batched, with breakdowns, and the hot-row limit."""
    db = {"locked": False}
    return {
        "runs": [
            {"row": "floor", "batch": 1, "rps": 2000.0, "requests": 3000},
            timed(
                {**row("db", batch=1, rps=132.0, sections=3000, drain_s=22.7, **db), "hot_row_ratio": 0.15},
                *(0.0, 0.0, 9.0, 3.0, 0.4, 6.0),
            ),
            timed(
                {**row("db", batch=64, rps=283.0, sections=330, drain_s=10.6, **db), "hot_row_ratio": 0.07},
                *(18.0, 0.0, 14.0, 4.0, 0.5, 7.0),
            ),
            timed(row("redis", batch=1, rps=95.0, sections=3000, drain_s=31.6), *(0.0, 21.0, 8.0, 4.0, 0.3, 6.0)),
            timed(row("redis", batch=64, rps=176.0, sections=170, drain_s=17.0), *(30.0, 6.0, 12.0, 2.0, 0.4, 7.0)),
        ],
        "hot_row": [{**shape, "ok": True} for shape in HOT_ROW],
    }


def test_each_sentence_names_its_batch_size():
    """A strategy run alone and batched reads as two rows, not as two identical "db: sold ..." lines;
    a document where nothing ran batched keeps the plain names."""
    html = render_report(deep_document())
    showed = re.search(r'<section aria-labelledby="showed">(.*?)</section>', html, re.S).group(1)
    said = [re.sub(r"<[^>]+>", "", line).strip() for line in re.findall(r"<a [^>]*>(.*?)</a>", showed)]
    assert [line.split(":")[0] for line in said] == ["floor", "db ×1", "db ×64", "redis ×1", "redis ×64"]
    assert len(set(said)) == len(said)
    assert said[1] == "db ×1: sold 3,000 of 3,000 units, none oversold; 0.07× floor."
    assert sentences(deep_document())[1:3] == said[1:3]
    plain = render_report({"runs": [deep_document()["runs"][1]]})
    assert "db: sold" in plain and "db ×1" not in plain


def test_where_the_time_went_is_computed_from_the_breakdown():
    """One sentence per row, the largest part first with its share, the hold with its statements and
    commit; a row without a breakdown says nothing rather than guessing."""
    runs = deep_document()["runs"]
    assert time_sentence(runs[4], name="redis ×64") == (
        "redis ×64: 50 ms per purchase on the server (mean of 3,000 that reached their section): "
        "queued for a batch 30 ms (60%), holding the lock 12 ms (24%; its section sent 7 SQL statements, "
        "commit 0.4 ms), waiting for the lock 6.0 ms (12%), outside the section 2.0 ms (4%)"
    )
    alone = time_sentence(runs[1])
    assert alone.startswith("db: 12 ms per purchase") and "in its transaction 9.0 ms (75%" in alone
    assert "queued" not in alone and "waiting for the lock" not in alone  # a zero part is not said
    assert time_sentence(runs[0]) is None and time_sentence({**runs[1], "breakdown": None}) is None
    # A run that timed its statements' round trips says how long they took, inside the hold.
    timed_trips = {**runs[4], "breakdown": {**runs[4]["breakdown"], "sql_ms": 8.5}}
    assert "its section sent 7 SQL statements in 8.5 ms of round trips, commit 0.4 ms" in time_sentence(timed_trips)


def test_the_batching_section_draws_the_breakdown_and_says_it():
    html = render_report(deep_document())
    section = re.search(r'<section aria-labelledby="batching">.*?</section>', html, re.S).group(0)
    assert section.count("ms per purchase on the server") == 4
    assert '<div class="table-scroll"><table class="comparison">' in section  # a phone scrolls it in its box
    assert "redis ×64: 50 ms per purchase on the server" in section
    chart = re.search(r"<svg[^>]*chart-stacked.*?</svg>", section, re.S).group(0)
    labels = re.findall(r'class="tick row-label"[^>]*>([^<]+)</text>', chart)
    assert labels == ["db ×1", "db ×64", "redis ×1", "redis ×64"]
    # Each bar: its parts end to end (zero parts drawn not at all), the commit inside the hold, its sum.
    assert re.findall(r'class="value"[^>]*>([^<]+)</text>', chart) == ["12", "36", "33", "50"]
    assert "redis ×64 queue: 30 ms per purchase (mean)" in chart
    assert "db ×1 queue" not in chart and "db ×1 acquire" not in chart
    assert chart.count("commit (in hold):") == 4 and "redis ×1 commit (in hold): 0.3 ms" in chart
    hold = re.search(r'<rect x="([\d.]+)" y="([\d.]+)" width="([\d.]+)"[^>]*><title>redis ×1 hold:', chart)
    commit = re.search(r'<rect x="([\d.]+)" y="[\d.]+" width="([\d.]+)"[^>]*><title>redis ×1 commit', chart)
    hold_end, commit_end = float(hold[1]) + float(hold[3]), float(commit[1]) + float(commit[2])
    assert commit_end == pytest.approx(hold_end, abs=0.15) and float(commit[1]) > float(hold[1])


def test_each_row_has_its_breakdown_chart_and_the_page_shows_hold_and_the_hot_row():
    html = render_report(deep_document())
    articles = re.findall(r'<article class="strategy".*?</article>', html, re.S)
    assert ["Where a purchase&#x27;s time went" in article for article in articles] == [False, True, True, True, True]
    assert "db ×64: 36 ms per purchase on the server" in articles[2]
    table = re.search(r'<table class="runs">.*?</table>', html, re.S).group(0)
    assert '<th scope="col">hold p50 ms</th>' in table and '<th scope="col">× hot row</th>' in table
    assert ">9.0</td>" in table and ">0.07×</td>" in table
    hot = re.search(r'<section aria-labelledby="hot-row">.*?</section>', html, re.S).group(0)
    assert "hot-row 64" in hot and ">4,000</td>" in hot
    assert "db ×1 0.15× hot-row 1, db ×64 0.07× hot-row 64" in hot
    older = render_report({"runs": [row("redis", batch=1, rps=1.0, sections=1, drain_s=1.0)]})
    assert 'id="hot-row"' not in older and "hold p50 ms" not in older and "chart-stacked" not in older


def test_what_a_request_cost_in_cpu_is_a_sentence_and_two_bars_a_row():
    floor = {"row": "floor", "batch": 1, "rps": 1000.0, "requests": 3000}
    alone = row("redis", batch=1, rps=300.0, sections=3000, drain_s=10.0)
    batched = row("redis", batch=64, rps=620.0, sections=73, drain_s=4.8)
    batched["cpu_ms"] = {"pods": 1.83, "postgres": 0.33, "locust": 0.3, "total": 2.46}
    batched["floor"] = {"rps": 1000.0, "cpu_ms": {"pods": 1.39, "locust": 0.28, "total": 1.67}}

    html = render_report({"runs": [floor, alone, batched]})

    assert 'id="cpu-cost"' in html
    assert "redis ×64: 2.46 ms of CPU a purchase, 1.47× its floor round&#x27;s 1.67 ms." in html
    start = html.index('id="cpu-cost"')
    chart = html[start : html.index("</figure>", start)]
    assert chart.count('class="tick row-label"') == 2  # the row and its floor round; alone measured none
    assert 'id="cpu-cost"' not in render_report({"runs": [floor, alone, {**batched, "cpu_ms": None}]})


def test_cpu_figures_held_as_something_else_are_not_drawn():
    # Seen by rendering a burst's JSON with one figure at a time replaced: "pods": "x" in a row's
    # cpu_ms ended the report in a TypeError (svg.py), "total": "x" in a ValueError, and the floor
    # round's "total": "x" in a TypeError: `manage.py report` printed a traceback, wrote nothing.
    floor = {"row": "floor", "batch": 1, "rps": 1000.0, "requests": 3000}
    alone = row("redis", batch=1, rps=300.0, sections=3000, drain_s=10.0)
    batched = row("redis", batch=64, rps=620.0, sections=73, drain_s=4.8)
    batched["cpu_ms"] = {"pods": "x", "postgres": 0.33, "total": 2.46}
    batched["floor"] = {"rps": 1000.0, "cpu_ms": {"pods": 1.39, "total": "x"}}
    html = render_report({"runs": [floor, alone, batched]})
    assert "redis ×64: 2.46 ms of CPU a purchase." in html  # no floor round's figure to compare with
    start = html.index('id="cpu-cost"')
    assert html[start : html.index("</figure>", start)].count('class="tick row-label"') == 1
    unreadable = {**batched, "cpu_ms": {"pods": 1.0, "total": "x"}}
    assert 'id="cpu-cost"' not in render_report({"runs": [floor, alone, unreadable]})


def test_the_section_lists_issue_28s_targets_its_rows_ran():
    floor = {"row": "floor", "batch": 1, "rps": 1000.0, "requests": 3000}
    alone = {**row("redis", batch=1, rps=100.0, sections=3000, drain_s=30.0), "floor_ratio": 0.1}
    batched = {**row("redis", batch=64, rps=620.0, sections=73, drain_s=4.8), "floor_ratio": 0.62}
    html = render_report({"runs": [floor, alone, batched]})
    assert 'id="targets"' in html and "3 of 4 met" in html
    assert "redis at BATCH 1 ≥ 0.25× the floor: 0.10×  NOT met" in html
    assert "redis batched ≥ 3× its own BATCH 1: 6.20×  met" in html
    # Without a batched row the batching section, and with it the targets, are not shown.
    assert 'id="targets"' not in render_report({"runs": [floor, alone]})
    # A --repeat run's rounds that fall on both sides of a target: the count says how many.
    spread = [{"rps": 500.0, "floor_ratio": 0.45}, {"rps": 700.0, "floor_ratio": 0.7}]
    html = render_report({"runs": [floor, alone, {**batched, "rounds": spread}]})
    assert "3 of 4 met; on 1 of them the rounds fell on both sides of the target" in html
    assert "its rounds 0.45–0.70×, on both sides of the target" in html
    assert html.count('class="spread-mark"') == 1 and "redis batched: its rounds 0.45–0.70 × the floor" in html
    assert 'class="spread-mark"' not in render_report({"runs": [floor, alone, batched]})


def _chart(html: str, unit: str) -> str:
    start = html.index(f"Issue 28&#x27;s targets, {unit}")
    return html[start : html.index("</svg>", start)]


def test_the_targets_are_drawn_against_what_each_row_allows():
    # The verdict lines said each bound in words; a reader could not see at a glance which targets
    # lay beyond everything the row measured (redis alone past both its CPU's and its hold's marks).
    floor = {"row": "floor", "batch": 1, "rps": 1000.0, "requests": 3000}
    measured = {"floor": {"rps": 2000.0, "cpu_ms": {"total": 0.9}}, "cpu_ms": {"total": 3.6}}
    alone = {
        **row("redis", batch=1, rps=360.0, sections=3000, drain_s=8.3),
        **measured,
        "floor_ratio": 0.18,
        "breakdown": {"lock_wait_ms": 25.0, "lock_hold_ms": 2.5},
    }
    batched = {**row("redis", batch=64, rps=1240.0, sections=150, drain_s=2.4), "floor_ratio": 0.62}
    html = render_report({"runs": [floor, alone, batched]})
    per_floor, own = _chart(html, "× the floor"), _chart(html, "× its own BATCH 1")
    # redis alone: short of its target, its CPU allowing 0.25× and its 2.5 ms hold 0.20×.
    assert 'class="reach-short"' in per_floor and "redis alone: 0.18 × the floor, not met (target 0.25)" in per_floor
    assert "<title>its CPU a purchase allows 0.25×</title>" in per_floor
    assert "<title>one holder at a time for its mean hold, 2.50 ms, allows 0.20×</title>" in per_floor
    assert per_floor.count('class="target-mark"') == 2  # alone and batched, each × the floor
    assert 'class="reach-met"' in own and "redis batched: 3.44 × its own BATCH 1, met (target 3)" in own
    assert 'class="bound-mark"' not in own  # no CPU measured for the batched row: no bound claimed


def test_a_near_miss_is_drawn_and_listed_with_the_places_that_show_it_missed():
    # 0.247 drawn as a red bar labelled "0.25" beside a target of 0.25 read as a contradiction.
    floor = {"row": "floor", "batch": 1, "rps": 1000.0, "requests": 3000}
    alone = {**row("db", batch=1, rps=247.0, sections=3000, drain_s=12.1), "floor_ratio": 0.247}
    batched = {**row("db", batch=64, rps=740.0, sections=150, drain_s=4.1), "floor_ratio": 0.74}
    html = render_report({"runs": [floor, alone, batched]})
    per_floor = _chart(html, "× the floor")
    assert "db alone: 0.247 × the floor, not met (target 0.25)" in per_floor and ">0.247</text>" in per_floor
    assert "db at BATCH 1 ≥ 0.25× the floor: 0.247×  NOT met" in html


def test_a_batch_size_of_the_wrong_type_leaves_its_row_out_of_the_targets():
    """Seen with a hand-edited document: ``"batch": "64"`` ended the report in a TypeError."""
    floor = {"row": "floor", "batch": 1, "rps": 1000.0, "requests": 3000}
    alone = {**row("redis", batch=1, rps=100.0, sections=3000, drain_s=30.0), "floor_ratio": 0.1}
    batched = {**row("redis", batch=64, rps=620.0, sections=73, drain_s=4.8), "floor_ratio": 0.62}
    odd = {**row("db", batch=64, rps=700.0, sections=50, drain_s=4.3), "floor_ratio": 0.7, "batch": "64"}
    html = render_report({"runs": [floor, alone, batched, odd]})
    assert "3 of 4 met" in html and "db batched" not in html
