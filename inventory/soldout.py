"""The sold-out mark: once a product is sold out, saying so costs one Redis round trip, no SQL.

Every pod sees the mark (it lives in the shop's Redis, ``REDIS_URL``). It carries the sale's
*generation*, a counter that ``restock`` and ``reset_sale`` raise after they commit; a mark
counts only while its generation is the current one, so a restock clears every mark at once
and a "sold out" after a restock has returned is impossible. A purchase reads the generation
before it reads the shelf, and marks with that generation, so a restock racing the purchase
invalidates the mark it leaves.

Idempotency survives the shortcut: a confirmed order with an ``Idempotency-Key`` is noted next
to the mark, so a retry of it gets its order back rather than "sold out". The database stays
the record: if Redis forgets the note, the retry is told "sold out" but never gets a second
order. If Redis does not answer, purchases take the ordinary path through the database. A note
lives as long as its order: it carries the sale's *era*, which only ``reset_sale`` (which deletes
the orders) and a deleted product raise, before and after they commit, and it counts only in its
own era; a restock keeps the orders and so keeps the notes.

A mark lives :data:`~inventory.soldout_local.MARK_TTL_S` (2 s), here and in each process: the
generation clears it at once when the restock's raise arrives, the lifetime bounds how long it can
say "sold out" when that raise failed (logged, after the commit) or Redis came back from an older
RDB with an older generation. A sold-out SKU then costs one shelf read per 2 s per process.

Each process also keeps the marks it has seen (:mod:`inventory.soldout_local`), dropped when a
restock's message arrives or the listener's connection breaks: from then on "sold out" costs
no round trip at all. Raising the generation publishes the SKU in the same MULTI. Likewise it
keeps the SKUs it read *unmarked*, with that read's generation and era, until a mark's message
(``mark`` publishes in the same MULTI as its SET) or the same lifetime: a purchase on a SKU on
sale asks Redis nothing before the shelf's read, which finds a keyed retry's order itself.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from datetime import datetime

import redis
from django.conf import settings
from django.core.signals import setting_changed

from .soldout_local import CHANNEL, MARK_TTL_S, MARKED_CHANNEL, MARKS, Clear, Entry

logger = logging.getLogger(__name__)

#: How long an idempotency note is kept (a client retrying later than this is not retrying).
IDEMPOTENCY_TTL_S = 24 * 3600

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


def generation_key(sku: str) -> str:
    return f"flashsale:generation:{{{sku}}}"


def _keys(sku: str) -> tuple[str, str]:
    return generation_key(sku), f"flashsale:soldout:{{{sku}}}"


def era_key(sku: str) -> str:
    return f"flashsale:era:{{{sku}}}"


def _note_key(sku: str, customer: str, key: str) -> str:
    return f"flashsale:idem:{{{sku}}}:{customer}:{key}"


def _noted_order(value: bytes | None, era: int) -> int | None:
    """The order a note names, if it was written in ``era`` (a note of an earlier sale names a deleted order)."""
    noted_era, _, order_id = (value or b"").decode().partition(":")
    return int(order_id) if order_id and int(noted_era) == era else None


@dataclass(frozen=True)
class Reading:
    """What one read of the mark saw."""

    generation: int
    sold_out: bool  # a mark of the current generation: answer "sold out" without SQL
    limit: int = 0  # the per-customer limit the mark was made under (quantities above it are bad input)
    ends_at: float | None = None  # the sale's end (epoch seconds): after it, "not on sale", so no shortcut
    order_id: int | None = None  # the order this idempotency key already has
    local: bool = False  # answered from this process's memory (inventory.soldout_local), no round trip
    era: int | None = None  # the sale's era at this read (None: answered from memory), for notes


def read(sku: str, *, customer: str = "", key: str = "") -> Reading | None:
    """This process's mark, or its knowledge that ``sku`` is not marked (no round trip), else one
    MGET: the generation, the mark, and the key's note. None when Redis does not answer.

    Known unmarked, a keyed retry's order is not looked up here: the shelf's read finds it."""
    url = settings.INVENTORY["REDIS_URL"]
    kept = MARKS.get(sku, url=url)
    if kept is not None:
        if key and kept.orders is None:
            kept.orders = final_orders(sku)  # once per generation and process; two threads may both read it
        order_id = kept.orders.get((customer, key)) if key else None
        return Reading(kept.generation, True, kept.limit, kept.ends_at, order_id=order_id, local=True)
    clear = MARKS.clear(sku, url=url)
    if clear is not None:
        return Reading(clear.generation, False, local=True, era=clear.era)
    epoch = MARKS.epoch(sku, url=url)
    gen_key, mark_key = _keys(sku)
    keys = [gen_key, mark_key, era_key(sku)] + ([_note_key(sku, customer, key)] if key else [])
    try:
        values = client().mget(keys)
    except redis.RedisError as exc:
        logger.warning("sold-out mark unavailable: %s", exc)
        return None
    generation, era = int(values[0] or 0), int(values[2] or 0)
    order_id = _noted_order(values[3], era) if key else None
    if not values[1]:
        if epoch is not None:
            MARKS.keep(sku, Clear(generation, era), epoch=epoch)
        return Reading(generation, False, order_id=order_id, era=era)
    mark_generation, limit, ends_at = values[1].decode().split(":")
    found = Reading(
        generation,
        int(mark_generation) == generation,
        int(limit),
        float(ends_at) if ends_at else None,
        order_id=order_id,
        era=era,
    )
    if found.sold_out and epoch is not None:
        MARKS.keep(sku, Entry(generation, found.limit, found.ends_at), epoch=epoch)
    return found


def final_orders(sku: str) -> dict[tuple[str, str], int]:
    """The keyed orders of a product marked sold out: final for the mark's generation (no stock is left)."""
    from .models import Order

    rows = Order.objects.filter(product__sku=sku).exclude(idempotency_key="")
    return {(customer, key): pk for customer, key, pk in rows.values_list("customer", "idempotency_key", "pk")}


