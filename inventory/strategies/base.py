"""The contract every purchase strategy fulfils.

A purchase is one critical section: read the product row, decide (the rules in
:func:`inventory.strategies.section.decide`, the same for every strategy), write. A strategy
supplies only how that section runs:

* ``guard(sku)``: a context manager held around the whole section, released only after the
  transaction has committed. It yields a :class:`Grant` (the fencing token, if any) and raises
  :class:`LockUnavailable` when exclusive access cannot be had in time. No guard: a grant
  without a token.
* ``read_section(product_id, customer=, key=)``: the :class:`~inventory.strategies.section.Shelf`
  the decision works on, the customer's order under the key and their units, the transaction's
  first statement (a plain read, or ``SELECT ... FOR UPDATE`` when ``for_update``, as for ``db``).
* ``stock_update(shelf, quantity=, grant=)``: the stock write as one UPDATE statement, which the
  section runs with the units and the order; no row changed when the storage check refused it (a
  *conflict*: the row changed since the read, or a newer token has written). ``write`` runs it alone.

Two mechanisms protect the section and the strategies vary them one at a time: the **guard**
(a lock) and the **storage check** (fence / version compare-and-set). See the README's matrix.

A strategy also describes itself, so the commands and the checks need no list of their own:
``needs()`` (what must be running: :class:`Needed` values, kind and URLs), ``server_env()``
(what its gunicorn children need in their environment) and ``checks()`` (system checks).

Under ASGI (``SHOP_SERVER=asgi``) the purchase awaits ``aguard(sku)`` on the event loop instead
of ``guard``: the same grant, from an asyncio lock. A strategy whose guard would block the loop
says why in ``loop_refusal`` and is refused there.
"""

from __future__ import annotations

import time
from contextlib import AbstractAsyncContextManager, AbstractContextManager, asynccontextmanager, nullcontext
from typing import AsyncIterator, Callable

from django.core import checks as django_checks
from django.core.exceptions import ImproperlyConfigured

from ..models import Order
from .batch import Ask, BatchAttempt, batch_section
from .contract import NO_GRANT, Grant, Needed, SectionResult, Shelf
from .section import attempt_section, batch_reads, section_read
from .statements import Statement, run_update

#: Where purchases queue for a shared section: in the process (``local``) or in the shop's Redis (``shared``).
QUEUES = ("local", "shared")
#: The longest ``BATCH_LINGER_MS``: a linger is a few milliseconds of group commit, not a timer.
MAX_LINGER_MS = 1000


