"""The sale dashboard: a page inside the admin with live stock, charts of the latest bursts and the
latest report (registered in shop/urls.py under ``admin_view``, so staff only).

The invariant's verdict comes from :class:`inventory.audit.AuditReport`; the live stock JSON
carries it, and the page's script only shows it.
"""

from __future__ import annotations

from django.contrib import admin
from django.core.exceptions import PermissionDenied
from django.http import FileResponse, Http404, HttpRequest, JsonResponse
from django.template.response import TemplateResponse
from django.utils.safestring import mark_safe

from loadtests import report as burst_report

from .audit import AuditReport
from .charts import Bar, Series, bar_chart, colour_for, line_chart
from .models import BurstRun, Product
from .services import sale_state


def _require_view_permission(request: HttpRequest) -> None:
    if not (request.user.has_perm("inventory.view_product") and request.user.has_perm("inventory.view_burstrun")):
        raise PermissionDenied


def stock_rows() -> list[dict]:
    rows = []
    for product in Product.objects.with_totals():
        state = sale_state(product)
        report = AuditReport.of(product)
        rows.append(
            {
                "id": product.pk,
                "sku": product.sku,
                "name": product.name,
                "stock": product.stock,
                "initial_stock": product.initial_stock,
                "sold": product.sold,
                "ordered": product.ordered_units,
                "orders": product.order_count,
                "fence": product.fence,
                "state": state,
                "state_label": state.replace("_", " "),
                "invariant_ok": report.ok,
                "problems": report.problems,
                "percent_left": round(100 * product.stock / product.initial_stock) if product.initial_stock else 0,
            }
        )
    return rows


def stock_totals(rows: list[dict]) -> dict:
    """Stock and orders over the rows of :func:`stock_rows`, and whether the invariant holds for all of them."""
    return {
        "stock": sum(row["stock"] for row in rows),
        "orders": sum(row["orders"] for row in rows),
        "invariant_ok": all(row["invariant_ok"] for row in rows),
    }


def latest_run_per_backend(runs: list[BurstRun]) -> list[BurstRun]:
    latest: dict[str, BurstRun] = {}
    for run in runs:  # newest first
        latest.setdefault(run.backend, run)
    return sorted(latest.values(), key=lambda r: r.backend)


def burst_charts(runs: list[BurstRun]) -> dict[str, str]:
    """The dashboard's SVG charts from the newest run of each backend."""
    latest = latest_run_per_backend(runs)
    if not latest:
        return {}
    series = [
        Series(
            f"{run.backend} ({run.started_at:%b %d %H:%M})",
            [(float(point[0]), float(point[1])) for point in run.timeline if len(point) >= 2],
            colour_for(run.backend, i),
        )
        for i, run in enumerate(latest)
    ]
    return {
        "stock": mark_safe(
            line_chart(
                series,
                title="Stock left during the latest burst of each backend",
                x_label="seconds",
                y_label="units left",
            )
        ),
        "throughput": mark_safe(
            bar_chart(
                [Bar(run.backend, run.rps, colour_for(run.backend, i)) for i, run in enumerate(latest)],
                title="Throughput per backend (latest burst)",
                unit="requests/s",
            )
        ),
        "p99": mark_safe(
            bar_chart(
                [Bar(run.backend, run.p99_ms, colour_for(run.backend, i)) for i, run in enumerate(latest)],
                title="99th percentile latency per backend (latest burst)",
                unit="ms",
            )
        ),
        "legend": [(s.label, s.colour) for s in series],
    }


def dashboard_view(request: HttpRequest):
    _require_view_permission(request)
    runs = list(BurstRun.objects.all()[:50])
    products = stock_rows()
    context = {
        **admin.site.each_context(request),
        "title": "Sale dashboard",
        "products": products,
        "runs": runs,
        "charts": burst_charts(runs),
        "report": latest_report(),
        "totals": {
            **stock_totals(products),
            "bursts": BurstRun.objects.count(),
            "bursts_failed": BurstRun.objects.filter(invariants_ok=False).count(),
        },
    }
    return TemplateResponse(request, "admin/inventory/dashboard.html", context)


def dashboard_stock_view(request: HttpRequest) -> JsonResponse:
    """The dashboard's live stock, polled each second."""
    _require_view_permission(request)
    products = stock_rows()
    response = JsonResponse({"products": products, "totals": stock_totals(products)})
    response["Cache-Control"] = "no-store"
    return response


def latest_report() -> dict | None:
    """The latest burst's sentences, stored with its runs when ``flashsale`` recorded them (the
    report's words for each run), and whether a report file is there to link; None before any."""
    started_at = BurstRun.objects.values_list("started_at", flat=True).first()
    if started_at is None:
        return None
    runs = BurstRun.objects.filter(started_at=started_at).exclude(sentence="").order_by("id")
    said = [{"backend": run.backend, "sentence": run.sentence, "ok": run.invariants_ok} for run in runs]
    if not said:
        return None
    return {"started_at": started_at, "sentences": said, "file": burst_report.LATEST_REPORT.is_file()}


def dashboard_report_view(request: HttpRequest) -> FileResponse:
    """The latest report file, served to staff; its policy lets it load nothing, as it is written to."""
    _require_view_permission(request)
    try:
        report = open(burst_report.LATEST_REPORT, "rb")  # noqa: SIM115 - FileResponse closes it
        response = FileResponse(report, content_type="text/html; charset=utf-8")
    except FileNotFoundError:
        raise Http404("No report yet: run `manage.py report` after a burst.") from None
    response["Content-Security-Policy"] = "default-src 'none'; style-src 'unsafe-inline'"
    response["Cache-Control"] = "no-store"
    return response
