"""``db``: PostgreSQL row lock. ``SELECT ... FOR UPDATE`` serialises buyers of one product.

The row lock is itself the fence: it is held until commit, so no token is needed.
What can still go wrong: every waiting buyer holds a database connection while it waits.
"""
from __future__ import annotations

from contextlib import nullcontext

from django.db.models import F

from ..models import Product
from .base import InventoryBackend


class RowLockBackend(InventoryBackend):
    name = "db"

    def guard(self, sku: str):
        return nullcontext(None)

    def take_stock(self, *, product_id: int, quantity: int, fence: int | None) -> bool:
        stock = Product.objects.select_for_update().values_list("stock", flat=True).get(pk=product_id)
        if stock < quantity:
            return False
        Product.objects.filter(pk=product_id).update(stock=F("stock") - quantity)
        return True