class Strategy:
    """Base class; one subclass per strategy, one module per subclass."""

    name: str = ""
    #: What guards the section and what checks the write, for tables and the README's matrix.
    guard_label: str = "none"
    check_label: str = "none"
    #: True when ``guard()`` takes a lock: its wait and hold are then reported (``Server-Timing``).
    guarded: bool = False
    #: A control: it must fail under load. Loads only with ``ALLOW_UNSAFE_STRATEGY=1``.
    control: bool = False
    #: The section reads the row with ``SELECT ... FOR UPDATE`` (``db``): the row's lock is the guard.
    for_update: bool = False
    #: This strategy's ``INVENTORY["OPTIONS"]`` keys and their defaults; every strategy has ``BATCH``
    #: (purchases one section may serve: 1 runs each purchase alone, see :mod:`inventory.combining`)
    #: and ``QUEUE``, where a batch's purchases queue: ``local`` (in the process) or ``shared`` (in Redis).
    #: ``BATCH_LINGER_MS``: how long a batch's leader waits for company first (only without a lock).
    default_options: dict = {"BATCH": 1, "QUEUE": "local", "BATCH_LINGER_MS": 20}
    #: How often the section runs before the shopper is told "busy" (optimistic retries).
    max_attempts: int = 1
    #: Why this strategy cannot serve on an event loop (ASGI), or "" when it can.
    loop_refusal: str = ""
    #: Its "sold out" is decided before the database's row (``redis-stock``: a Redis counter), so an
    #: order for the last units may still be on its way to the row: the sold-out mark then waits
    #: until the row holds none (:func:`inventory.services.finish`).
    sold_out_before_the_row: bool = False

    def __init__(self, *, config: dict) -> None:
        if self.control and not config.get("ALLOW_UNSAFE"):
            raise ImproperlyConfigured(
                f"INVENTORY_STRATEGY={self.name} oversells by design; set ALLOW_UNSAFE_STRATEGY=1 to run it anyway"
            )
        self.config = config
        given = config.get("OPTIONS") or {}
        defaults = {**Strategy.default_options, **self.default_options}
        self.options = {key: given.get(key, default) for key, default in defaults.items()}
        batch = self.options["BATCH"]
        if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
            raise ImproperlyConfigured(f"INVENTORY_BATCH={batch!r}: use a whole number, 1 or more (1: no combining)")
        self.batch: int = batch
        queue = self.options["QUEUE"]
        if queue not in QUEUES:
            raise ImproperlyConfigured(f"INVENTORY_QUEUE={queue!r}: use {' or '.join(QUEUES)}")
        #: Where a batch's purchases queue (with BATCH > 1): ``local`` or ``shared``.
        self.queue: str = queue
        linger = self.options["BATCH_LINGER_MS"]
        if isinstance(linger, bool) or not isinstance(linger, int) or not 0 <= linger <= MAX_LINGER_MS:
            raise ImproperlyConfigured(
                f"INVENTORY_BATCH_LINGER_MS={linger!r}: use whole milliseconds from 0 to {MAX_LINGER_MS} (0: no wait)"
            )
        #: Seconds a batch's leader waits for more purchases before its section, when its last batch
        #: had company (:func:`inventory.combining.lead_batch`): group commit. Only without a lock
        #: (``guarded``): a lock's wait already gathers the queue, and nothing waits while holding it.
        self.linger_s: float = 0.0 if self.guarded else linger / 1000
        #: PostgreSQL's ``lock_timeout`` for the section's transaction (0 would mean "wait forever").
        self.row_lock_timeout_ms = max(1, int(config.get("ROW_LOCK_TIMEOUT_MS", 5_000)))

    # The section's parts ---------------------------------------------------------------------

    def guard(self, sku: str) -> AbstractContextManager[Grant]:
        return nullcontext(NO_GRANT)

    def aguard(self, sku: str) -> AbstractAsyncContextManager[Grant]:
        """``guard`` on the event loop (ASGI); a strategy that overrides ``guard`` overrides this too."""
        if type(self).guard is not Strategy.guard:
            raise NotImplementedError("subclasses of Strategy that provide guard() must provide aguard() for ASGI")
        return _no_guard()

    def read_section(
        self, product_id: int, *, customer: str | None = None, key: str = ""
    ) -> tuple[Shelf, int | None, int]:
        """The section's first statement: the row and the customer's order and units (:func:`section_read`)."""
        return section_read(self, product_id, customer=customer, key=key)

    def read_batch(
        self, product_id: int, *, customers: set[str], pairs: set[tuple[str, str]]
    ) -> tuple[Shelf, dict[str, int], dict[tuple[str, str], Order]]:
        """A batch's first message: the row, the ``customers``' units and their orders under the
        ``pairs``' keys (:func:`batch_reads`)."""
        return batch_reads(self, product_id, customers, pairs)

    def stock_update(self, shelf: Shelf, *, quantity: int, grant: Grant) -> Statement:
        """The stock write, as one UPDATE statement (the section runs it with the inserts)."""
        raise NotImplementedError("subclasses of Strategy must provide stock_update()")

    def write(self, shelf: Shelf, *, quantity: int, grant: Grant) -> bool:
        """The stock write alone; False when its check refused it."""
        return run_update(self.stock_update(shelf, quantity=quantity, grant=grant))

    def attempt(self, *, product_id: int, customer: str, quantity: int, key: str, grant: Grant) -> SectionResult:
        """One run of the section in one transaction; ``atomic`` replaces it with one statement."""
        return attempt_section(self, product_id=product_id, customer=customer, quantity=quantity, key=key, grant=grant)

    def attempt_batch(
        self,
        *,
        product_id: int,
        asks: list[Ask],
        grant: Grant,
        savepoint_each: bool = False,
        joining: Callable[[], list[Ask]] | None = None,
    ) -> BatchAttempt:
        """One run of the section for a batch of purchases (``BATCH`` > 1): one read, one write;
        ``joining``: purchases that queued while the read waited for the row lock join it
        (:func:`~.batch.batch_section`)."""
        return batch_section(
            self, product_id=product_id, asks=asks, grant=grant, savepoint_each=savepoint_each, joining=joining
        )

    def recover(self, shelf: Shelf, grant: Grant) -> Grant | None:
        """After a conflict: a grant to run the section again with, or None to give up."""
        return None

    def backoff_s(self, attempt: int) -> float:
        """How long to wait before attempt ``attempt + 1`` (only with ``max_attempts`` > 1)."""
        return 0.0

    def after_conflict(self, shelf: Shelf, grant: Grant, *, recovered: bool, attempt: int) -> tuple[Grant, bool] | None:
        """Attempt ``attempt`` (from 0) met a conflict (``shelf``, the row as it was): the grant to run
        the section again with and whether it came from :meth:`recover` (once a purchase), after
        :meth:`backoff_s` for a plain retry; None when the purchase is to be answered busy. The one
        retry policy of a purchase alone and of a batch."""
        again = None if recovered else self.recover(shelf, grant)
        if again is not None:
            return again, True
        if attempt + 1 < self.max_attempts:
            time.sleep(self.backoff_s(attempt))
            return grant, recovered
        return None

    # Self-description ------------------------------------------------------------------------

    @classmethod
    def needs(cls, config: dict) -> list[Needed]:
        return []

    @classmethod
    def server_env(cls, config: dict) -> dict[str, str]:
        return {"ALLOW_UNSAFE_STRATEGY": "1"} if cls.control else {}

    @classmethod
    def checks(cls, config: dict) -> list[django_checks.CheckMessage]:
        if cls.control:
            return [
                django_checks.Warning(
                    f"INVENTORY_STRATEGY={cls.name} is a control: it oversells under concurrency",
                    hint="use db, optimistic, redis, redlock or atomic; the controls exist to show that the audit "
                    "catches oversell",
                    id="inventory.W001",
                )
            ]
        return []

    def close(self) -> None:
        """Release connections held by the strategy."""


@asynccontextmanager
async def _no_guard() -> AsyncIterator[Grant]:
    yield NO_GRANT
