# Generated from combining/_async_shared.py by scripts/unasync_locks.py (make twins): do not edit;
# edit combining/_async_shared.py and regenerate.
"""A shared queue: one Redis list per hot key, drained by whoever leads, across processes and pods.

Written once, for asyncio: ``scripts/unasync_locks.py`` generates the blocking twin
(``_sync_shared.py``: ``SharedQueue``). The in-process combiner (``_async.py``) gathers the purchases
of one process; this queue gathers those of every process that shares the Redis, so one section can
serve every worker's and every pod's purchases of a SKU (docs/batching.md).

For one key:

* A submitter RPUSHes its ask (JSON: a ticket id of its own, the item, when it was queued and its
  deadline) and, in the same round trip, tries the *lease* (``SET NX PX``) that makes it the leader.
* The leader awaits ``serve(take)`` (:func:`~inventory.combining.alead_batch`: the strategy's guard,
  the batch section); ``take()`` LPOPs up to ``limit`` asks from the head, answers busy the asks of
  others already past their deadline (never served), and ``serve`` answers the others
  (:meth:`AsyncSharedQueue.answer`). The leader posts the answers, each on its ticket's own list
  (RPUSH with an expiry), in one pipeline, and serves the next batch until its own ask is answered;
  then it releases the lease and nudges the submitter at the head (a ``lead`` message on its list).
* Every other submitter BLPOPs its own list. A wait that ends without its answer tries the lease
  (its leader may be gone): the queue stalls at most ``poll_s`` when a nudge goes astray.

What is guaranteed:

* An ask is taken at most once (LPOP is atomic), and answered by the leader that took it, once.
* Withdrawal is exact. At its deadline a submitter LREMs its ask: removed, it was never taken, it is
  answered busy and can no longer be sold; not removed, a leader took it, and that leader's answer
  is authoritative: the submitter waits up to ``taken_wait_s`` more for it.
* The lease protects nothing: it only keeps the strategy's guard uncontended. Two leaders (a lease
  expired under a paused leader) each take the guard, and a batch keeps whatever the guard and the
  storage check guarantee.

What is not:

* A leader that dies between its LPOP and its answers loses them: its batch's submitters are answered
  busy after ``taken_wait_s``, although the batch may have committed. A keyed retry finds the order by
  its Idempotency-Key, as after any 503.
* The deadline in an ask is a wall-clock time (``time.time()``) read by another process: skew decides
  only who answers a late ask busy, never whether a withdrawn ask is sold.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from dataclasses import dataclass
from typing import Any, Callable

import redis

from ._sync_io import Served, sleep

logger = logging.getLogger(__name__)

#: Release the lease (KEYS[1]) only if it still holds this leader's ticket (ARGV[1]).
RELEASE = """
if redis.call('get', KEYS[1]) == ARGV[1] then
    return redis.call('del', KEYS[1])
