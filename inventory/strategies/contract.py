"""The contract between the purchase path and the strategies: outcomes, grants, what a read saw, refusals.

Values only, no behaviour: the strategies (``base``, ``section`` and one module each) and the
purchase path (``inventory.services``) import them from here, so none of them imports back.
:class:`SectionParts` is what the section code (``section``, ``batch``) needs of a strategy, so
that code never imports the ``Strategy`` class that calls it.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from enum import Enum
from typing import TYPE_CHECKING, Callable, Protocol

if TYPE_CHECKING:
    from ..models import Order


def generation_key(sku: str) -> str:
    """The Redis key of a sale's generation: raised after every restock, reset or save commits
    (``inventory.soldout``), read before a row that ``redis-stock`` loads its counter from."""
    return f"flashsale:generation:{{{sku}}}"


class Outcome(str, Enum):
    CONFIRMED = "confirmed"
    SOLD_OUT = "sold_out"
    LIMIT_REACHED = "limit_reached"
    BUSY = "busy"
    NOT_ON_SALE = "not_on_sale"


class LockUnavailable(Exception):
    """The strategy could not grant exclusive access in time; the shopper should retry."""


class StaleFence(Exception):
    """A newer lock grant has already written the row: this holder's lease ran out."""


@dataclass(frozen=True)
class Needed:
    """A process a strategy needs running, as a value: its kind (``redis``, ``etcd``) and the URLs it talks to.

    The strategy starts nothing; ``processes.needs`` maps a need to the process behind it.
    """

    kind: str
    urls: tuple[str, ...]


@dataclass(frozen=True)
class Grant:
    """What the guard hands the section: the fencing token, and a way to move it forward.

    ``advance(past)`` (distributed locks only) raises the lock service's counter above ``past``
    while this grant still holds the lock, and returns the new token; it raises when the lock
    is no longer held. See :meth:`FencedLockStrategy.recover`. ``held()`` (locks that learn of
    their own loss, as a ZooKeeper session does) is False once the lock is known lost: the
    section then stops before it writes.
    """

    token: int | None = None
    advance: Callable[[int], int] | None = None
    held: Callable[[], bool] | None = None


NO_GRANT = Grant()


@dataclass(frozen=True)
class Shelf:
    """What one read of the product row saw."""

    product_id: int
    stock: int
    version: int
    fence: int
    per_customer_limit: int
    sale_starts_at: datetime | None
    sale_ends_at: datetime | None
    price: Decimal  # a unit's price at this read: what an order decided on it records (``Order.unit_price``)


@dataclass(frozen=True)
class Refusal:
    outcome: Outcome
    units_left: int | None = None  # with SOLD_OUT: how many are still on the shelf


@dataclass(frozen=True)
class SectionResult:
    """What one run of the section did: exactly one field is set. (Not the lock library's
    ``Attempt``, which is one try at taking a lock.)"""

    order: Order | None = None  # confirmed (a new order, or the one an idempotency key names)
    refusal: Refusal | None = None
    conflict: Shelf | None = None  # the storage check refused the write based on this read
    replayed: bool = False  # with ``order``: an earlier order with the same idempotency key


class SectionParts(Protocol):
    """What the section asks of a strategy: its name (recorded on each order), how long its
    transaction may wait for a row lock, its read and its write.

    Every :class:`~inventory.strategies.base.Strategy` is one; ``section`` and ``batch`` take this
    instead of importing the base class back.
    """

    name: str
    row_lock_timeout_ms: int
    for_update: bool  # the read takes the row's lock (SELECT ... FOR UPDATE)

    def read_section(
        self, product_id: int, *, customer: str | None = None, key: str = ""
    ) -> tuple[Shelf, int | None, int]: ...

    def read_batch(
        self, product_id: int, *, customers: set[str], pairs: set[tuple[str, str]]
    ) -> tuple[Shelf, dict[str, int], dict[tuple[str, str], Order]]: ...

    def stock_update(self, shelf: Shelf, *, quantity: int, grant: Grant) -> tuple[str, list]: ...

    def write(self, shelf: Shelf, *, quantity: int, grant: Grant) -> bool: ...
