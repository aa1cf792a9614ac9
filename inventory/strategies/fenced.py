"""Shared part of the distributed-lock strategies: hold the lock, write only with a newer fence.

``FENCED`` (option, default True) switches the storage check: with it, a holder that paused
past its lease cannot write late (its token is older, or its read is no longer current);
without it, the section is correct only while the lock is (Kleppmann 2016).

Recovery when the lock service forgets: a restarted Redis node starts its fence counter over,
so a new grant's token may be below the row's fence, and every write would be refused. When
the storage refuses a token *that still holds the lock*, :meth:`FencedLockStrategy.recover`
asks the lock service to raise its counter past the row's fence under that token, then runs
the section again (read included) once. This is safe because the write also requires the row
to be as read: a holder that lost its lock cannot advance (the lock service checks the token),
and one that advanced while another writer slipped in still finds a new version and is refused.
"""

from __future__ import annotations

import logging
from contextlib import asynccontextmanager, contextmanager
from typing import AsyncIterator, Iterator

from asgiref.sync import async_to_sync

from locks import Lease, LockError, NotAcquired, NotOwned

from ..models import Product
from .base import Strategy
from .contract import Grant, LockUnavailable, Shelf
from .statements import Statement, checked_update

logger = logging.getLogger(__name__)


class FencedLockStrategy(Strategy):
    guarded = True
    check_label = "fence + version"
    default_options = {"FENCED": True}

    def __init__(self, *, config: dict) -> None:
        super().__init__(config=config)
        self.fenced = bool(self.options["FENCED"])
        if not self.fenced:
            self.check_label = "none (FENCED=False)"

    @staticmethod
    def lock_name(sku: str) -> str:
        """The lock of ``sku``'s sales: ``flashsale:lock:{<sku>}``. The braces keep every name the
        shop gives apart from the lock library's helper keys (``<name>:fence``, ``:signal``, …),
        which it refuses as a name: a sku ``fence`` would otherwise name ``flashsale:lock:fence``.
        In a Redis Cluster they also put the lock's keys in one slot, as its scripts need."""
        return f"flashsale:lock:{{{sku}}}"

    def make_lock(self, name: str):
        raise NotImplementedError("subclasses of FencedLockStrategy must provide make_lock()")

    def make_async_lock(self, name: str):
        """The asyncio twin of ``make_lock`` (``locks._async``), for ``aguard`` on the event loop."""
        raise NotImplementedError("subclasses of FencedLockStrategy must provide make_async_lock() to serve on ASGI")

    @contextmanager
    def guard(self, sku: str) -> Iterator[Grant]:
        lock = self.make_lock(self.lock_name(sku))
        try:
            lease = lock.acquire()
        except NotAcquired as exc:
            raise LockUnavailable(str(exc)) from exc
        try:
            # Locks whose service keeps a counter (Redis, Redlock) can raise it; etcd's fence is
            # a revision, which no client can move, so its grants cannot recover this way.
            advance, held = getattr(lock, "advance_fence", None), getattr(lock, "held", None)
            yield Grant(token=lease.fence, advance=advance, held=held)
        finally:
            try:
                lock.release()
            except LockError as exc:
                released_late(lease, exc)

    @asynccontextmanager
    async def aguard(self, sku: str) -> AsyncIterator[Grant]:
        """``guard`` on the event loop, with the asyncio lock: the section runs on a thread
        meanwhile, and a fence advance it asks for is awaited back here, on the loop."""
        lock = self.make_async_lock(self.lock_name(sku))
        try:
            lease = await lock.acquire()
        except NotAcquired as exc:
            raise LockUnavailable(str(exc)) from exc
        try:
            yield Grant(token=lease.fence, advance=async_to_sync(lock.advance_fence))
        finally:
            try:
                await lock.release()
            except LockError as exc:
                released_late(lease, exc)

    def stock_update(self, shelf: Shelf, *, quantity: int, grant: Grant) -> Statement:
        if grant.held is not None and not grant.held():
            # Rolls the section back; the shopper is told busy. A write that got past this check
            # (the loss not yet known) is the storage check's to refuse.
            raise LockUnavailable("the lock was lost (its session was suspended or ended) before the write")
        return checked_update(shelf, quantity=quantity, token=grant.token, fenced=self.fenced)

    def recover(self, shelf: Shelf, grant: Grant) -> Grant | None:
        row_fence = Product.objects.values_list("fence", flat=True).get(pk=shelf.product_id)
        if grant.token is None or row_fence < grant.token:
            return grant  # the row changed under the lock (a restock): read it again
        if grant.advance is None:
            return None
        try:
            token = grant.advance(row_fence)
        except LockError as exc:
            logger.warning("fence %s refused and the lock is no longer held (%s)", grant.token, exc)
            return None
        logger.warning(
            "fence %s was behind the row's %s (lock service restarted?): advanced to %s", grant.token, row_fence, token
        )
        return Grant(token=token, advance=grant.advance, held=grant.held)


def released_late(lease: Lease, exc: LockError) -> None:
    """A release that failed after the section. The lease ran out (or its node forgot it) before
    release: whatever committed was fenced, so the data is safe; the message says which, and it is
    worth knowing about. Any other failure: the key expires by its TTL."""
    if isinstance(exc, NotOwned):
        logger.warning("lock %s no longer held at release (fence %s): %s", lease.name, lease.fence, exc)
    else:
        logger.error("releasing %s failed; it expires by its TTL", lease.name, exc_info=exc)
