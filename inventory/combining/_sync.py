"""Flat combining (Hendler et al., SPAA 2010): whoever leads serves the requests queued behind it.

A :class:`Combiner` is one queue per hot key, in one process. Each thread that submits a request
queues a :class:`Ticket`; the first one to find no leader leads. The leader calls ``serve(take)``:
``take()`` removes up to ``limit`` tickets from the head of the queue (its own first), and
``serve`` must :meth:`Combiner.answer` every ticket it took. When ``serve`` returns, leadership
passes to the ticket now at the head, so a leader's own request is never held hostage by later
arrivals and the queue is served in arrival order (no starvation).

What is guaranteed:

* Every ticket gets exactly one answer: from its leader, or, if its deadline passes while it is
  still queued, the ``busy`` answer, after it has left the queue in the same step that decides so
  (under the combiner's mutex); a leader cannot take a ticket that has withdrawn, and a waiter
  cannot withdraw a ticket a leader has taken.
* A taken ticket waits for its leader, which answers it in a ``finally`` (``busy`` when ``serve``
  raised: ``serve`` must answer for itself whatever it has committed, so this is for failures
  before a commit). The leader is a thread of the same process: if the process dies, so do its waiters,
  and their clients' keyed retries find whatever was committed.

No Django and no I/O here; the purchase path that uses it is :mod:`inventory.batched`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable

logger = logging.getLogger(__name__)

QUEUED, TAKEN, ANSWERED, WITHDRAWN = "queued", "taken", "answered", "withdrawn"


@dataclass(eq=False)
class Ticket:
    """One queued request and, once served, its answer."""

    item: Any
    queued_at: float = field(default_factory=time.perf_counter)
    taken_at: float | None = None
    state: str = QUEUED
    answer: Any = None
    promoted: bool = False  # the previous leader handed leadership to this ticket's thread
    event: threading.Event = field(default_factory=threading.Event)


class Combiner:
    """One queue of requests for one key; at most one leader at a time."""

    def __init__(self, *, limit: int) -> None:
        if limit < 1:
            raise ValueError("a combiner serves at least one request per batch")
        self.limit = limit
        self._mutex = threading.Lock()
        self._queue: deque[Ticket] = deque()
        self._leading = False

    def submit(
        self,
        item: Any,
        *,
        serve: Callable[[Callable[[], list[Ticket]]], None],
        timeout_s: float,
        busy: Callable[[Ticket], Any],
    ) -> Ticket:
        """Queue ``item`` and return its ticket once answered (led by this thread, or by another).

        ``busy(ticket)`` is the answer for a ticket that withdrew after ``timeout_s`` in the queue,
        or that a failed ``serve`` left unanswered.
        """
        ticket = Ticket(item)
        deadline = time.monotonic() + timeout_s
        with self._mutex:
            self._queue.append(ticket)
            lead = not self._leading
            self._leading = True
        while True:
            if lead:
                self._lead(ticket, serve, busy)
            queued = ticket.state == QUEUED
            ticket.event.wait(max(0.0, deadline - time.monotonic()) if queued else None)
            with self._mutex:
                if ticket.state in (ANSWERED, WITHDRAWN):
                    return ticket
                ticket.event.clear()
                lead, ticket.promoted = ticket.promoted, False
                if not lead and ticket.state == QUEUED and time.monotonic() >= deadline:
                    self._queue.remove(ticket)
                    ticket.state, ticket.answer = WITHDRAWN, busy(ticket)
                    return ticket

    def answer(self, ticket: Ticket, answer: Any) -> None:
        """Hand a taken ticket its answer (once; a second answer is a bug and raises)."""
        with self._mutex:
            if ticket.state != TAKEN:
                raise RuntimeError(f"ticket is {ticket.state}, not taken: it cannot be answered")
            ticket.state, ticket.answer = ANSWERED, answer
            ticket.event.set()

    def _take(self) -> list[Ticket]:
        with self._mutex:
            taken = [self._queue.popleft() for _ in range(min(self.limit, len(self._queue)))]
            now = time.perf_counter()
            for ticket in taken:
                ticket.state, ticket.taken_at = TAKEN, now
        return taken

    def _lead(self, own: Ticket, serve, busy) -> None:
        """Serve one batch; answer what ``serve`` left unanswered; pass leadership on."""
        taken: list[Ticket] = []

        def take() -> list[Ticket]:
            if taken:
                raise RuntimeError("a leader takes its batch once")
            taken.extend(self._take())
            return taken

        try:
            serve(take)
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
