"""The locks: one node (``RedisLock``) and Redlock, each as a blocking class and an asyncio twin.

One source for both: ``_async/locks.py`` holds the asyncio twins (``AsyncRedisLock``, ``AsyncRedlock``,
on ``redis.asyncio`` clients: ``async with lock as lease:``), and ``_sync/locks.py`` (``RedisLock``,
``Redlock``) is generated from it by ``scripts/unasync_locks.py`` (``async``/``await`` removed, the
package's ``io`` is then ``_sync/io.py``); a test fails when the generated file is not current, so
the twins cannot drift apart: every decision is written once and only the I/O underneath
differs. In the blocking twin the watchdog is a thread; in the asyncio one it is a task on the
running loop, and ``on_lost`` may be a coroutine function. See the package docstring for what
the locks guarantee.
"""

from __future__ import annotations

import contextlib
import time
from typing import Callable, Sequence

import redis

from .._core import (
    ABANDON,
    ACQUIRE,
    ADVANCE_FENCE,
    EXTEND,
    FAILED,
    HANDOFF_WINDOW_MS,
    RAISE_FENCE,
    RELEASE,
    RELEASED,
    SERVER_ID,
    SIGNAL_LIFETIME_MS,
    Attempt,
    Lease,
    check_distinct_nodes,
    check_ms,
    check_server_ids,
    confirmations,
    default_node_timeout_ms,
    drift_ms,
    fence_and_laggards,
    granted_votes,
    log_failed_release,
    new_lease,
    redlock_release_outcome,
    refused_round,
    release_outcome,
    transport_error,
    validity_ms,
)
from ..errors import LockError, LockLost, NotOwned, QuorumUnavailable
from . import io as _io
from .base import BaseLock

__all__ = ["AsyncRedisLock", "AsyncRedlock"]


