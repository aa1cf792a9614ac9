"""Small helpers shared by the test modules."""

from __future__ import annotations

from inventory.models import Order, Product
from inventory.strategies import STRATEGIES, strategy_class
from inventory.strategies.fenced import FencedLockStrategy

#: Every strategy that must work; the controls (``local``, ``unsafe``) are tested for failing.
WORKING_STRATEGIES = [name for name in STRATEGIES if not strategy_class(name).control]
#: The working strategies whose lock hands out a fencing token that the row's storage check compares.
FENCED_STRATEGIES = [name for name in WORKING_STRATEGIES if issubclass(strategy_class(name), FencedLockStrategy)]


def snapshot(sku: str = "phone-x") -> tuple[int, int, int]:
    """(stock, fence, all orders) for one product: what a refusal must leave unchanged."""
    product = Product.objects.get(sku=sku)
    return product.stock, product.fence, Order.objects.count()
