"""The sold-out mark: once a product is sold out, saying so costs one Redis round trip, no SQL.

Every pod sees the mark (it lives in the shop's Redis, ``REDIS_URL``). It carries the sale's
*generation*, a counter that ``restock`` and ``reset_sale`` raise after they commit; a mark
counts only while its generation is the current one, so a restock clears every mark at once
and a "sold out" after a restock has returned is impossible. A purchase reads the generation
before it reads the shelf, and marks with that generation, so a restock racing the purchase
invalidates the mark it leaves.

Idempotency survives the shortcut: a keyed retry of a sold-out product is answered from the
database's orders, read once per mark and process (:func:`final_orders`), or, where this process
cannot keep marks (no listener), by one indexed query for its key. The orders are final while the
mark counts: no stock is left in its generation. A confirmed purchase leaves nothing in Redis.

A mark lives :data:`~inventory.soldout_local.MARK_TTL_S` (2 s), here and in each process: the
generation clears it at once when the restock's raise arrives, the lifetime bounds how long it can
say "sold out" when that raise failed (logged, after the commit) or Redis came back from an older
RDB with an older generation. A sold-out SKU then costs one shelf read per 2 s per process.

Each process also keeps the marks it has seen (:mod:`inventory.soldout_local`), dropped when a
restock's message arrives or the listener's connection breaks: from then on "sold out" costs
no round trip at all. Raising the generation publishes the SKU in the same MULTI. Likewise it
keeps the SKUs it read *unmarked*, with that read's generation, until a mark's message
(``mark`` publishes in the same MULTI as its SET) or the same lifetime: a purchase on a SKU on
sale asks Redis nothing before the shelf's read, which finds a keyed retry's order itself.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING

import redis
from django.conf import settings
from django.core.signals import setting_changed

from .soldout_local import MARK_TTL_S, MARKS, Clear, Entry, channels, database_of
from .strategies.contract import generation_key

if TYPE_CHECKING:
    from .strategies.contract import Shelf

logger = logging.getLogger(__name__)

_local = threading.local()
_lock = threading.Lock()
_client: redis.Redis | None = None


def client() -> redis.Redis:
    global _client
    if _client is None:
        with _lock:
            if _client is None:
                _client = redis.Redis.from_url(
                    settings.INVENTORY["REDIS_URL"], socket_timeout=0.5, socket_connect_timeout=0.5
                )
    return _client


def _forget_client(*, setting: str, **kwargs) -> None:
    global _client
    if setting == "INVENTORY":
        _client = None


setting_changed.connect(_forget_client)


def _keys(sku: str) -> tuple[str, str]:
    return generation_key(sku), f"flashsale:soldout:{{{sku}}}"


@dataclass(frozen=True)
class Reading:
    """What one read of the mark saw."""

    generation: int
    sold_out: bool  # a mark of the current generation: answer "sold out" without SQL
    limit: int = 0  # the per-customer limit the mark was made under (quantities above it are bad input)
    ends_at: float | None = None  # the sale's end (epoch seconds): after it, "not on sale", so no shortcut
    order_id: int | None = None  # the order this idempotency key already has
    local: bool = False  # answered from this process's memory (inventory.soldout_local), no round trip
    clear: Clear | None = field(default=None, compare=False, repr=False)  # what remember_shelf keeps it with
    order_quantity: int | None = None  # that order's units (a retry naming others is refused)

    @property
    def shelf(self) -> Shelf | None:
        """Known unmarked: the row as this process last read it (id, limit, window; see remember_shelf)."""
        return self.clear.shelf if self.clear is not None else None


def read(sku: str, *, customer: str = "", key: str = "") -> Reading | None:
    """This process's mark, or its knowledge that ``sku`` is not marked (no round trip), else one
    MGET: the generation and the mark. None when Redis does not answer.

    Marked, a keyed retry gets the order its key already has (:func:`keyed_order`); known unmarked,
    its order is not looked up here: the shelf's read finds it."""
    url = settings.INVENTORY["REDIS_URL"]
    kept = MARKS.get(sku, url=url)
    if kept is not None:
        order_id, units = keyed_order(kept, sku, customer, key) or (None, None)
        return Reading(kept.generation, True, kept.limit, kept.ends_at, order_id, True, order_quantity=units)
    clear = MARKS.clear(sku, url=url)
    if clear is not None:
        return Reading(clear.generation, False, local=True, clear=clear)
    epoch = MARKS.epoch(sku, url=url)
    try:
        values = client().mget(_keys(sku))
    except redis.RedisError as exc:
        logger.warning("sold-out mark unavailable: %s", exc)
        return None
    generation = int(values[0] or 0)
    if not values[1]:
        clear = Clear(generation)
        kept = epoch is not None and MARKS.keep(sku, clear, epoch=epoch)
        return Reading(generation, False, clear=clear if kept else None)
    mark_generation, limit, ends_at = values[1].decode().split(":")
    if int(mark_generation) != generation:
        return Reading(generation, False)
    entry = Entry(generation, int(limit), float(ends_at) if ends_at else None)
    kept = epoch is not None and MARKS.keep(sku, entry, epoch=epoch)
    found = keyed_order(entry, sku, customer, key) if kept else _order_of_key(sku, customer, key)
    order_id, units = found or (None, None)
    return Reading(generation, True, entry.limit, entry.ends_at, order_id, order_quantity=units)


