"""The locks: one node (``RedisLock``) and Redlock, each as a blocking class and an asyncio twin.

One source for both: ``aio.py`` holds the asyncio twins (``AsyncRedisLock``, ``AsyncRedlock``,
on ``redis.asyncio`` clients: ``async with lock as lease:``), and ``sync.py`` (``RedisLock``,
``Redlock``) is generated from it by ``scripts/unasync_locks.py`` (``async``/``await`` removed,
``_aio_io`` replaced by ``_sync_io``); a test fails when the generated file is not current, so
the twins cannot drift apart: every decision is written once and only the I/O underneath
differs. In the blocking twin the watchdog is a thread; in the asyncio one it is a task on the
running loop, and ``on_lost`` may be a coroutine function. See the package docstring for what
the locks guarantee.
"""

from __future__ import annotations

import contextlib
import dataclasses
import random
import time
from typing import Callable, Sequence

import redis

from . import _aio_io as _io
from ._core import (
    ACQUIRE,
    ADVANCE_FENCE,
    EXTEND,
    HANDOFF_WINDOW_MS,
    RAISE_FENCE,
    RELEASE,
    SIGNAL_LIFETIME_MS,
    Attempt,
    Lease,
    LockError,
    LockLost,
    NotAcquired,
    NotOwned,
    QuorumUnavailable,
    check_arguments,
    confirmations,
    default_node_timeout_ms,
    drift_ms,
    fence_and_laggards,
    fence_key,
    granted_votes,
    handoff_key,
    majority_denies,
    new_token,
    refused_round,
    signal_key,
    validity_ms,
    waiters_key,
)

__all__ = ["AsyncRedisLock", "AsyncRedlock"]


