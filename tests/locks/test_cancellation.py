"""The asyncio twins cancelled: during acquire, inside the block and during release, on real nodes.

What a backend engineer tries first on asyncio lock code: ``asyncio.wait_for`` or ``task.cancel()``
at any await point. After each cancellation the nodes are read directly: no key, no waiter
registration, and the next acquirer is granted at once (not after the TTL).
"""

from __future__ import annotations

import asyncio
import gc
import time

import pytest
import redis.asyncio as aioredis

from locks import AsyncRedisLock, AsyncRedlock

from .conftest import run
from .netfaults import Proxy, Unreachable

KINDS = ["single", "redlock"]


def _lock(kind: str, clients: list, name: str, **kwargs):
    if kind == "single":
        return AsyncRedisLock(clients[0], name, **kwargs)
    return AsyncRedlock(clients, name, node_timeout_ms=1_000, **kwargs)


def _clients(ports) -> list[aioredis.Redis]:
    return [aioredis.Redis(host="127.0.0.1", port=port, socket_timeout=1.0) for port in ports]


async def _close(clients) -> None:
    for client in clients:
        await client.aclose()


def _report_to(reported: list[str]) -> None:
    """What the running loop would log (an exception never retrieved, …) goes to ``reported`` instead."""

    def report(loop, context) -> None:
        reported.append(f"{context['message']}: {context.get('future')!r:.200}")

    asyncio.get_running_loop().set_exception_handler(report)


def _registered(sync_clients, name: str) -> int:
    return sum(client.scard(f"{name}:waiters") for client in sync_clients)


@pytest.mark.parametrize("kind", KINDS)
def test_a_woken_waiter_cancelled_passes_the_wake_up_on(cluster, name, kind):
    """Before: the release woke one waiter (its signal, one per release); that waiter was cancelled
    before it took the lock, and its clean-up found the lock free and woke nobody: the other waiter
    slept until the first holder's TTL would have run out (9.3 s of 10), the lock free all along."""
    nodes, sync_clients = cluster
    count = 1 if kind == "single" else len(nodes)
    proxy = Proxy(nodes[0].port)  # the first waiter's link to node 0: its replies arrive 0.3 s late

    async def scenario() -> float:
        direct = _clients([node.port for node in list(nodes)[:count]])
        slow = _clients([proxy.port, *(node.port for node in list(nodes)[1:count])])
        try:
            holder = _lock(kind, direct, name, ttl_ms=10_000, timeout_ms=0)
            await holder.acquire()
            proxy.reply_delay_s = 0.3
            first = asyncio.ensure_future(_lock(kind, slow, name, ttl_ms=10_000, timeout_ms=15_000).acquire())
            await asyncio.sleep(0.8)  # refused (its reply 0.3 s late), then blocked on node 0 first
            second = asyncio.ensure_future(_lock(kind, direct, name, ttl_ms=10_000, timeout_ms=15_000).acquire())
            await asyncio.sleep(0.3)
            assert _registered(sync_clients[:1], name) == 2, "both wait on node 0"
            await holder.release()  # node 0 hands its one wake-up to the first waiter, whose reply is late
            released = time.monotonic()
            await asyncio.sleep(0.1)
            first.cancel()
            with pytest.raises(asyncio.CancelledError):
                await first
            try:
                await asyncio.wait_for(second, 3)
            except TimeoutError:
                pytest.fail("the second waiter was not woken: the lock stood free for the holder's TTL")
            return time.monotonic() - released
        finally:
            await _close(direct + slow)

    try:
        took = run(scenario())
    finally:
        proxy.close()
    assert took < 1.5, took


def test_a_round_cancelled_while_a_node_connects_leaves_no_task_exception_unretrieved(cluster, name):
    """Before: a Redlock acquire cancelled while one node's connect was still running (a host that
    drops SYNs) left that connect task to nobody: when it failed, later, asyncio logged "Task
    exception was never retrieved" (and its connection was never closed)."""
    nodes, sync_clients = cluster
    unreachable = Unreachable()
    reported: list[str] = []

    async def scenario() -> None:
        _report_to(reported)
        clients = _clients([node.port for node in list(nodes)[:4]] + [unreachable.port])
        try:
            lock = AsyncRedlock(clients, name, ttl_ms=10_000, timeout_ms=5_000, node_timeout_ms=1_000)
            task = asyncio.ensure_future(lock.acquire())
            await asyncio.sleep(0.3)  # four nodes answered; the fifth's connect runs on
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            unreachable.close()  # the connect's next SYN is refused: it fails about a second later
            await asyncio.sleep(2.5)
            gc.collect()
            await asyncio.sleep(0)
        finally:
            await _close(clients)

    try:
        run(scenario())
    finally:
        unreachable.close()
    assert [message for message in reported if "never retrieved" in message] == []
    assert [client.exists(name) for client in sync_clients[:4]] == [0] * 4