def mark(sku: str, *, generation: int, limit: int, ends_at: datetime | None) -> None:
    """The shelf held 0 units at a read made after ``generation`` was current: mark it sold out,
    for :data:`MARK_TTL_S` (then a purchase reads the shelf again and marks it again)."""
    value = f"{generation}:{limit}:{ends_at.timestamp() if ends_at else ''}"
    try:
        with client().pipeline() as pipe:  # one MULTI: no process keeps "unmarked" past the mark
            pipe.set(_keys(sku)[1], value, px=int(MARK_TTL_S * 1000))
            pipe.publish(MARKED_CHANNEL, sku)
            pipe.execute()
        MARKS.drop(sku, marked=True)  # this process's next purchase reads the mark, not its message's race
    except redis.RedisError as exc:
        logger.warning("could not mark %s sold out: %s", sku, exc)


def note_order(sku: str, *, customer: str, key: str, order_id: int, era: int) -> None:
    """Note a keyed order for its retries, in the era read before the purchase: if a reset has
    deleted the order since, the era has moved on and the note never counts."""
    if key:
        try:
            client().set(_note_key(sku, customer, key), f"{era}:{order_id}", ex=IDEMPOTENCY_TTL_S)
        except redis.RedisError as exc:
            logger.warning("could not note idempotency key for %s: %s", sku, exc)


def raise_generation(sku: str, *, new_era: bool = False) -> None:
    """Raise the sale's generation (and with ``new_era`` its era: the orders are gone, so are their
    notes) and tell every process's listener, in one MULTI."""
    with client().pipeline() as pipe:
        pipe.incr(generation_key(sku))
        if new_era:
            pipe.incr(era_key(sku))
        pipe.publish(CHANNEL, sku)
        pipe.execute()


def sale_changed(sku: str, *, new_era: bool = False) -> None:
    """After a restock, reset or deletion has committed: every mark of ``sku`` stops counting
    (and with ``new_era``, every idempotency note)."""
    try:
        raise_generation(sku, new_era=new_era)
    except redis.RedisError:
        # The mark may now say "sold out" until it runs out (MARK_TTL_S, in Redis and in each process).
        logger.exception("could not clear the sold-out mark of %s", sku)