class _BaseLock:
    """What both locks share: waiting, the lease, extension, fence recovery, the watchdog, ``with``."""

    quorum: int
    # Per-acquisition state starts at these class defaults: a lock is built once per purchase,
    # so its constructor stays short.
    _lease: Lease | None = None
    _lost: LockLost | None = None
    _extensions = 0
    _watchdog: _io.Watchdog | None = None
    # (node, connection) of the refused attempt a waiter blocks on: the same server session that
    # registered it as a waiter, so a restart of that server ends the wait at once.
    _held: tuple | None = None

    def __init__(
        self,
        name: str,
        *,
        ttl_ms: int,
        timeout_ms: int,
        wait: str,
        retry_delay_ms: float,
        watchdog: bool,
        max_renewals: int,
        on_lost: Callable[[Lease, LockLost], None] | None,
        max_extensions: int,
    ) -> None:
        if not name or ttl_ms <= 0 or timeout_ms < 0 or wait not in ("notify", "poll"):
            check_arguments(name, ttl_ms, timeout_ms)
            raise ValueError(f"wait must be 'notify' or 'poll', got {wait!r}")
        self.name = name
        self.ttl_ms = int(ttl_ms)
        self.timeout_ms = timeout_ms
        self.wait = wait
        self.retry_delay_ms = retry_delay_ms
        self.watchdog = watchdog
        self.max_renewals = max_renewals
        self.on_lost = on_lost
        self.max_extensions = max_extensions
        waiters, handoff = waiters_key(name), handoff_key(name)
        self._keys = (name, fence_key(name), waiters, handoff)
        self._release_keys = (name, signal_key(name), waiters, handoff)
        self._drift_ms = drift_ms(self.ttl_ms)

    # Subclasses provide: _attempt(token, waiter_id, register) -> Attempt,
    # _unlock(token) -> bool, _extend_nodes(lease, ttl_ms) -> Lease, _advance_nodes(lease, past) -> int,
    # node_names().

    @property
    def lease(self) -> Lease | None:
        return self._lease

    @property
    def lost(self) -> LockLost | None:
        return self._lost

    def _error(self, cls: type[LockError], message: str) -> LockError:
        return cls(message, name=self.name, nodes=self.node_names())

    async def acquire(self) -> Lease:
        """Take the lock, waiting up to ``timeout_ms``; returns the :class:`Lease`.

        An attempt that starts after the deadline is the last: if refused, it also takes this
        caller off the waiter count, so giving up costs no extra round trip. The whole call lasts
        at most ``timeout_ms`` plus that last attempt: one node timeout for :class:`RedisLock`;
        for :class:`Redlock` one round (``node_timeout_ms``), plus one more to undo a partial
        grant or a node that did not answer. With ``timeout_ms=0`` the first attempt is the
        last, and a refused try-lock never counts as a waiter.
        """
        if self._lease is not None:
            raise self._error(LockError, "this lock object already holds a lease; make one per acquisition")
        deadline = time.monotonic() + self.timeout_ms / 1000.0
        waiter_id = ""
        while True:
            token = new_token()
            last = time.monotonic() >= deadline
            try:
                lease, hint_ms, split = await self._attempt(token, waiter_id, not last)
            except BaseException:
                self._give_back_held()
                raise
            if lease is not None:
                self._lease, self._lost, self._extensions = lease, None, 0
                if self.watchdog:
                    self._watchdog = _io.Watchdog(f"lock-watchdog:{self.name}", self._watch)
                return lease
            if last:
                raise self._error(NotAcquired, f"not acquired within {self.timeout_ms} ms")
            waiter_id = waiter_id or token
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                self._give_back_held()
            elif self._held is None or split:
                # A split vote means every contender failed at once: a random pause desynchronizes them.
                self._give_back_held()
                await _io.sleep(min(remaining, random.uniform(0.5, 1.0) * self.retry_delay_ms / 1000.0))
            else:
                # Wake on the holder's release, or when it would have expired if it crashed.
                await self._wait_for_release(min(remaining, (hint_ms + 1) / 1000.0 if hint_ms > 0 else 0.01))

    def _hold(self, node, conn) -> None:
        """Keep ``conn`` (a refused attempt's) for the wait that follows, in notify mode."""
        if self.wait == "notify":
            self._held = (node, conn)
        else:
            node.give(conn)

    def _give_back_held(self) -> None:
        held, self._held = self._held, None
        if held is not None:
            held[0].give(held[1])

    async def _wait_for_release(self, wait_s: float) -> None:
        node, conn = self._held
        self._held = None
        try:
            await _io.block_on_signal(node, conn, self.name, wait_s)
        finally:
            node.give(conn)

    async def release(self) -> None:
        """Give the lock up; raises :class:`NotOwned` if this token no longer holds it."""
        lease = self._lease
        if lease is None:
            raise self._error(NotOwned, "release of a lock this object does not hold")
        await self._stop_watchdog()
        self._lease = None
        if not await self._unlock(lease.token):
            raise self._error(NotOwned, "release refused: the lease expired or another holder took over")

    async def extend(self, *, ttl_ms: int | None = None) -> Lease:
        """Reset the lease to ``ttl_ms`` (default: the lock's TTL) from now; at most ``max_extensions`` times."""
        if self._extensions >= self.max_extensions:
            raise self._error(LockError, f"extension limit reached ({self.max_extensions})")
        lease = await self._renew(ttl_ms)
        self._extensions += 1
        return lease

    async def advance_fence(self, past: int) -> int:
        """Raise this lease's fence above ``past`` while the lock is still held; returns the new fence.

        For the holder whose write storage refused because the row's fence (``past``) is not below
        its own: the lock service forgot its counter (a restart without persistence, a new lock
        name) and issued a fence storage has already seen. In one round trip, and only where this
        lease's token still holds the lock (checked in the same Lua step), each node's counter is
        set to ``max(counter, past) + 1``; for Redlock a majority must confirm, and nodes left
        below the highest value are raised to it before the new fence counts (the same write-back
        as a grant), so later grants still get larger fences. ``lease.fence`` is updated.
        Raises :class:`NotOwned` if the lease's validity is over or the token no longer holds the
        lock (on a majority, for Redlock): a holder that lost its lock cannot advance.

        Why this is safe only together with a storage check that also compares the row's version
        (``UPDATE ... WHERE version = :read_version AND fence < :fence``): the fence alone orders
        writers by when they were granted, and advancing re-orders this holder after every fence
        already written. Another holder may have written the row since this one read it (a paused
        holder of an older grant whose write landed late); with a fence check alone, the advanced
        fence would let this holder overwrite that write with a decision made on the stale read.
        The version check refuses that write; so the holder must re-read after a refusal and
        decide again, and then write with the advanced fence. Without persistence the counter
        can still be forgotten again; advancing repeats the recovery with one more round trip.
        """
        lease = self._lease
        if lease is None:
            raise self._error(NotOwned, "advance_fence of a lock this object does not hold")
        if lease.remaining_ms() <= 0:
            raise self._error(NotOwned, "advance_fence after the lease's validity ended")
        fence = await self._advance_nodes(lease, int(past))
        self._lease = dataclasses.replace(lease, fence=fence)
        return fence

    async def _renew(self, ttl_ms: int | None = None) -> Lease:
        lease = self._lease
        if lease is None:
            raise self._error(NotOwned, "extend of a lock this object does not hold")
        self._lease = await self._extend_nodes(lease, int(ttl_ms or self.ttl_ms))
        return self._lease

    async def _watch(self, dog: _io.Watchdog) -> None:
        """Renew every ttl/3, at most ``max_renewals`` times; report a failed renewal, or the
        lease running out after the last one, as the loss of the lock."""
        interval = self.ttl_ms / 3000.0
        renewals = 0
        while not await dog.wait(interval):
            if renewals >= self.max_renewals:
                lease = self._lease
                if lease is not None and not await dog.wait(lease.valid_until - time.monotonic()):
                    await self._mark_lost(None, f"the lease expired after the watchdog's {renewals} renewals")
                return
            try:
                await self._renew()
            except Exception as error:  # noqa: BLE001 - every failure is reported, none swallowed
                if not dog.stopped():
                    await self._mark_lost(error, "the watchdog could not renew the lease")
                return
            renewals += 1

    async def _mark_lost(self, cause: BaseException | None, message: str) -> None:
        lost = self._error(LockLost, message)
        lost.__cause__ = cause
        self._lost = lost
        if self.on_lost is not None and self._lease is not None:
            await _io.call(self.on_lost, self._lease, lost)

    async def _stop_watchdog(self) -> None:
        watchdog, self._watchdog = self._watchdog, None
        if watchdog is not None:
            await watchdog.stop()

    async def __aenter__(self) -> Lease:
        return await self.acquire()

    async def __aexit__(self, exc_type, exc, tb) -> None:
        await self._stop_watchdog()
        lost = self._lost
        if lost is not None:
            with contextlib.suppress(LockError):
                await self.release()
            raise lost
        lease = self._lease
        try:
            await self.release()
        except NotOwned as error:
            raise self._error(LockLost, "the lease expired while the block held it") from error
        overrun_ms = -lease.remaining_ms()
        if overrun_ms > 0:
            # Redis may not have expired the key yet, but the safety margin was spent: another
            # holder could have been granted, so the block's writes were unprotected by time.
            raise self._error(LockLost, f"the block ran {overrun_ms:.0f} ms past the lease's validity")