class AsyncRedisLock(BaseLock):
    """A lock on one Redis node: ``SET NX PX`` plus a fencing ``INCR`` in one script.

    Every reply is awaited at most the client's ``socket_timeout`` (redis-py's default, 5 s, if
    the client sets none), the node timeout of this lock.

    Usage (the asyncio twin ``AsyncRedisLock`` takes a ``redis.asyncio`` client and ``async with``)::

        with RedisLock(client, "flashsale:lock:SKU1", ttl_ms=10_000, timeout_ms=5_000) as lease:
            # the write lands only where the row's fence is below lease.fence (in this project:
            # inventory.strategies.section.checked_write(shelf, quantity=1, token=lease.fence, fenced=True))
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
        conn = await node.take()
        start = time.monotonic()
        try:
            reply = await _io.eval_one(
                node, conn, ACQUIRE, self._keys, (token, self.ttl_ms, waiter_id, "1" if register else "0")
            )
        except redis.RedisError as error:
            node.give(conn)
            if transport_error(error):
                # The node may have run the script and only its reply been lost or late.
                await self._abandon(token, waiter_id)
            raise self._error(QuorumUnavailable, f"the node did not answer: {error}") from error
        if reply > 0:
            node.give(conn)
            return new_lease(self.name, token, reply, start + (self.ttl_ms - self._drift_ms) / 1000.0), 0, False
        if register:
            self._hold(node, conn)
        else:
            node.give(conn)
        return None, -reply, False

    async def _unlock(self, token: str) -> str:
        """The release's outcome; one that failed for a transport reason is tried once more on a
        fresh connection, within the node timeout."""
        argv = (token, SIGNAL_LIFETIME_MS, HANDOFF_WINDOW_MS)
        try:
            return release_outcome(await _io.call_one(self._node, RELEASE, self._release_keys, argv))
        except redis.RedisError as error:
            if not transport_error(error):
                raise self._error(LockError, f"release failed on the node: {error}") from error
            first = error
        try:
            retried = await _io.call_one(self._node, RELEASE, self._release_keys, argv, fresh=True)
        except redis.RedisError as error:
            raise self._error(
                LockError, f"release could not reach the node ({first}; retried: {error}); the key expires by its TTL"
            ) from error
        return release_outcome(first, retried)

    async def _abandon(self, token: str, waiter_id: str) -> None:
        """Release ``token`` if the node holds it and unregister the waiter, within the node
        timeout; a failure is let go (the key expires by its TTL, the waiter set a second after)."""
        argv = (token, SIGNAL_LIFETIME_MS, HANDOFF_WINDOW_MS, token, waiter_id)
        with contextlib.suppress(redis.RedisError, OSError):
            await _io.call_one(self._node, ABANDON, self._release_keys, argv, text=True)

    async def _extend_nodes(self, lease: Lease, ttl_ms: int) -> Lease:
        start = time.monotonic()
        if start >= lease.valid_until:
            # The key may still be there (the drift allowance), but the lease is over: as Redlock's.
            raise self._error(NotOwned, "extend after the lease's validity ended")
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


class AsyncRedlock(BaseLock):
    """The Redlock algorithm over N independent Redis masters, with quorum-monotonic fences.

    Usage, with one client per independent master (the asyncio twin ``AsyncRedlock`` takes
    ``redis.asyncio`` clients and ``async with``)::

        with Redlock([c1, c2, c3, c4, c5], "flashsale:lock:SKU1", ttl_ms=10_000, timeout_ms=5_000) as lease:
            ...  # a write fenced by lease.fence, as for RedisLock
    """

    # The waiter id a grant left registered on the nodes that did not grant it (per acquisition,
    # a class default as in BaseLock): the release takes it off there.
    _stray_waiter: tuple = ()

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
        nodes = self._nodes = [_io.NodeConnections.of(client) for client in self.clients]
        # The shop builds a Redlock per purchase on the same clients: the first node keeps the last
        # list found to be distinct servers (one list per node, collected with it: nothing grows),
        # and a list equal to it (the same NodeConnections, one per client, compared by identity,
        # held so no id is reused) is not checked again: 50 ns, where a set of five names cost 350.
        # Not one class attribute: replacing it freed lists whose connections' destructors ran
        # before the type cache forgot the old list (CPython gh-118492): segfaults in test_redlock.
        if nodes != nodes[0].distinct_list:
            check_distinct_nodes(nodes, self.clients, name)
            nodes[0].distinct_list = nodes
        self.quorum = len(self._nodes) // 2 + 1
        if node_timeout_ms is None:
            node_timeout_ms = default_node_timeout_ms(self.ttl_ms)
        else:
            check_ms(node_timeout_ms, "node_timeout_ms", name=name, positive=True)
        self.node_timeout_s = node_timeout_ms / 1000.0

    def node_names(self) -> list[str]:
        return [node.name for node in self._nodes]

    async def check_servers(self, timeout_ms: float = 1_000) -> list[str | None]:
        """Ask every node which server it is and raise :class:`ValueError` if two are one.

        The constructor refuses one host and port given twice, from the clients' settings alone;
        this asks the servers (the run_id of ``INFO server``, one script call a node, all sent at
        once) and so also sees a DNS name and its address, a LAN address and loopback, TCP and the
        unix socket, a proxy or a port forward. Returns each node's run_id, None for a node that
        gave none within ``timeout_ms`` (not compared: check again when it is back). One round
        trip: for a process to run once on its node list (``manage.py preflight`` does), not per lock.
        """
        check_ms(timeout_ms, "timeout_ms", name=self.name, positive=True)
        replies = await _io.eval_all(self._nodes, SERVER_ID, (), (), timeout_ms / 1000.0)
        return check_server_ids(replies, self.node_names(), self.name)

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
                if len(granted) < len(self._nodes) and (register or waiter_id):
                    # Nodes that did not grant may count this caller as a waiter (registered now,
                    # or in an earlier round): its release unregisters it there (ABANDON).
                    self._stray_waiter = (waiter_id or token,)
                # Valid for what is left of the validity from now, so until start + ttl - drift: every
                # granting node set its key after start, and keeps it a TTL by its own clock.
                valid_until = start + (self.ttl_ms - self._drift_ms) / 1000.0
                return new_lease(self.name, token, fence, valid_until), 0, False
        if held:
            # Wait on the first node that refused, over the connection that registered the waiter.
            index, conn = held.pop()
            self._hold(self._nodes[index], conn)
        answered, hint_ms, unavailable = refused_round(replies, self.quorum, self.node_names())
        # The acquire's first round, with time left: one round a majority missed is not a dead
        # majority (a worker's first round connects to every node, and on a loaded machine that
        # can outlast the node timeout). Tried once more after a short pause; dead nodes refuse
        # at once, so that costs them nothing, frozen ones a node timeout.
        again = register and not waiter_id
        if granted or len(answered) < len(self._nodes):
            # Undo a partial grant, and any grant a node that did not answer may still make; a
            # waiter that gives up here (no majority) leaves the waiter sets in the same round.
            # When every node answered no, the token is on none of them: no round trip needed.
            await self._unlock_all(token, (waiter_id,) if unavailable and waiter_id else ())
        if unavailable:
            self._give_back_held()
            if again:
                return None, 0, True
            raise self._error(QuorumUnavailable, unavailable)
        return None, hint_ms, bool(granted)

    def _give_back(self, held: list | None) -> None:
        for index, conn in held or ():
            self._nodes[index].give(conn)

    async def _unlock_all(self, token: str, waiter_ids: tuple = ()) -> list:
        """RELEASE on every node; with ``waiter_ids``, ABANDON (sent as text, on a path too rare to
        have it cached): those ids leave the waiter sets too."""
        argv = (token, SIGNAL_LIFETIME_MS, HANDOFF_WINDOW_MS)
        if waiter_ids:
            return await _io.eval_all(
                self._nodes, ABANDON, self._release_keys, (*argv, *waiter_ids), self.node_timeout_s, text=True
            )
        return await _io.eval_all(self._nodes, RELEASE, self._release_keys, argv, self.node_timeout_s)

    async def _abandon(self, token: str, waiter_id: str) -> None:
        """Release ``token`` wherever it is set and unregister the waiter, within one node timeout."""
        await self._unlock_all(token, (token, waiter_id))

    async def _unlock(self, token: str) -> str:
        """Release on every node; nodes that failed for a transport reason are tried once more on
        fresh connections, within one node timeout. Each node that still failed is logged: its
        key stays until its TTL ends."""
        # Forgotten only once the round is done: a release cancelled before it reached every node
        # is sent again (BaseLock._release_anyway), and must still unregister the waiter there.
        replies = await self._unlock_all(token, self._stray_waiter)
        self._stray_waiter = ()
        if replies.count(1) == len(replies):
            return RELEASED  # every node released it, the usual case: no outcome to weigh
        again = [index for index, reply in enumerate(replies) if transport_error(reply)]
        retried: dict = {}
        if again:
            answers = await _io.eval_all(
                [self._nodes[index] for index in again],
                RELEASE,
                self._release_keys,
                (token, SIGNAL_LIFETIME_MS, HANDOFF_WINDOW_MS),
                self.node_timeout_s,
                fresh=True,
            )
            retried = dict(zip(again, answers, strict=True))
        outcomes = [release_outcome(reply, retried.get(index)) for index, reply in enumerate(replies)]
        for index, outcome in enumerate(outcomes):
            if outcome == FAILED:
                log_failed_release(self.name, self._nodes[index].name, retried.get(index, replies[index]))
        names = self.node_names()
        self._refusal_detail = f" (by node: {', '.join(f'{n} {o}' for n, o in zip(names, outcomes, strict=True))})"
        return redlock_release_outcome(outcomes, self.quorum)

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
        return Lease(self.name, lease.token, lease.fence, start + (ttl_ms - drift_ms(ttl_ms)) / 1000.0)

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
