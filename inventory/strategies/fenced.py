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
from contextlib import contextmanager
from typing import Iterator

from locks import LockError, NotAcquired, NotOwned

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

    def make_lock(self, name: str):
        raise NotImplementedError("subclasses of FencedLockStrategy must provide make_lock()")

    @contextmanager
    def guard(self, sku: str) -> Iterator[Grant]:
        lock = self.make_lock(f"flashsale:lock:{sku}")
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
            except NotOwned as exc:
                # The lease ran out (or its node forgot it) before release. Whatever committed was
                # fenced, so the data is safe; the message says which, and it is worth knowing about.
                logger.warning("lock %s no longer held at release (fence %s): %s", lease.name, lease.fence, exc)
            except LockError:
                logger.exception("releasing %s failed; it expires by its TTL", lease.name)

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
