"""``redis-stock``: the seckill design. The sale's stock lives in a Redis counter.

One Lua script checks that the sale is on, the shopper's units against the limit and the
counter, and takes both at once; only a shopper it let through touches PostgreSQL, where the
order is written with the same conditional UPDATE as ``atomic`` (so the database stays the
record and still refuses to go below zero). If the database write fails, the units go back to
Redis (compensation), so a failed order never strands stock.

The counter is loaded from the database on first use (and again after ``reset_sale`` or
``restock`` drop it), and ``manage.py reconcile`` puts it back in step with the database: the
source article's "end-of-day batch job". What can still go wrong: Redis and the database
drift (a Redis restart forgets the counter and reloads it; a crash between the script and the
compensation strands units until ``reconcile``); the database's check refuses what Redis let
through, so drift costs refusals, never oversell.
"""

from __future__ import annotations

import logging
from typing import Callable

import redis
from django.db import IntegrityError, OperationalError
from django.utils import timezone

from ..models import Allocation, Product
from .base import Strategy
from .batch import Ask, BatchAttempt, batch_section
from .contract import Grant, Needed, Outcome, Refusal, SectionResult, Shelf, generation_key
from .section import find_order, lock_timed_out, take_in_one_statement
from .statements import Statement, sale_read, take_update

logger = logging.getLogger(__name__)

# KEYS[1] sale hash {stock, limit, starts_ms, ends_ms}; KEYS[2] hash customer -> units held.
# ARGV[1] customer, ARGV[2] quantity, ARGV[3] now in ms, ARGV[4] the (customer, key) pair ('' without
# a key), ARGV[5] how long a taken pair's marker lives (ms).
# Returns {code, stock}: -1 not loaded, 0 not on sale, 1 limit reached, 2 sold out, 3 taken, 5 the
# same pair was taken and its database write may still be in flight (its marker, KEYS[1]:pending:pair).
TAKE = """
if redis.call('EXISTS', KEYS[1]) == 0 then return {-1, 0} end
local pending = ARGV[4] ~= '' and KEYS[1] .. ':pending:' .. ARGV[4]
if pending and redis.call('EXISTS', pending) == 1 then return {5, 0} end
local sale = redis.call('HMGET', KEYS[1], 'stock', 'limit', 'starts_ms', 'ends_ms')
local stock, limit = tonumber(sale[1]), tonumber(sale[2])
local now, q = tonumber(ARGV[3]), tonumber(ARGV[2])
if (sale[3] ~= '' and now < tonumber(sale[3])) or (sale[4] ~= '' and now >= tonumber(sale[4])) then
  return {0, stock}
end
if tonumber(redis.call('HGET', KEYS[2], ARGV[1]) or '0') + q > limit then return {1, stock} end
if stock < q then return {2, stock} end
redis.call('HINCRBY', KEYS[2], ARGV[1], q)
if pending then redis.call('SET', pending, 1, 'PX', ARGV[5]) end
return {3, redis.call('HINCRBY', KEYS[1], 'stock', -q)}
"""
# Compensation: give back what TAKE took. KEYS as TAKE; ARGV[1] customer, ARGV[2] quantity, ARGV[3]
# its pair ('' without a key), whose marker goes with it.
GIVE_BACK = """
if redis.call('EXISTS', KEYS[1]) == 1 then redis.call('HINCRBY', KEYS[1], 'stock', ARGV[2]) end
if ARGV[3] ~= '' then redis.call('DEL', KEYS[1] .. ':pending:' .. ARGV[3]) end
if redis.call('HINCRBY', KEYS[2], ARGV[1], -tonumber(ARGV[2])) <= 0 then redis.call('HDEL', KEYS[2], ARGV[1]) end
return 1
"""
# TAKE for a batch, in queue order. KEYS as TAKE; ARGV[1] now in ms, ARGV[2] a taken pair's marker's
# life (ms), then per purchase: customer, quantity, its (customer, key) pair ('' without a key).
# Returns code, stock per purchase: codes as TAKE, and 4 when an earlier purchase of the batch with
# the same pair was taken (its retry).
TAKE_MANY = """
if redis.call('EXISTS', KEYS[1]) == 0 then return {-1, 0} end
local sale = redis.call('HMGET', KEYS[1], 'stock', 'limit', 'starts_ms', 'ends_ms')
local stock, limit, now = tonumber(sale[1]), tonumber(sale[2]), tonumber(ARGV[1])
local closed = (sale[3] ~= '' and now < tonumber(sale[3])) or (sale[4] ~= '' and now >= tonumber(sale[4]))
local out, seen = {}, {}
for i = 3, #ARGV, 3 do
  local customer, q, pair, code = ARGV[i], tonumber(ARGV[i + 1]), ARGV[i + 2], 3
  if pair ~= '' and seen[pair] then code = 4
  elseif pair ~= '' and redis.call('EXISTS', KEYS[1] .. ':pending:' .. pair) == 1 then code = 5
  elseif closed then code = 0
  elseif tonumber(redis.call('HGET', KEYS[2], customer) or '0') + q > limit then code = 1
  elseif stock < q then code = 2
  else
    redis.call('HINCRBY', KEYS[2], customer, q)
    stock = redis.call('HINCRBY', KEYS[1], 'stock', -q)
    if pair ~= '' then
      seen[pair] = true
      redis.call('SET', KEYS[1] .. ':pending:' .. pair, 1, 'PX', ARGV[2])
    end
  end
  out[#out + 1] = code
  out[#out + 1] = stock
end
return out
"""
# Load the sale if absent (two pods may race to load it: the first wins), with every
# customer's units, only while the sale's generation is the one read before the row was (a restock,
# reset or edit that committed since raised it before dropping the counter: the row is older than
# the drop, and loading it would put back the stock from before). KEYS[1] sale hash, KEYS[2] units
# hash, KEYS[3] the generation (inventory.soldout); ARGV[1] that generation, ARGV[2] '1' to replace
# a loaded sale (reconcile), ARGV[3..6] stock, limit, starts_ms, ends_ms ('' when open-ended); then
# customer, units pairs. Returns 1 loaded, 0 already loaded, -1 the row is older than the generation.
LOAD = """
if tonumber(redis.call('GET', KEYS[3]) or '0') ~= tonumber(ARGV[1]) then return -1 end
if ARGV[2] == '1' then redis.call('DEL', KEYS[1]) elseif redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
redis.call('DEL', KEYS[2])
for i = 7, #ARGV, 2 do redis.call('HSET', KEYS[2], ARGV[i], ARGV[i + 1]) end
redis.call('HSET', KEYS[1], 'stock', ARGV[3], 'limit', ARGV[4], 'starts_ms', ARGV[5], 'ends_ms', ARGV[6])
return 1
"""


