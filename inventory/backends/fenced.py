"""Shared part of the distributed-lock backends: hold the lock, write only with a newer fence."""
from __future__ import annotations

import logging
from contextlib import contextmanager
from typing import Iterator

from django.db.models import F

from ..locks import LockError, NotAcquired, NotOwned
from ..models import Product
from .base import InventoryBackend, LockUnavailable, StaleFence

logger = logging.getLogger(__name__)


def fenced_decrement(*, product_id: int, quantity: int, fence: int) -> bool:
    """Take ``quantity`` units only if ``fence`` is newer than the row's and stock suffices.

    Returns False when stock is short; raises :class:`StaleFence` when a later grant has
    already written the row (the caller's transaction must then roll back).
    """
    updated = Product.objects.filter(pk=product_id, fence__lt=fence, stock__gte=quantity).update(
        stock=F("stock") - quantity, fence=fence
    )
    if updated:
        return True
    row_fence = Product.objects.values_list("fence", flat=True).get(pk=product_id)
    if row_fence >= fence:
        raise StaleFence(f"product {product_id}: row fence {row_fence} >= token {fence}")
    return False


class FencedLockBackend(InventoryBackend):
    fenced = True

    def make_lock(self, name: str):
        raise NotImplementedError("subclasses of FencedLockBackend must provide make_lock()")

    @contextmanager
    def guard(self, sku: str) -> Iterator[int]:
        lock = self.make_lock(f"flashsale:lock:{sku}")
        try:
            lease = lock.acquire()
        except NotAcquired as exc:
            raise LockUnavailable(str(exc)) from exc
        try:
            yield lease.fence
        finally:
            try:
                lock.release()
            except NotOwned:
                # The lease ran out before release. Whatever committed was fenced, so the data
                # is safe; the TTL is too short for this load and worth knowing about.
                logger.warning("lock %s expired before release (fence %s)", lease.name, lease.fence)
            except LockError:
                logger.exception("releasing %s failed; it expires by its TTL", lease.name)

    def take_stock(self, *, product_id: int, quantity: int, fence: int | None) -> bool:
        assert fence is not None, "a fenced backend always has a token"
        return fenced_decrement(product_id=product_id, quantity=quantity, fence=fence)