class AsyncRedisLock(_BaseLock):
    """A lock on one Redis node: ``SET NX PX`` plus a fencing ``INCR`` in one script.

    Every reply is awaited at most the client's ``socket_timeout`` (redis-py's default, 5 s, if
    the client sets none), the node timeout of this lock.

    Usage (the asyncio twin ``AsyncRedisLock`` takes a ``redis.asyncio`` client and ``async with``)::

        with RedisLock(client, "flashsale:lock:SKU1", ttl_ms=10_000, timeout_ms=5_000) as lease:
            # the write lands only where the row's fence is below lease.fence (in this project:
            # inventory.backends.section.checked_write(shelf, quantity=1, token=lease.fence, fenced=True))
            ...
    """

    quorum = 1

    def __init__(
        self,
        client: _io.Client,
        name: str,
        *,
        ttl_ms: int = 10_000,
        timeout_ms: int = 5_000,
        wait: str = "notify",
        retry_delay_ms: float = 10.0,
        watchdog: bool = False,
        max_renewals: int = 1000,
        on_lost: Callable[[Lease, LockLost], None] | None = None,
        max_extensions: int = 10,
    ) -> None:
        super().__init__(
            name,
            ttl_ms=ttl_ms,
            timeout_ms=timeout_ms,
            wait=wait,
            retry_delay_ms=retry_delay_ms,
            watchdog=watchdog,
            max_renewals=max_renewals,
            on_lost=on_lost,
            max_extensions=max_extensions,
        )
        self.client = client
        self._node = _io.NodeConnections.of(client)

    def node_names(self) -> list[str]:
        return [self._node.name]

    async def _attempt(self, token: str, waiter_id: str, register: bool) -> Attempt:
        node = self._node
        conn = node.take()
        start = time.monotonic()
        try:
            reply = await _io.eval_one(
                node, conn, ACQUIRE, self._keys, (token, self.ttl_ms, waiter_id, "1" if register else "0")
            )
        except redis.RedisError as error:
            node.give(conn)
            raise self._error(QuorumUnavailable, f"the node did not answer: {error}") from error
        if reply > 0:
            node.give(conn)
            return Attempt(Lease(self.name, token, reply, start + (self.ttl_ms - self._drift_ms) / 1000.0), 0, False)
        if register:
            self._hold(node, conn)
        else:
            node.give(conn)
        return Attempt(None, -reply, split=False)

    async def _unlock(self, token: str) -> bool:
        try:
            reply = await _io.call_one(
                self._node, RELEASE, self._release_keys, (token, SIGNAL_LIFETIME_MS, HANDOFF_WINDOW_MS)
            )
            return reply == 1
        except redis.RedisError as error:
            raise self._error(NotOwned, f"release could not reach the node: {error}") from error

    async def _extend_nodes(self, lease: Lease, ttl_ms: int) -> Lease:
        start = time.monotonic()
        try:
            extended = await _io.call_one(self._node, EXTEND, (self.name,), (lease.token, ttl_ms)) == 1
        except redis.RedisError as error:
            raise self._error(NotOwned, f"extend could not reach the node: {error}") from error
        if not extended:
            raise self._error(NotOwned, "extend refused: the lease expired or another holder took over")
        return Lease(self.name, lease.token, lease.fence, start + (ttl_ms - drift_ms(ttl_ms)) / 1000.0)

    async def _advance_nodes(self, lease: Lease, past: int) -> int:
        try:
            fence = await _io.call_one(self._node, ADVANCE_FENCE, self._keys[:2], (lease.token, past))
        except redis.RedisError as error:
            raise self._error(NotOwned, f"advance_fence could not reach the node: {error}") from error
        if fence <= 0:
            raise self._error(NotOwned, "advance_fence refused: the lease expired or another holder took over")
        return fence


