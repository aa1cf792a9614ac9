"""What one purchase came to: its outcome, its counters, where its time went on the server.

Shared by the purchase path (:mod:`inventory.services`) and the combined path
(:mod:`inventory.batched`): an :class:`~inventory.strategies.contract.SectionResult` becomes a
:class:`PurchaseResult`, and a constraint that refused a section's writes becomes the answer
the shopper gets.
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass, field

from django.db import IntegrityError

from .strategies.base import Strategy
from .strategies.contract import Grant, Outcome, Refusal, SectionResult
from .strategies.section import Spans, find_order

logger = logging.getLogger(__name__)


@dataclass
class Timings:
    """Where one purchase spent its time on the server (milliseconds)."""

    lock_wait_ms: float | None = None  # acquiring the guard (None: no guard was taken)
    # The hold: with a lock, from the grant to the release (after commit); without one (db's row lock,
    # atomic, optimistic, redis-stock), the section's transactions, BEGIN to COMMIT (None: none ran).
    lock_hold_ms: float | None = None
    db_ms: float = 0.0  # inside the section's transactions
    total_ms: float = 0.0
    queue_wait_ms: float | None = None  # queued for a combining leader (None: BATCH=1, no queue)
    batch: int | None = None  # purchases served by the section that served this one
    commit_ms: float | None = None  # the section's COMMITs themselves, inside the hold (None: none ran)
    sql_statements: int | None = None  # SQL statements the section's transactions sent (None: none ran)
    sql_ms: float | None = None  # their round trips, send to reply, inside the hold (None: none ran)

    @property
    def outside_ms(self) -> float | None:
        """The purchase's time outside its section: the total less the queue, the guard wait and the
        hold, which follow one another (None when no section ran for it)."""
        if self.lock_hold_ms is None:
            return None
        inside = (self.queue_wait_ms or 0.0) + (self.lock_wait_ms or 0.0) + self.lock_hold_ms
        return max(0.0, self.total_ms - inside)

    def note_transactions(self, spans: Spans, *, since: float | None = None) -> None:
        """The section's commits and statements (each purchase of a batch gets its section's); one
        that joined the batch at ``since`` (``time.perf_counter``) only those it was there for."""
        if spans.ms:
            self.commit_ms = spans.commit_ms
            self.sql_statements, self.sql_ms = spans.since(since)


@dataclass(frozen=True)
class PurchaseResult:
    outcome: Outcome
    backend: str
    order_id: int | None = None
    fence: int | None = None
    units_left: int | None = None  # with SOLD_OUT: units still on the shelf (fewer than asked)
    conflicts: int = 0  # writes the storage check refused
    retries: int = 0  # runs of the section after the first
    constraint_hits: int = 0  # a database constraint refused the write: the strategy failed
    timings: Timings = field(default_factory=Timings)
    quantity: int | None = None  # with CONFIRMED: the order's units (a replayed key's: its first purchase's)

    @property
    def confirmed(self) -> bool:
        return self.outcome is Outcome.CONFIRMED

    def as_wire(self) -> dict:
        """Its fields as JSON values: a shared queue's leader posts it through Redis (:meth:`from_wire`)."""
        return {**asdict(self), "outcome": self.outcome.value}

    @classmethod
    def from_wire(cls, fields: dict) -> PurchaseResult:
        return cls(**{**fields, "outcome": Outcome(fields["outcome"]), "timings": Timings(**fields["timings"])})


# Database constraints that only a failing strategy trips, and what the shopper is told then.
CONSTRAINT_OUTCOMES = {
    "product_stock_not_negative": Outcome.SOLD_OUT,
    "product_stock_at_most_initial": Outcome.BUSY,
    "allocation_within_limit": Outcome.LIMIT_REACHED,
}
IDEMPOTENCY_CONSTRAINT = "order_idempotency_key_once"


def result_of(
    strategy: Strategy,
    attempt: SectionResult,
    *,
    grant: Grant | None = None,
    conflicts: int = 0,
    retries: int = 0,
    timings: Timings,
) -> PurchaseResult:
    common = {"conflicts": conflicts, "retries": retries, "timings": timings}
    if attempt.order is not None:
        return PurchaseResult(
            Outcome.CONFIRMED,
            strategy.name,
            order_id=attempt.order.pk,
            fence=attempt.order.fence,
            quantity=attempt.order.quantity,
            **common,
        )
    refusal: Refusal = attempt.refusal
    return PurchaseResult(
        refusal.outcome, strategy.name, fence=grant.token if grant else None, units_left=refusal.units_left, **common
    )


def constraint_hit(
    strategy: Strategy,
    exc: IntegrityError,
    *,
    product_id: int,
    customer: str,
    key: str,
    conflicts: int,
    retries: int,
    timings: Timings,
) -> PurchaseResult:
    """A constraint refused the section's writes (rolled back): a concurrent twin, or a failed strategy."""
    constraint = getattr(getattr(exc.__cause__, "diag", None), "constraint_name", None)
    if constraint == IDEMPOTENCY_CONSTRAINT:
        # The same key's twin committed first (possible only without a guard): its order is the answer.
        replay = find_order(product_id=product_id, customer=customer, key=key)
        return result_of(strategy, SectionResult(order=replay), conflicts=conflicts, retries=retries, timings=timings)
    if constraint not in CONSTRAINT_OUTCOMES:
        raise exc
    logger.warning(
        "%s: constraint %s refused a purchase (the strategy let a bad write through)", strategy.name, constraint
    )
    return PurchaseResult(
        CONSTRAINT_OUTCOMES[constraint],
        strategy.name,
        conflicts=conflicts,
        retries=retries,
        constraint_hits=1,
        timings=timings,
    )
