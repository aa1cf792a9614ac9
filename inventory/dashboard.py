"""The sale dashboard: a page inside the admin with live stock, charts of the latest bursts and the
latest report (registered in shop/urls.py under ``admin_view``, so staff only).

The invariant's verdict comes from :class:`inventory.audit.AuditReport`; the live stock JSON
carries it, and the page's script only shows it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from django.contrib import admin
from django.core.exceptions import PermissionDenied
from django.http import FileResponse, Http404, HttpRequest, JsonResponse
from django.template.response import TemplateResponse
from django.views.decorators.http import require_safe

from .audit import AuditReport
from .models import BurstRun, Product
from .services import sale_state


def may_open(user) -> bool:
    """The dashboard shows products and burst runs: a user may open it who may view both (the admin
    index and the product list link it only for them: :mod:`inventory.templatetags.sale_dashboard`)."""
    return user.has_perm("inventory.view_product") and user.has_perm("inventory.view_burstrun")


def _require_view_permission(request: HttpRequest) -> None:
    if not may_open(request.user):
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


@require_safe
def dashboard_view(request: HttpRequest):
    _require_view_permission(request)
    runs = list(BurstRun.objects.all()[:50])
    products = stock_rows()
    context = {
        **admin.site.each_context(request),
        "title": "Sale dashboard",
        "products": products,
        # Each product links its orders only for staff who may view them (else the link answered 403).
        "may_view_orders": request.user.has_perm("inventory.view_order"),
        "runs": runs,
        "charts": _panels[0].charts(runs) if _panels else {},
        "report": latest_report(),
        "totals": {
            **stock_totals(products),
            "bursts": BurstRun.objects.count(),
            "bursts_failed": BurstRun.objects.filter(invariants_ok=False).count(),
        },
    }
    return TemplateResponse(request, "admin/inventory/dashboard.html", context)


@require_safe
def dashboard_stock_view(request: HttpRequest) -> JsonResponse:
    """The dashboard's live stock, polled each second."""
    _require_view_permission(request)
    products = stock_rows()
    response = JsonResponse({"products": products, "totals": stock_totals(products)})
    response["Cache-Control"] = "no-store"
    return response


@dataclass(frozen=True)
class BurstPanel:
    """What the load tests add to the dashboard: charts of the newest runs, and where the latest
    report file is (the load tests know both). The runs' sentences are the sale's own: each
    ``BurstRun`` stores its sentence when it is recorded."""

    charts: Callable[[list[BurstRun]], dict]
    report_path: Callable[[], Path]


_panels: list[BurstPanel] = []


def show_bursts(panel: BurstPanel) -> None:
    """Show the bursts' charts and the latest report. ``loadtests`` calls this from its
    ``AppConfig.ready()``, so the sale imports nothing of the load tests; without it the dashboard
    shows the runs' table only."""
    _panels[:] = [panel]


def latest_report() -> dict | None:
    """The latest burst's sentences, stored with its runs when ``flashsale`` recorded them (the
    report's words for each run), and whether a report file is there to link; None before any."""
    started_at = BurstRun.objects.values_list("started_at", flat=True).first()
    if started_at is None:
        return None
    runs = BurstRun.objects.filter(started_at=started_at).exclude(sentence="").order_by("id")
    said = [{"strategy": run.strategy, "sentence": run.sentence, "ok": run.invariants_ok} for run in runs]
    if not said:
        return None
    return {"started_at": started_at, "sentences": said, "file": bool(_panels) and _panels[0].report_path().is_file()}


@require_safe
def dashboard_report_view(request: HttpRequest) -> FileResponse:
    """The latest report file, served to staff; its policy lets it load nothing, as it is written to."""
    _require_view_permission(request)
    if not _panels:
        raise Http404("No report yet: run `manage.py report` after a burst.")
    try:
        report = open(_panels[0].report_path(), "rb")  # noqa: SIM115 - FileResponse closes it
        response = FileResponse(report, content_type="text/html; charset=utf-8")
    except FileNotFoundError:
        raise Http404("No report yet: run `manage.py report` after a burst.") from None
    response["Content-Security-Policy"] = "default-src 'none'; style-src 'unsafe-inline'"
    response["Cache-Control"] = "no-store"
    return response
