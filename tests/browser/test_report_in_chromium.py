"""The burst report in a real Chromium: opened from its file, it shows a chart and a sentence per
strategy, fits a phone's width, and requests nothing but itself."""

from __future__ import annotations

import json
from io import StringIO
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command

from loadtests.report.page import write_report
from loadtests.report.sentences import sentences
from tests.slots import LOCUST_MASTER_PORT

pytestmark = pytest.mark.browser

FIXTURE = Path(__file__).resolve().parents[1] / "burst_fixture.json"


def open_report(context, path: Path):
    """The report opened in ``context``, and every URL the page requested."""
    page = context.new_page()
    requested: list[str] = []
    page.on("request", lambda request: requested.append(request.url))
    page.goto(path.as_uri())
    page.wait_for_load_state("networkidle")
    return page, requested


def assert_chart_and_sentence_per_strategy(page, data: dict) -> None:
    strategies = page.locator("article.strategy")
    assert strategies.count() == len(data["runs"])
    for i, said in enumerate(sentences(data)):
        article = strategies.nth(i)
        assert article.locator("svg[role=img]").count() >= 1
        assert article.locator("svg[role=img]").first.bounding_box()["width"] > 100
        assert article.locator("p.sentence").inner_text() == said
    assert page.locator("li.sentence").count() == len(data["runs"])


def test_fixture_report_has_charts_and_sentences_and_loads_nothing(browser, tmp_path):
    data = json.loads(FIXTURE.read_text())
    path = write_report(data, tmp_path / "report.html")
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    try:
        page, requested = open_report(context, path)
        assert requested == [path.as_uri()]
        assert_chart_and_sentence_per_strategy(page, data)
        charts = page.get_by_role("img")
        assert charts.count() == page.locator("svg").count()
        names = charts.evaluate_all("svgs => svgs.map(svg => svg.querySelector('title').textContent)")
        assert all(names) and "redlock (kill-redlock-node): stock over time" in names
        assert page.locator("article.strategy").last.locator("rect.phase-during").count() == 2
    finally:
        context.close()


def test_fits_a_phone(browser, tmp_path):
    path = write_report(json.loads(FIXTURE.read_text()), tmp_path / "report.html")
    context = browser.new_context(viewport={"width": 375, "height": 740}, device_scale_factor=2, is_mobile=True)
    try:
        page, requested = open_report(context, path)
        assert requested == [path.as_uri()]
        assert page.evaluate("document.documentElement.scrollWidth") <= 375  # wide tables scroll in their box
        widths = page.locator("svg.chart").evaluate_all("svgs => svgs.map(s => s.getBoundingClientRect().right)")
        assert widths and max(widths) <= 375
        # Tick labels stay legible: 11 viewBox units render at no less than 9 CSS pixels.
        tick = page.locator("article.strategy svg.chart-histogram text.tick").first
        assert tick.bounding_box()["height"] >= 9
    finally:
        context.close()


@pytest.mark.slow
@pytest.mark.xdist_group("burst")
@pytest.mark.django_db(transaction=True)
def test_report_of_a_real_burst(browser, tmp_path):
    """A small real burst (gunicorn, Locust, PostgreSQL), its JSON, the report ``flashsale --report``
    wrote, the page."""
    burst_json, report_html = tmp_path / "burst.json", tmp_path / "report.html"
    try:
        out = StringIO()
        call_command(
            "flashsale",
            backends="db",
            requests=200,
            stock=20,
            sku="report-burst",
            master_port=LOCUST_MASTER_PORT,  # the slot's: 7390 may be a running make demo's
            json_path=str(burst_json),
            report_path=str(report_html),
            stdout=out,
            stderr=StringIO(),
        )
    except CommandError as exc:
        pytest.fail(f"the burst failed: {exc}")
    assert out.getvalue().splitlines()[-1] == f"report: {report_html}"
    data = json.loads(burst_json.read_text())
    missing = sorted({key for run in data["runs"] for key in ("timeline", "latency_histogram_ms") if not run.get(key)})
    assert not missing, f"flashsale --json wrote no {', '.join(missing)}: the report's charts are drawn from them"
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    try:
        page, requested = open_report(context, report_html)
        assert requested == [report_html.as_uri()]
        assert_chart_and_sentence_per_strategy(page, data)
        db = page.locator('li.sentence[data-row="db"]').inner_text()
        assert db.startswith("db: sold 20 of 20 units, none oversold")
        assert page.locator("dl.machine").inner_text().count("PostgreSQL") >= 2  # label and SELECT version()
    finally:
        context.close()


def long_label_document() -> dict:
    """The rows of issue 28's deep command whose labels are the longest ("redis-stock ×64"), each
    alone and batched, with the breakdown the time chart draws and a floor to read them against."""
    runs = [{"row": "floor", "batch": 1, "rps": 2000.0, "requests": 3000, "invariants_ok": True}]
    for name in ("optimistic", "zookeeper", "redis-stock", "a-strategy-named-at-length"):
        for batch, rps in ((1, 400.0), (64, 1200.0)):
            parts = {"queue_wait_ms": 9.0 if batch > 1 else 0.0, "lock_wait_ms": 2.0, "lock_hold_ms": 8.0}
            runs.append(
                {
                    "row": name,
                    "batch": batch,
                    "requests": 3000,
                    "rps": rps,
                    "floor_ratio": rps / 2000.0,
                    "invariants_ok": True,
                    "stock_initial": 3000,
                    "stock_final": 0,
                    "orders": 3000,
                    "oversold": 0,
                    "breakdown": {"answers": 3000, **parts, "outside_ms": 1.0, "total_ms": sum(parts.values()) + 1.0},
                }
            )
    return {"runs": runs}


def test_every_row_label_fits_inside_its_chart(browser, tmp_path):
    """The bar charts put each row's name left of its bar; "redis-stock ×64" (15 characters) once
    ran past the chart's left edge and read "dis-stock ×64". A name longer than the widest margin
    is squeezed into it."""
    path = write_report(long_label_document(), tmp_path / "report.html")
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    try:
        page, _ = open_report(context, path)
        labels = page.locator("svg.chart text.row-label").evaluate_all(
            "texts => texts.map(t => [t.textContent, t.getBBox().x])"
        )
        assert {"redis-stock ×64", "a-strategy-named-at-length ×64"} <= {text for text, _ in labels}
        outside = [(text, round(x, 1)) for text, x in labels if x < 0]
        assert not outside, f"row labels cut off at the chart's left edge: {outside}"
    finally:
        context.close()
