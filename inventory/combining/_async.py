"""Flat combining (Hendler et al., SPAA 2010): whoever leads serves the requests queued behind it.

Written once, for asyncio: ``scripts/unasync_locks.py`` generates the blocking twin (``_sync.py``:
``Combiner``, ``lead_batch``) whose submitters are gunicorn's threads; here they are the tasks of
one event loop (ASGI), and a queued purchase holds no thread while it waits.

An :class:`AsyncCombiner` is one queue per hot key, in one process. Each submitter queues a
:class:`Ticket`; the first one to find no leader leads. The leader awaits ``serve(take)``:
``take()`` removes up to ``limit`` tickets from the head of the queue (its own first), and
``serve`` must :meth:`AsyncCombiner.answer` every ticket it took. ``serve`` may call ``take()``
again (its batch's read waited for a row lock, and more queued meanwhile): each call takes what
queued since, up to ``limit`` in all, and returns the batch so far, the same list grown. When ``serve`` returns,
leadership passes to the ticket now at the head, so a leader's own request is never held hostage
by later arrivals and the queue is served in arrival order (no starvation).

What is guaranteed:

* Every ticket gets exactly one answer: from its leader, or, if its deadline passes while it is
  still queued, the ``busy`` answer, after it has left the queue in the same step that decides so
  (under the combiner's mutex); a leader cannot take a ticket that has withdrawn, and a waiter
  cannot withdraw a ticket a leader has taken.
* A taken ticket waits for its leader, which answers it in a ``finally`` (``busy`` when ``serve``
  raised: ``serve`` must answer for itself whatever it has committed, so this is for failures
  before a commit). The leader runs in the same process: if the process dies, so do its waiters,
  and their clients' keyed retries find whatever was committed.
* Liveness needs every submitter to run to its end: a submitter cancelled while queued or
  promoted would leave the queue without a leader. The ASGI purchase shields it
  (:func:`inventory.async_purchase.apurchase`), since Django cancels a view whose client hangs up.

:func:`alead_batch` is the purchase path's ``serve``: the strategy's guard held once for a batch,
the batch section run inside it, each purchase answered with its own timings after the release.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable

from ..results import Timings
from ..strategies.base import Strategy
from ..strategies.contract import LockUnavailable
from ..strategies.section import timed_transactions
from ._async_io import Answers, Event, Mutex, Served, Taken, wait

logger = logging.getLogger(__name__)

QUEUED, TAKEN, ANSWERED, WITHDRAWN = "queued", "taken", "answered", "withdrawn"
#: How many of a queue's last batches a lingering leader looks back on (:meth:`AsyncCombiner.linger`).
RECENT_BATCHES = 8


@dataclass(eq=False)
class Ticket:
    """One queued request and, once served, its answer."""

    item: Any
    queued_at: float = field(default_factory=time.perf_counter)
    taken_at: float | None = None
    state: str = QUEUED
    answer: Any = None
    promoted: bool = False  # the previous leader handed leadership to this ticket's submitter
    event: Event = field(default_factory=Event)


class AsyncCombiner:
    """One queue of requests for one key; at most one leader at a time."""

    def __init__(self, *, limit: int) -> None:
        if limit < 1:
            raise ValueError("a combiner serves at least one request per batch")
        self.limit = limit
        self._mutex = Mutex()
        self._queue: deque[Ticket] = deque()
        self._leading = False
        #: The sizes of the last few batches led from this queue, newest last (:meth:`linger` waits
        #: for as many as the largest).
        self._recent: deque[int] = deque(maxlen=RECENT_BATCHES)
        #: While a leader lingers (:meth:`linger`): how many queued end its wait, and the event that says so.
        self._gathering: tuple[int, Event] | None = None

    async def submit(
        self,
        item: Any,
        *,
        serve: Callable[[Callable[[], list[Ticket]]], Served],
        timeout_s: float,
        busy: Callable[[Ticket], Any],
    ) -> Ticket:
        """Queue ``item`` and return its ticket once answered (led by this submitter, or by another).

        ``busy(ticket)`` is the answer for a ticket that withdrew after ``timeout_s`` in the queue,
        or that a failed ``serve`` left unanswered.
        """
        ticket = Ticket(item)
        deadline = time.monotonic() + timeout_s
        with self._mutex:
            self._queue.append(ticket)
            lead = not self._leading
            self._leading = True
            if self._gathering is not None and len(self._queue) >= self._gathering[0]:
                self._gathering[1].set()
        while True:
            if lead:
                await self._lead(ticket, serve, busy)
            queued = ticket.state == QUEUED
            await wait(ticket.event, max(0.0, deadline - time.monotonic()) if queued else None)
            with self._mutex:
                if ticket.state in (ANSWERED, WITHDRAWN):
                    return ticket
                ticket.event.clear()
                lead, ticket.promoted = ticket.promoted, False
                if not lead and ticket.state == QUEUED and time.monotonic() >= deadline:
                    self._queue.remove(ticket)
                    ticket.state, ticket.answer = WITHDRAWN, busy(ticket)
                    return ticket

    @property
    def last_batch(self) -> int:
        """How many purchases the last batch led from this queue served (:func:`alead_batch` lingers
        after more than one); 0 before the first."""
        return self._recent[-1] if self._recent else 0

    def note_batch(self, size: int) -> None:
        """A batch led from this queue served ``size`` purchases."""
        self._recent.append(size)

    async def linger(self, seconds: float) -> None:
        """Group commit: wait up to ``seconds``, holding nothing, for the queue to hold as many
        purchases as the largest of its last ``RECENT_BATCHES`` batches served (the leader's own
        among them), and not a moment longer.

        Purchases keep coming after a batch with company: in a closed loop they are those batches'
        shoppers back with their next purchase (the largest, not the last: a batch cut at the last
        one's size would split a group that came back together), and once they are all queued more
        waiting only delays them (MySQL's group commit stops its delay the same way, at
        ``binlog_group_commit_sync_no_delay_count``). Fewer arrive (the sale ends, shoppers leave):
        the whole ``seconds``, as a plain sleep would."""
        with self._mutex:
            enough = max(self._recent, default=0)
            if len(self._queue) >= enough:
                return
            gathered = Event()
            self._gathering = (enough, gathered)
        try:
            await wait(gathered, seconds)
        finally:
            with self._mutex:
                self._gathering = None

    @property
    def idle(self) -> bool:
        """Nobody queued and nobody leading."""
        with self._mutex:
            return not self._queue and not self._leading

    def answer(self, ticket: Ticket, answer: Any) -> None:
        """Hand a taken ticket its answer (once; a second answer is a bug and raises)."""
        with self._mutex:
            if ticket.state != TAKEN:
                raise RuntimeError(f"ticket is {ticket.state}, not taken: it cannot be answered")
            ticket.state, ticket.answer = ANSWERED, answer
            ticket.event.set()

    def _take(self, room: int) -> list[Ticket]:
        with self._mutex:
            taken = [self._queue.popleft() for _ in range(min(room, len(self._queue)))]
            now = time.perf_counter()
            for ticket in taken:
                ticket.state, ticket.taken_at = TAKEN, now
        return taken

    async def _lead(self, own: Ticket, serve, busy) -> None:
        """Serve one batch; answer what ``serve`` left unanswered; pass leadership on."""
        taken: list[Ticket] = []

        async def take() -> list[Ticket]:
            # A later call takes what queued since, up to the limit in all: the same list, grown.
            taken.extend(self._take(self.limit - len(taken)))
            return taken

        try:
            await serve(take)
        except Exception:
            logger.exception("a combining leader failed; its batch is answered busy")
        finally:
            with self._mutex:
                for ticket in taken:
                    if ticket.state == TAKEN:
                        ticket.state, ticket.answer = ANSWERED, busy(ticket)
                        ticket.event.set()
                if own.state == QUEUED:  # serve gave up before taking (the guard was not granted)
                    self._queue.remove(own)
                    own.state, own.answer = WITHDRAWN, busy(own)
                    own.event.set()
                if self._queue:
                    self._queue[0].promoted = True
                    self._queue[0].event.set()
                else:
                    self._leading = False


def _ms(since: float, until: float | None = None) -> float:
    return ((until or time.perf_counter()) - since) * 1000


async def alead_batch(
    strategy: Strategy,
    combiner: AsyncCombiner,
    take: Callable[[], Taken],
    *,
    sku: str,
    product_id: int,
    run: Callable[..., Answers],
) -> None:
    """Hold the guard once for a batch; answer every purchase taken after the release.

    ``combiner`` is an :class:`AsyncCombiner` or an :class:`~inventory.combining._async_shared.AsyncSharedQueue`
    (its ``take()`` awaits Redis); ``run(strategy, grant, product_id=, asks=, timings=)`` is the batch section
    (:func:`inventory.batched.run_batch`; on the loop, awaited on an ORM thread), its answers in the
    order of ``asks``.
    """
    if strategy.linger_s and combiner.last_batch > 1:
        # Group commit: this queue's last batch had company, so more purchases are on their way.
        # Waiting here, holding nothing, lets them into this batch: fewer sections (each a read, a
        # write and a COMMIT) for as many purchases, and the wait ends once as many are queued as
        # the queue's largest recent batch served. After a batch of one nobody waits, so a purchase alone is never
        # delayed; the wait counts as the batch's queue time.
        await combiner.linger(strategy.linger_s)
    waiting = time.perf_counter()
    results = None
    try:
        with timed_transactions() as transactions:  # noqa: SIM117 (one with is async here, in the source)
            async with strategy.aguard(sku) as grant:
                granted = time.perf_counter()
                tickets = await take()
                if not tickets:
                    return  # a shared queue another leader drained: nothing to run
                first = len(tickets)  # ``run`` may take more (db's read waited): they join after these
                db = Timings()
                results = await run(strategy, grant, product_id=product_id, asks=[t.item for t in tickets], timings=db)
                combiner.note_batch(len(tickets))
    except LockUnavailable:
        if results is None:
            return  # nothing taken: the combiner answers this leader busy, the queue moves on
    except Exception:
        if results is None:
            raise  # before the commit: the combiner answers the batch busy
        logger.exception("%s: releasing the guard of %s failed after its batch committed", strategy.name, sku)
    released = time.perf_counter()
    for index, (ticket, result) in enumerate(zip(tickets, results, strict=True)):
        timings = result.timings
        timings.db_ms, timings.batch = db.db_ms, len(tickets)
        # Queued until the guard wait of its section began (or it arrived during it): the queue, the
        # guard wait and the hold follow one another, so none counts another's time. One that joined
        # during the section's read was queued until it was taken, and held from then on.
        joined = index >= first
        waited_from = ticket.taken_at if joined else min(max(ticket.queued_at, waiting), granted)
        timings.queue_wait_ms = _ms(ticket.queued_at, max(ticket.queued_at, waited_from))
        if strategy.guarded:
            timings.lock_wait_ms, timings.lock_hold_ms = _ms(waited_from, granted), _ms(granted, released)
        elif transactions.ms:
            # No lock: the hold is the batch's transaction(s), or what was left of them once it joined.
            timings.lock_hold_ms = _ms(waited_from, released) if joined else sum(transactions.ms)
        timings.note_transactions(transactions, since=ticket.taken_at if joined else None)
        combiner.answer(ticket, result)