#: How many times a purchase loads the sale's counter when its script finds it missing (a restock or
#: a reset drops it as it commits: each load races the next one) before it answers busy.
LOAD_TRIES = 3


def sale_key(sku: str) -> str:
    return f"flashsale:stock:{{{sku}}}:sale"


def units_key(sku: str) -> str:
    return f"flashsale:stock:{{{sku}}}:units"


def epoch_ms(moment) -> str:
    """A datetime as the milliseconds-since-the-epoch string the Lua script compares ("" for none)."""
    return "" if moment is None else str(int(moment.timestamp() * 1000))


def sale_generation(client: redis.Redis, sku: str) -> int:
    """The sale's generation, to read *before* the row that :func:`load_sale` loads."""
    return int(client.get(generation_key(sku)) or 0)


def load_sale(client: redis.Redis, product: Product, *, generation: int, replace: bool = False) -> int:
    """Put the product's stock, limit, window and customers' units into Redis, from the database.

    ``product`` must have been read after ``generation`` (:func:`sale_generation`) was: if the
    generation has moved since (a restock, reset or edit committed, and its drop of the counter
    ran or is about to), nothing is loaded and the answer is -1: read the row again. Only if
    absent, unless ``replace`` (what ``reconcile`` does). 1 when it loaded, 0 when already loaded.
    """
    keys = [sale_key(product.sku), units_key(product.sku), generation_key(product.sku)]
    held = Allocation.objects.filter(product_id=product.pk).values_list("customer", "units")
    args = [
        generation,
        "1" if replace else "0",
        product.stock,
        product.per_customer_limit,
        epoch_ms(product.sale_starts_at),
        epoch_ms(product.sale_ends_at),
    ]
    args += [value for pair in held for value in pair]
    return int(client.eval(LOAD, 3, *keys, *args))


def forget_sale(client: redis.Redis, sku: str, *, units_too: bool) -> None:
    """Drop the counter so the next purchase loads it from the database (after restock/reset); with
    ``units_too`` (a reset, whose orders are gone) the customers' units and the keyed purchases' markers."""
    markers = list(client.scan_iter(match=pending_key(sku, "*"), count=1000)) if units_too else []
    client.delete(sale_key(sku), *([units_key(sku), *markers] if units_too else []))


def pair_of(customer: str, key: str) -> str:
    """A keyed purchase's (customer, key) pair as the scripts name it ('' without a key)."""
    return f"{customer}:{key}" if key else ""


