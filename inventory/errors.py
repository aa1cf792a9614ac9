"""The services' refusals of bad input: each says what was wrong, and nothing was changed."""

from __future__ import annotations


class InventoryError(Exception):
    """Bad input to a service: nothing was changed."""


class ProductNotFound(InventoryError):
    pass


class KeyReused(InventoryError):
    """An ``Idempotency-Key`` sent again for another quantity: its first order stands, nothing is bought."""


class InvalidQuantity(InventoryError):
    """A quantity that is not a whole number from 1 to ``most``, the most this request may name."""

    def __init__(self, message: str, *, most: int | None = None) -> None:
        super().__init__(message)
        self.most = most