end
return 0
"""
#: The message on a ticket's list that asks its submitter to take the lease.
LEAD = json.dumps({"lead": True})
#: How long a list of asks nobody pushes to any more is kept (asks in it are long past their deadline).
QUEUE_TTL_MS = 3_600_000


@dataclass(eq=False)
class SharedTicket:
    """One ask in the shared list and, once served, its answer."""

    id: str
    item: Any
    payload: bytes  # the ask as pushed: LREM removes exactly it
    queued_at: float  # this process's perf_counter reading for the moment it was queued
    deadline_at: float  # time.time() after which no leader serves it
    answered: bool = False
    answer: Any = None

    def settle(self, answer: Any) -> None:
        """Its final answer: from its leader, from a message, or busy."""
        self.answered, self.answer = True, answer


class SharedQueue:
    """One Redis list of asks for one key; a lease names its leader."""

    def __init__(
        self,
        client: Any,
        *,
        key: str,
        limit: int,
        lease_ms: int,
        item_of: Callable[[dict], Any],
        answer_as: Callable[[Any], dict],
        answer_of: Callable[[dict], Any],
        poll_s: float = 0.2,
        answer_ttl_ms: int = 60_000,
    ) -> None:
        if limit < 1:
            raise ValueError("a shared queue serves at least one request per batch")
        self.client, self.key, self.limit, self.lease_ms = client, key, limit, lease_ms
        self.item_of, self.answer_as, self.answer_of = item_of, answer_as, answer_of
        self.poll_s, self.answer_ttl_ms = poll_s, answer_ttl_ms
        self.lease_key = f"{key}:leader"
        self._release = client.register_script(RELEASE)
        #: How many purchases the last batch this process led from the queue served
        #: (``alead_batch`` lingers after more than one).
        self.last_batch = 0

    def note_batch(self, size: int) -> None:
        """A batch this process led from the queue served ``size`` purchases."""
        self.last_batch = size

    def linger(self, seconds: float) -> None:
        """Group commit's wait (``alead_batch``): a plain sleep. The asks come from every pod into a
        Redis list no leader watches, so the wait cannot end early as the in-process queue's does."""
        sleep(seconds)

    def answer_key(self, ticket_id: str) -> str:
        return f"{self.key}:answer:{ticket_id}"

    def submit(
        self,
        item: dict,
        *,
        serve: Callable[[Callable], Served],
        timeout_s: float,
        taken_wait_s: float,
        busy: Callable[[SharedTicket], Any],
    ) -> SharedTicket:
        """Queue ``item`` (JSON-able) and return its ticket once answered, whoever led.

        ``busy(ticket)`` answers an ask withdrawn after ``timeout_s``, one a failed ``serve`` left
        unanswered, and one taken whose answer did not come within ``taken_wait_s`` more.
        """
        now = time.time()
        ticket_id = uuid.uuid4().hex
        ask = {"ticket": ticket_id, "item": item, "queued_at": now, "deadline_at": now + timeout_s}
        payload = json.dumps(ask).encode()
        ticket = SharedTicket(ticket_id, self.item_of(item), payload, time.perf_counter(), now + timeout_s)
        deadline = time.monotonic() + timeout_s
        with self.client.pipeline(transaction=False) as pipe:
            pipe.rpush(self.key, ticket.payload).pexpire(self.key, QUEUE_TTL_MS)
            pipe.set(self.lease_key, ticket.id, nx=True, px=self.lease_ms)
            lead = bool((pipe.execute())[-1])
        while True:
            if lead:
                self._lead(ticket, serve, busy, deadline)
            if ticket.answered:
                return ticket
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                self._withdraw(ticket, busy, taken_wait_s)
                return ticket
            lead = self._wait(ticket, min(remaining, self.poll_s))

    def answer(self, ticket: SharedTicket, answer: Any) -> None:
        """Hand a taken ticket its answer (posted when the batch is done; a second answer raises)."""
        if ticket.answered:
            raise RuntimeError(f"ticket {ticket.id} is answered already")
        ticket.settle(answer)

    def _wait(self, ticket: SharedTicket, timeout_s: float) -> bool:
        """Until its answer or a ``lead`` message, or ``timeout_s``: True when it now holds the lease."""
        self._next_message(ticket, timeout_s)
        if ticket.answered:
            return False
        with self.client.pipeline(transaction=False) as pipe:
            pipe.set(self.lease_key, ticket.id, nx=True, px=self.lease_ms).lpop(self.answer_key(ticket.id))
            claimed, message = pipe.execute()
        self._read(ticket, message)  # answered meanwhile: the leader it now is passes the lease on
        return bool(claimed)

    def _next_message(self, ticket: SharedTicket, timeout_s: float) -> None:
        popped = self.client.blpop([self.answer_key(ticket.id)], timeout=max(timeout_s, 0.001))
        self._read(ticket, popped[1] if popped else None)

    def _read(self, ticket: SharedTicket, message: bytes | None) -> None:
        """Note the answer in ``message``, if it is one (a ``lead`` message is not)."""
        answer = json.loads(message).get("answer") if message else None
        if answer is not None and not ticket.answered:
            ticket.settle(self.answer_of(answer))

    def _withdraw(self, ticket: SharedTicket, busy, taken_wait_s: float) -> None:
        """Past its deadline: out of the list and busy, or, if a leader took it, that leader's answer."""
        if self.client.lrem(self.key, 1, ticket.payload):
            ticket.settle(busy(ticket))
            return
        until = time.monotonic() + taken_wait_s
        while not ticket.answered and until > time.monotonic():
            self._next_message(ticket, min(until - time.monotonic(), self.poll_s))
        if not ticket.answered:
            logger.warning("%s: ticket %s was taken and never answered; answered busy", self.key, ticket.id)
            ticket.settle(busy(ticket))

    def _lead(self, own: SharedTicket, serve, busy, deadline: float) -> None:
        """Serve batches until its own ask is answered, the list is empty or its deadline has passed
        (one batch at least, as a local combiner's leader serves its own ticket whatever its
        deadline: with ``timeout_s`` 0 nothing would ever be served); then pass the lease on."""
        try:
            while not own.answered:
                if not self._serve_batch(own, serve, busy) or time.monotonic() >= deadline:
                    break
        finally:
            self._pass_on(own)

    def _serve_batch(self, own: SharedTicket, serve, busy) -> bool:
        """One batch, its answers posted: False when it took nothing (the list was empty, or the
        guard was not granted)."""
        taken: list[SharedTicket] = []
        late: list[SharedTicket] = []

        def take() -> list[SharedTicket]:
            if taken or late:
                raise RuntimeError("a leader takes its batch once")
            now = time.time()
            for payload in self.client.lpop(self.key, self.limit) or []:
                ticket = own if payload == own.payload else self._ticket_of(payload)
                # Its own ask's submitter is this leader, still here to be answered: never late.
                (late if ticket is not own and ticket.deadline_at <= now else taken).append(ticket)
            return taken

        try:
            serve(take)
        except Exception:
            logger.exception("a shared queue's leader failed; its batch is answered busy")
        for ticket in [*taken, *late]:
            if not ticket.answered:
                ticket.settle(busy(ticket))
        try:
            self._post([ticket for ticket in [*taken, *late] if ticket is not own], own)
        except redis.RedisError:
            logger.exception("%s: could not post a batch's answers; its submitters will be answered busy", self.key)
            return False
        return bool(taken or late)

    def _ticket_of(self, payload: bytes) -> SharedTicket:
        ask = json.loads(payload)
        waited = max(0.0, time.time() - ask["queued_at"])
        return SharedTicket(
            ask["ticket"], self.item_of(ask["item"]), payload, time.perf_counter() - waited, ask["deadline_at"]
        )

    def _post(self, tickets: list[SharedTicket], own: SharedTicket) -> None:
        """Each answer on its ticket's list, and this leader's own answer if another leader posted it,
        in one round trip."""
        with self.client.pipeline(transaction=False) as pipe:
            for ticket in tickets:
                key = self.answer_key(ticket.id)
                pipe.rpush(key, json.dumps({"answer": self.answer_as(ticket.answer)}))
                pipe.pexpire(key, self.answer_ttl_ms)
            if not own.answered:
                pipe.lpop(self.answer_key(own.id))
            replies = pipe.execute()
        if not own.answered:
            self._read(own, replies[-1])

    def _pass_on(self, own: SharedTicket) -> None:
        """Release the lease, then nudge the submitter at the head of the list to take it (released
        first: an ask pushed before the release is in the list the nudge reads)."""
        try:
            self._release(keys=[self.lease_key], args=[own.id])
            head = self.client.lindex(self.key, 0)
            if head is not None:
                key = self.answer_key(json.loads(head)["ticket"])
                with self.client.pipeline(transaction=False) as pipe:
                    pipe.rpush(key, LEAD).pexpire(key, self.answer_ttl_ms)
                    pipe.execute()
        except redis.RedisError:
            logger.exception("%s: could not pass the lease on; the waiters take it within their poll", self.key)
