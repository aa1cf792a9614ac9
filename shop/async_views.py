"""The purchase endpoint under ASGI (``SHOP_SERVER=asgi``): an ``async def`` view awaited on the
worker's event loop; the same parsing, answers and headers as :func:`shop.views.api_purchase`."""

from __future__ import annotations

from django.http import HttpRequest, JsonResponse

from inventory.async_purchase import apurchase
from inventory.errors import InventoryError

from .views import Refused, purchase_answer, purchase_error, purchase_request


async def api_purchase(request: HttpRequest, sku: str) -> JsonResponse:
    """``POST {"quantity": n}``: 201 confirmed, 409 refused, 503 busy, 4xx bad input."""
    try:
        quantity, key, customer = purchase_request(request)
        result = await apurchase(sku=sku, customer=customer, quantity=quantity, idempotency_key=key)
    except Refused as refused:
        return refused.response
    except InventoryError as exc:
        return purchase_error(exc)
    return purchase_answer(result, quantity)
