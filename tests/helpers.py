"""Small helpers shared by the test modules."""

from __future__ import annotations

from inventory.models import Order, Product


def snapshot(sku: str = "phone-x") -> tuple[int, int, int]:
    """(stock, fence, all orders) for one product: what a refusal must leave unchanged."""
    product = Product.objects.get(sku=sku)
    return product.stock, product.fence, Order.objects.count()