def keyed_order(entry: Entry, sku: str, customer: str, key: str) -> tuple[int, int] | None:
    """The order ``customer``'s ``key`` has on a product marked sold out, (id, units), or None
    without a key: from the kept mark's orders, read once per mark and process (two threads may both read them)."""
    if not key:
        return None
    if entry.orders is None:
        entry.orders = final_orders(sku)
    return entry.orders.get((customer, key))


def _order_of_key(sku: str, customer: str, key: str) -> tuple[int, int] | None:
    """The same for a mark this process does not keep: one indexed query for this key alone."""
    from .models import Order

    if not key:
        return None
    rows = Order.objects.filter(product__sku=sku, customer=customer, idempotency_key=key)
    return rows.values_list("pk", "quantity").first()


def remember_shelf(sku: str, seen: Reading, shelf: Shelf) -> None:
    """After a shelf read of a SKU known unmarked (``seen``), keep the row with that knowledge: the
    next purchases here take its id, limit and sale window from memory, without a read, until a
    message drops it (a mark, a restock, a reset, an edit or deletion of the product) or 2 s pass."""
    if seen.clear is not None:
        MARKS.remember(sku, seen.clear, shelf)


def forget_unknown(sku: str, seen: Reading | None) -> None:
    """After a shelf read found no product with ``sku``: what :func:`read` kept of it is dropped."""
    if seen is not None and seen.clear is not None:
        MARKS.forget(sku, seen.clear)


def final_orders(sku: str) -> dict[tuple[str, str], tuple[int, int]]:
    """The keyed orders of a product marked sold out, (customer, key) → (id, units): final for the
    mark's generation (no stock is left)."""
    from .models import Order

    rows = Order.objects.filter(product__sku=sku).exclude(idempotency_key="")
    fields = rows.values_list("customer", "idempotency_key", "pk", "quantity")
    return {(customer, key): (pk, units) for customer, key, pk, units in fields}


def mark(sku: str, *, generation: int, limit: int, ends_at: datetime | None) -> None:
    """The shelf held 0 units at a read made after ``generation`` was current: mark it sold out,
    for :data:`MARK_TTL_S` (then a purchase reads the shelf again and marks it again)."""
    value = f"{generation}:{limit}:{ends_at.timestamp() if ends_at else ''}"
    try:
        with client().pipeline() as pipe:  # one MULTI: no process keeps "unmarked" past the mark
            pipe.set(_keys(sku)[1], value, px=int(MARK_TTL_S * 1000))
            pipe.publish(channels(database_of(client()))[1], sku)
            pipe.execute()
        MARKS.drop(sku, marked=True)  # this process's next purchase reads the mark, not its message's race
    except redis.RedisError as exc:
        logger.warning("could not mark %s sold out: %s", sku, exc)


def raise_generation(sku: str) -> None:
    """Raise the sale's generation and tell every process's listener, in one MULTI."""
    with client().pipeline() as pipe:
        pipe.incr(generation_key(sku))
        pipe.publish(channels(database_of(client()))[0], sku)
        pipe.execute()


def sale_changed(sku: str) -> None:
    """After a restock, reset or deletion has committed: every mark of ``sku`` stops counting."""
    try:
        raise_generation(sku)
    except redis.RedisError:
        # The mark may now say "sold out" until it runs out (MARK_TTL_S, in Redis and in each process).
        logger.exception("could not clear the sold-out mark of %s", sku)
