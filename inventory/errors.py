"""The services' refusals of bad input: each says what was wrong, and nothing was changed."""

from __future__ import annotations


class InventoryError(Exception):
    """Bad input to a service: nothing was changed."""


class ProductNotFound(InventoryError):
    pass


class InvalidQuantity(InventoryError):
    pass
