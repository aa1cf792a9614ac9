"""The purchases under ASGI (``SHOP_SERVER=asgi``): ``async def`` views awaited on the worker's event
loop, the API's and the form's, with the same parsing, answers and headers as their twins in
:mod:`shop.views`. What touches the database (the form's product, its pages) runs on the ORM
threads (:func:`inventory.async_purchase.on_thread`); the purchase is awaited on the loop."""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse, JsonResponse

from inventory.async_purchase import apurchase, on_thread
from inventory.errors import InventoryError

from .views import (
    Refused,
    buy_answer,
    buy_form,
    buy_refused,
    order_key,
    purchase_answer,
    purchase_error,
    purchase_request,
    served_here,
    shopper_id,
)


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


async def buy(request: HttpRequest, sku: str) -> HttpResponse:
    """The HTML form's target, as :func:`shop.views.buy`."""
    try:
        product, quantity = await on_thread(buy_form, request, sku)
        key = await on_thread(order_key, request, product)  # its refusal renders a page
    except Refused as refused:
        return refused.response
    try:
        result = await apurchase(sku=sku, customer=shopper_id(request), quantity=quantity, idempotency_key=key)
    except InventoryError as exc:
        return await on_thread(buy_refused, request, product, exc)
    # The page is built on an ORM thread (it reads the product again); the view ran here, on the loop.
    return served_here(await on_thread(buy_answer, request, product, result, quantity, key=key))