class AsyncRedlock(_BaseLock):
    """The Redlock algorithm over N independent Redis masters, with quorum-monotonic fences.

    Usage, with one client per independent master (the asyncio twin ``AsyncRedlock`` takes
    ``redis.asyncio`` clients and ``async with``)::

        with Redlock([c1, c2, c3, c4, c5], "flashsale:lock:SKU1", ttl_ms=10_000, timeout_ms=5_000) as lease:
            ...  # a write fenced by lease.fence, as for RedisLock
    """

    def __init__(
        self,
        clients: Sequence[_io.Client],
        name: str,
        *,
        ttl_ms: int = 10_000,
        timeout_ms: int = 5_000,
        node_timeout_ms: float | None = None,
        wait: str = "notify",
        retry_delay_ms: float = 10.0,
        watchdog: bool = False,
        max_renewals: int = 1000,
        on_lost: Callable[[Lease, LockLost], None] | None = None,
        max_extensions: int = 10,
    ) -> None:
        super().__init__(
            name,
            ttl_ms=ttl_ms,
            timeout_ms=timeout_ms,
            wait=wait,
            retry_delay_ms=retry_delay_ms,
            watchdog=watchdog,
            max_renewals=max_renewals,
            on_lost=on_lost,
            max_extensions=max_extensions,
        )
        if not clients:
            raise ValueError("Redlock needs at least one node client")
        self.clients = list(clients)
        self._nodes = [_io.NodeConnections.of(client) for client in self.clients]
        self.quorum = len(self._nodes) // 2 + 1
        self.node_timeout_s = (node_timeout_ms or default_node_timeout_ms(self.ttl_ms)) / 1000.0

    def node_names(self) -> list[str]:
        return [node.name for node in self._nodes]

    async def _attempt(self, token: str, waiter_id: str, register: bool) -> Attempt:
        start = time.monotonic()
        argv = (token, self.ttl_ms, waiter_id, "1" if register else "0")
        held: list | None = [] if register else None
        replies = await _io.eval_all(self._nodes, ACQUIRE, self._keys, argv, self.node_timeout_s, held)
        granted = granted_votes(replies)
        if len(granted) >= self.quorum:
            fence, laggards = fence_and_laggards(granted)
            confirmed = len(granted) - len(laggards)
            if laggards:
                # Write the fence back before granting so any later majority sees it (see the package docstring).
                raised = await _io.eval_all(
                    [self._nodes[i] for i in laggards], RAISE_FENCE, self._keys[:2], (token, fence), self.node_timeout_s
                )
                confirmed += confirmations(raised)
            validity = validity_ms(self.ttl_ms, start, self._drift_ms)
            if confirmed >= self.quorum and validity > 0:
                self._give_back(held)
                return Attempt(Lease(self.name, token, fence, start + validity / 1000.0), 0, split=False)
        if held:
            # Wait on the first node that refused, over the connection that registered the waiter.
            index, conn = held.pop()
            self._hold(self._nodes[index], conn)
        answered, hint_ms, unavailable = refused_round(replies, self.quorum, self.node_names())
        if granted or len(answered) < len(self._nodes):
            # Undo a partial grant, and any grant a node that did not answer may still make.
            # When every node answered no, the token is on none of them: no round trip needed.
            await self._unlock_all(token)
        if unavailable:
            self._give_back_held()
            raise self._error(QuorumUnavailable, unavailable)
        return Attempt(None, hint_ms, split=bool(granted))

    def _give_back(self, held: list | None) -> None:
        for index, conn in held or ():
            self._nodes[index].give(conn)

    async def _unlock_all(self, token: str) -> list:
        return await _io.eval_all(
            self._nodes,
            RELEASE,
            self._release_keys,
            (token, SIGNAL_LIFETIME_MS, HANDOFF_WINDOW_MS),
            self.node_timeout_s,
        )

    async def _unlock(self, token: str) -> bool:
        return not majority_denies(await self._unlock_all(token), self.quorum)

    async def _extend_nodes(self, lease: Lease, ttl_ms: int) -> Lease:
        start = time.monotonic()
        if start >= lease.valid_until:
            raise self._error(NotOwned, "extend after the lease's validity ended")
        replies = await _io.eval_all(self._nodes, EXTEND, (self.name,), (lease.token, ttl_ms), self.node_timeout_s)
        extended = confirmations(replies)
        end = time.monotonic()
        validity = validity_ms(ttl_ms, start, drift_ms(ttl_ms), end)
        if extended < self.quorum or end >= lease.valid_until or validity <= 0:
            raise self._error(
                NotOwned,
                f"extend confirmed by {extended} of {len(self._nodes)} nodes within the validity, {self.quorum} needed",
            )
        return Lease(self.name, lease.token, lease.fence, start + validity / 1000.0)

    async def _advance_nodes(self, lease: Lease, past: int) -> int:
        replies = await _io.eval_all(
            self._nodes, ADVANCE_FENCE, self._keys[:2], (lease.token, past), self.node_timeout_s
        )
        granted = granted_votes(replies)
        confirmed = 0
        if len(granted) >= self.quorum:
            fence, laggards = fence_and_laggards(granted)
            confirmed = len(granted) - len(laggards)
            if laggards:
                raised = await _io.eval_all(
                    [self._nodes[i] for i in laggards],
                    RAISE_FENCE,
                    self._keys[:2],
                    (lease.token, fence),
                    self.node_timeout_s,
                )
                confirmed += confirmations(raised)
        if confirmed < self.quorum or lease.remaining_ms() <= 0:
            raise self._error(
                NotOwned,
                f"advance_fence confirmed by {confirmed} of {len(self._nodes)} nodes "
                f"within the validity, {self.quorum} needed",
            )
        return fence
