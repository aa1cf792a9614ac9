"""``unsafe``: read, then write back, with no lock at all.

It exists to prove that the burst's audit catches oversell: two buyers read the same stock,
both write ``stock - 1``, and two orders stand against one unit. Refused unless
``ALLOW_UNSAFE_BACKEND=1``.
"""
from __future__ import annotations

from contextlib import nullcontext

from django.core.exceptions import ImproperlyConfigured

from ..models import Product
from .base import InventoryBackend


class UnsafeBackend(InventoryBackend):
    name = "unsafe"

    def __init__(self, *, options: dict) -> None:
        if not options.get("ALLOW_UNSAFE"):
            raise ImproperlyConfigured(
                "INVENTORY_BACKEND=unsafe oversells by design; set ALLOW_UNSAFE_BACKEND=1 to run it anyway"
            )
        super().__init__(options=options)

    def guard(self, sku: str):
        return nullcontext(None)

    def take_stock(self, *, product_id: int, quantity: int, fence: int | None) -> bool:
        stock = Product.objects.values_list("stock", flat=True).get(pk=product_id)
        if stock < quantity:
            return False
        Product.objects.filter(pk=product_id).update(stock=stock - quantity)
        return True
