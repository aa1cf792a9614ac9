"""The floor: the purchase endpoint's request path with no storage behind it.

``POST /api/products/<sku>/floor`` goes through the same middleware (session, CSRF), the same
size, content-type and JSON checks and the same shopper identity as the purchase endpoint, then
answers 200 without a database query, a lock or a Redis call. Its throughput under the burst is
this machine's framework floor: every strategy's ``floor_ratio`` is measured against it in the
same run. It changes nothing, so it needs no guard beyond the purchase endpoint's.
"""

from __future__ import annotations

import time

from django.http import HttpRequest, JsonResponse

from inventory.errors import InvalidQuantity
from inventory.services import check_quantity

from .views import Refused, purchase_error, purchase_quantity, shopper_id


def api_floor(request: HttpRequest, sku: str) -> JsonResponse:
    """``POST {"quantity": n}``: 200 ``{"outcome": "floor"}``, or the purchase endpoint's 4xx for bad input."""
    return floor_answer(request, sku)


async def api_floor_on_loop(request: HttpRequest, sku: str) -> JsonResponse:
    """The floor under ASGI: an ``async def`` view, as the purchase is there (nothing in it awaits)."""
    return floor_answer(request, sku)


def floor_answer(request: HttpRequest, sku: str) -> JsonResponse:
    started = time.perf_counter()
    try:
        quantity = check_quantity(purchase_quantity(request))
    except Refused as refused:
        return refused.response
    except InvalidQuantity as exc:
        return purchase_error(exc)
    shopper_id(request)  # the session lookup every purchase makes
    payload = {
        "outcome": "floor",
        "message": "Answered without touching storage.",
        "backend": "floor",
        "sku": sku,
        "quantity": quantity,
    }
    response = JsonResponse(payload)
    response["Server-Timing"] = f"total;dur={(time.perf_counter() - started) * 1000:.2f}"
    return response
