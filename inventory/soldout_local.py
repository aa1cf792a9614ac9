"""The sold-out mark kept in each process, so a late shopper's "sold out" costs no round trip.

Once this process has seen a product's mark in Redis (:mod:`inventory.soldout`), it keeps it, and
on the first keyed request the product's (customer, Idempotency-Key) → order pairs, read once: a
product marked sold out has no stock for the mark's generation, so its orders are final and every
later keyed retry is answered from memory too. redis-py's own client-side cache needs Redis 7.4
(this machine has 7.0), so invalidation is a pub/sub message: whoever raises a sale's generation
(restock, reset, an edit of the product) publishes the SKU on its database's :func:`channels` in the same MULTI,
and a listener thread per process drops that SKU's mark when told.

Never stale for long: a process keeps marks only while its listener is subscribed. When the
listener's connection breaks, it drops every mark at once and keeps none until it has subscribed
again (a restock in between would be missed). And a kept mark lives :data:`MARK_TTL_S` at most, as
the mark in Redis does: a restock whose message was never sent (its after-commit raise failed) or
a generation that went back (Redis restored from an older RDB) ends "sold out" within seconds.
A mark is kept only if no message for its SKU arrived between the read that found it and the
keeping (an *epoch* per SKU, raised by every message).
After a fork the child starts empty, with a listener of its own.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import redis

if TYPE_CHECKING:
    from .strategies.contract import Shelf

logger = logging.getLogger(__name__)


def channels(db: int) -> tuple[str, str]:
    """The sale-changed and sold-out channels of the shop on Redis database ``db``. Redis delivers a
    PUBLISH to the subscribers of every database of its server, so the names carry the database:
    another shop on the same server (another checkout, another test worker) selling a SKU of the same
    name must not drop this one's memory.

    Sold-out is where :func:`inventory.soldout.mark` says a SKU was just marked: a process that knew
    it unmarked (a :class:`Clear`) forgets that and reads Redis again. Kept marks stay (a mark
    changes nothing they say), so the sale-changed channel is not used for it."""
    return f"flashsale:{db}:sale-changed", f"flashsale:{db}:sold-out"


def database_of(client: redis.Redis) -> int:
    """The Redis database number ``client`` talks to."""
    return int(client.connection_pool.connection_kwargs.get("db", 0))


#: The listener's connection name in CLIENT LIST (followed by the pid).
LISTENER_NAME = "soldout-listener"
#: How long the listener waits before it subscribes again after its connection broke.
RECONNECT_S = 0.5
#: How long a mark lives, in Redis and in each process: a restock whose message never arrived
#: (its after-commit raise failed, or Redis came back from an older RDB) ends "sold out" by then.
MARK_TTL_S = 2.0


def clock() -> float:
    """Seconds on the clock marks run out by: :func:`time.monotonic` (a test may put its own in)."""
    return time.monotonic()


@dataclass
class Entry:
    generation: int
    limit: int
    ends_at: float | None
    orders: dict[tuple[str, str], tuple[int, int]] | None = None  # (id, units), read on the first keyed request
    kept_until: float = field(default_factory=lambda: clock() + MARK_TTL_S)


@dataclass
class Clear:
    """A SKU this process read unmarked in Redis, with the generation of that read: until
    a message says it was marked (or its sale changed), a purchase needs no read of Redis. Wrong
    only in the slow direction: a missed mark sends a purchase to the shelf, which answers it."""

    generation: int
    kept_until: float = field(default_factory=lambda: clock() + MARK_TTL_S)
    #: The row as a shelf read saw it while this entry was kept (:meth:`LocalMarks.remember`): its
    #: id, per-customer limit and sale window hold while the entry does, as any change of the
    #: product sends the message that drops it; its stock is history and never read.
    shelf: Shelf | None = None


class LocalMarks:
    """Marks by SKU in this process (and SKUs known unmarked), dropped by the listener's messages."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._entries: dict[str, Entry] = {}
        self._clear: dict[str, Clear] = {}
        self._epochs: dict[str, int] = {}  # per SKU, raised by every message about it
        self._marked_epochs: dict[str, int] = {}  # per SKU, raised by its marks' messages only
        self._breaks = 0  # raised when the listener's connection breaks: every epoch taken before is void
        self._subscribed = threading.Event()
        self._owner: int | None = None  # the pid whose listener thread serves these marks
        self._url: str | None = None
        # Raised by every listener started: only the latest one serves these marks. One left behind
        # by a change of URL (or of process) stops at its next poll and touches nothing meanwhile,
        # even if the URL has changed back to its own.
        self._generation = 0

    def get(self, sku: str, *, url: str) -> Entry | None:
        with self._lock:
            mine = self._owner == os.getpid() and self._url == url
            entry = self._entries.get(sku) if mine and self._subscribed.is_set() else None
            if entry is not None and clock() >= entry.kept_until:
                del self._entries[sku]  # ran out: ask Redis (and then the database) again
                return None
            return entry

    def clear(self, sku: str, *, url: str) -> Clear | None:
        """What this process knows of ``sku`` being unmarked, if it still counts."""
        with self._lock:
            mine = self._owner == os.getpid() and self._url == url
            known = self._clear.get(sku) if mine and self._subscribed.is_set() else None
            if known is not None and clock() >= known.kept_until:
                del self._clear[sku]
                return None
            return known

    def epoch(self, sku: str, *, url: str) -> tuple[int, int, int] | None:
        """Taken before reading Redis; None while marks cannot be kept (no listener subscribed)."""
        self._listen(url)
        with self._lock:
            return self._epoch(sku) if self._subscribed.is_set() else None

    def _epoch(self, sku: str) -> tuple[int, int, int]:
        return (self._breaks, self._epochs.get(sku, 0), self._marked_epochs.get(sku, 0))

    def keep(self, sku: str, entry: Entry | Clear, *, epoch: tuple[int, int, int] | None) -> bool:
        """Keep ``entry`` unless a message (or a break) that voids it came since ``epoch`` was
        taken: any message voids the knowledge that the SKU is unmarked; a mark is voided by a
        break or a change of its sale, not by a mark's message (its own, arriving late)."""
        with self._lock:
            if epoch is None or not self._subscribed.is_set():
                return False
            now = self._epoch(sku)
            if isinstance(entry, Clear):
                if epoch != now:
                    return False
                self._clear[sku] = entry
            else:
                if epoch[:2] != now[:2]:
                    return False
                self._entries[sku] = entry
            return True

    def remember(self, sku: str, clear: Clear, shelf: Shelf) -> None:
        """Keep ``shelf`` with ``clear`` if ``clear`` is still what this process knows of ``sku``
        (a message since would have dropped it: the read may predate the change it announced)."""
        with self._lock:
            if self._clear.get(sku) is clear:
                clear.shelf = shelf

    def forget(self, sku: str, clear: Clear) -> None:
        """Drop ``clear`` if it is still what this process knows of ``sku``: a SKU no product has is
        not kept (a client naming ever new SKUs would grow this memory without bound)."""
        with self._lock:
            if self._clear.get(sku) is clear:
                del self._clear[sku]

    def drop(self, sku: str, *, marked: bool = False) -> None:
        """A message about ``sku``: its sale changed (drop everything kept of it), or with
        ``marked`` it was just marked (drop only the knowledge that it was not)."""
        with self._lock:
            self._clear.pop(sku, None)
            if marked:
                self._marked_epochs[sku] = self._marked_epochs.get(sku, 0) + 1
            else:
                self._epochs[sku] = self._epochs.get(sku, 0) + 1
                self._entries.pop(sku, None)

    def drop_all(self, *, subscribed: bool = False, generation: int | None = None) -> None:
        """Forget every mark (and void every epoch taken); ``subscribed``: the listener still is.
        With ``generation``, only if that listener is still the one serving the marks."""
        with self._lock:
            if generation is not None and generation != self._generation:
                return
            if not subscribed:
                self._subscribed.clear()
            self._breaks += 1
            self._entries.clear()
            self._clear.clear()

    def _listen(self, url: str) -> None:
        """Start this process's listener (once per process, and again after a fork)."""
        if self._owner == os.getpid() and self._url == url:
            return
        with self._lock:
            if self._owner == os.getpid() and self._url == url:
                return
            self._entries.clear()
            self._clear.clear()
            self._subscribed.clear()
            self._breaks += 1
            self._owner, self._url = os.getpid(), url
            self._generation += 1
            generation = self._generation
        thread = threading.Thread(target=self._run, args=(url, generation), name="soldout-listener", daemon=True)
        thread.start()
        self._subscribed.wait(0.5)  # the first purchases may go to Redis while it subscribes

    def _serving(self, generation: int) -> bool:
        """Whether the listener of ``generation`` is still the one serving these marks."""
        return self._owner == os.getpid() and self._generation == generation

    def _run(self, url: str, generation: int) -> None:
        while self._serving(generation):
            client = redis.Redis.from_url(
                url, socket_connect_timeout=1, health_check_interval=5, client_name=f"{LISTENER_NAME}-{os.getpid()}"
            )
            pubsub = client.pubsub()
            try:
                pubsub.subscribe(*channels(database_of(client)))
                self._serve(pubsub, generation)
            except redis.RedisError as exc:
                logger.warning("sold-out listener lost Redis (%s): local marks dropped", exc)
            except Exception:  # noqa: BLE001 - nothing restarts a listener that dies: it must not
                logger.exception("sold-out listener failed: local marks dropped, listening again")
            finally:
                self.drop_all(generation=generation)  # a listener left behind leaves the new one's marks be
                pubsub.close()
                client.close()
            if self._serving(generation):
                time.sleep(RECONNECT_S)

    def _serve(self, pubsub, generation: int) -> None:
        while self._serving(generation):
            message = pubsub.get_message(timeout=1.0)
            if message is None:
                pubsub.ping()  # a dead connection shows here, not only when a message is due
            elif message["type"] == "subscribe" and message["data"] == 2:  # both channels
                self._subscribed_by(generation)
            elif message["type"] == "message" and self._serving(generation):
                self.drop(message["data"].decode(), marked=message["channel"].endswith(b":sold-out"))

    def _subscribed_by(self, generation: int) -> None:
        with self._lock:
            if generation == self._generation:
                self._subscribed.set()


MARKS = LocalMarks()