def pending_key(sku: str, pair: str) -> str:
    """The marker TAKE leaves for a keyed purchase it took: its twins are told busy, not refused,
    while its database write may be in flight."""
    return f"{sale_key(sku)}:pending:{pair}"


def _twin(product_id: int, customer: str, key: str) -> SectionResult:
    """A keyed purchase whose twin (the same key, sent again) TAKE took: the twin's order once it has
    committed, else busy (its write may be in flight; the retry finds the order), never a refusal
    that the twin's own units caused."""
    order = find_order(product_id=product_id, customer=customer, key=key)
    return (
        SectionResult(order=order, replayed=True) if order is not None else SectionResult(refusal=Refusal(Outcome.BUSY))
    )


class RedisStockStrategy(Strategy):
    name = "redis-stock"
    guard_label = "none (Lua decrement of a Redis counter)"
    sold_out_before_the_row = True
    check_label = "database keeps the record (UPDATE … WHERE stock >= q)"

    def __init__(self, *, config: dict) -> None:
        super().__init__(config=config)
        self.client = redis.Redis.from_url(config["REDIS_URL"], socket_timeout=2.0, socket_connect_timeout=2.0)
        self.take = self.client.register_script(TAKE)
        self.give_back = self.client.register_script(GIVE_BACK)
        self.take_many = self.client.register_script(TAKE_MANY)
        #: A taken keyed purchase's marker outlives its database write (bounded by the row lock timeout).
        self.pending_ms = max(config["LOCK_TTL_MS"], config["ROW_LOCK_TIMEOUT_MS"])

    def attempt(self, *, product_id: int, customer: str, quantity: int, key: str, grant: Grant) -> SectionResult:
        product, replays = sale_read(product_id, {(customer, key)} if key else set())
        if replays:
            return SectionResult(order=replays[(customer, key)], replayed=True)
        keys = [sale_key(product.sku), units_key(product.sku)]
        now_ms = epoch_ms(timezone.now())
        try:
            args = [customer, quantity, now_ms, pair_of(customer, key), self.pending_ms]
            code, stock = self._loaded(product, lambda: self.take(keys=keys, args=args))
        except redis.RedisError as exc:
            logger.warning("redis-stock: Redis unavailable (%s)", exc)
            return SectionResult(refusal=Refusal(Outcome.BUSY))
        if code == -1:
            return SectionResult(refusal=Refusal(Outcome.BUSY))  # restocks kept dropping the counter
        if code == 5:
            return _twin(product_id, customer, key)
        if code != 3:
            return SectionResult(
                refusal={
                    0: Refusal(Outcome.NOT_ON_SALE),
                    1: Refusal(Outcome.LIMIT_REACHED),
                    2: Refusal(Outcome.SOLD_OUT, units_left=max(int(stock), 0)),
                }[code]
            )
        try:
            attempt = take_in_one_statement(
                self, product_id=product_id, customer=customer, quantity=quantity, key=key, grant=grant
            )
        except BaseException:
            self._compensate(keys, customer, quantity, key)
            raise
        if attempt.order is None or attempt.replayed:
            self._compensate(keys, customer, quantity, key)  # refused, or a twin's order came back
        return attempt

    def stock_update(self, shelf: Shelf, *, quantity: int, grant: Grant) -> Statement:
        return take_update(shelf.product_id, quantity, now=timezone.now())

    def recover(self, shelf: Shelf, grant: Grant) -> Grant | None:
        return grant

    def attempt_batch(
        self,
        *,
        product_id: int,
        asks: list[Ask],
        grant: Grant,
        savepoint_each: bool = False,
        joining: Callable[[], list[Ask]] | None = None,
    ) -> BatchAttempt:
        """One script takes the batch's units in Redis, in order; the taken ones are written as one
        batch (:func:`batch_section`); whatever the database does not confirm goes back to Redis.
        ``savepoint_each``: each purchase alone, as :meth:`attempt` runs it. ``joining`` is not
        called: nothing here waits for a row lock, so nothing queues during a read to join."""
        if savepoint_each:
            return BatchAttempt(attempts=[self._alone(product_id, ask, grant) for ask in asks])
        product, replays = sale_read(product_id, {(ask.customer, ask.key) for ask in asks if ask.key})
        fresh = [i for i, ask in enumerate(asks) if not (ask.key and (ask.customer, ask.key) in replays)]
        keys = [sale_key(product.sku), units_key(product.sku)]
        try:
            codes = self._take_many(product, keys, [asks[i] for i in fresh])
        except redis.RedisError as exc:
            logger.warning("redis-stock: Redis unavailable (%s)", exc)
            codes = [(-2, 0)] * len(fresh)
        taken = [index for index, (code, _) in zip(fresh, codes, strict=True) if code == 3]
        try:
            db = (
                batch_section(self, product_id=product_id, asks=[asks[i] for i in taken], grant=grant)
                if taken
                else BatchAttempt(attempts=[])
            )
        except BaseException:
            self._compensate_many(keys, [asks[i] for i in taken])
            raise
        if db.conflict is not None:
            self._compensate_many(keys, [asks[i] for i in taken])
            return db
        written = dict(zip(taken, db.attempts, strict=True))
        self._compensate_many(keys, [asks[i] for i, a in written.items() if a.order is None or a.replayed])
        answers = {
            i: _twin(product_id, asks[i].customer, asks[i].key) if code == 5 else self._answer(code, stock)
            for i, (code, stock) in zip(fresh, codes, strict=True)
        }
        answers.update(written)
        return BatchAttempt(attempts=[self._settle(asks, i, answers, replays) for i in range(len(asks))])

    def _take_many(self, product: Product, keys: list[str], asks: list[Ask]) -> list[tuple[int, int]]:
        if not asks:
            return []
        args = [epoch_ms(timezone.now()), self.pending_ms]
        for ask in asks:
            args += [ask.customer, ask.quantity, pair_of(ask.customer, ask.key)]
        found = self._loaded(product, lambda: self.take_many(keys=keys, args=args))
        if found[0] == -1:
            return [(-1, 0)] * len(asks)  # restocks kept dropping the counter: each answered busy
        return [(int(found[i]), int(found[i + 1])) for i in range(0, len(found), 2)]

    def _loaded(self, product: Product, take: Callable[[], list]) -> list:
        """``take()``'s answer once the sale's counter is there: when a script finds it not loaded,
        the sale's generation is read, then the row, and the sale loaded from that row and the
        script run again, up to :data:`LOAD_TRIES` times. Never from the section's own row: a
        restock that committed after that read and dropped the counter would have its units put
        back out of Redis (see :data:`LOAD`, which refuses a row older than the generation).
        Still not loaded after that (restocks dropping it each time): the ``-1`` answer itself."""
        found = take()
        for _ in range(LOAD_TRIES):
            if found[0] != -1:
                break
            generation = sale_generation(self.client, product.sku)
            load_sale(self.client, Product.objects.get(pk=product.pk), generation=generation)
            found = take()
        return found

    @staticmethod
    def _answer(code: int, stock: int) -> SectionResult | None:
        if code in (3, 4):
            return None  # settled from the database's answers
        return SectionResult(
            refusal={
                0: Refusal(Outcome.NOT_ON_SALE),
                1: Refusal(Outcome.LIMIT_REACHED),
                2: Refusal(Outcome.SOLD_OUT, units_left=max(int(stock), 0)),
            }.get(code, Refusal(Outcome.BUSY))
        )

    @staticmethod
    def _settle(asks: list[Ask], index: int, answers: dict, replays: dict) -> SectionResult:
        """A replayed key's order; a repeated key in the batch gets its first purchase's answer."""
        ask = asks[index]
        if ask.key and (ask.customer, ask.key) in replays:
            return SectionResult(order=replays[(ask.customer, ask.key)], replayed=True)
        if answers[index] is not None:
            return answers[index]
        pair = (ask.customer, ask.key)
        same = [answers[i] for i in range(index) if (asks[i].customer, asks[i].key) == pair and answers[i] is not None]
        taken = next((answer for answer in same if answer is not None and answer.order is not None), None)
        return SectionResult(order=taken.order, replayed=True) if taken is not None else same[-1]

    def _alone(self, product_id: int, ask: Ask, grant: Grant) -> SectionResult | IntegrityError:
        try:
            return self.attempt(
                product_id=product_id, customer=ask.customer, quantity=ask.quantity, key=ask.key, grant=grant
            )
        except IntegrityError as exc:
            return exc
        except OperationalError as exc:
            if not lock_timed_out(exc):
                raise
            return SectionResult(refusal=Refusal(Outcome.BUSY))  # its units went back to Redis

    def _compensate_many(self, keys: list[str], asks: list[Ask]) -> None:
        for ask in asks:
            self._compensate(keys, ask.customer, ask.quantity, ask.key)

    def _compensate(self, keys: list[str], customer: str, quantity: int, key: str = "") -> None:
        try:
            self.give_back(keys=keys, args=[customer, quantity, pair_of(customer, key)])
        except redis.RedisError:
            logger.exception(
                "redis-stock: could not give %s unit(s) back to %s; run manage.py reconcile", quantity, keys[0]
            )

    @classmethod
    def needs(cls, config: dict) -> list[Needed]:
        return [Needed("redis", (config["REDIS_URL"],))]

    def close(self) -> None:
        self.client.close()
