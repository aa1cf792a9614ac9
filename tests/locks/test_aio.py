"""The asyncio twins against the same real servers: same semantics as the blocking locks."""

from __future__ import annotations

import asyncio
import errno
import os
import time

import pytest
import redis.asyncio as aioredis

from locks import AsyncRedisLock, AsyncRedlock, LockLost, NotAcquired, NotOwned, QuorumUnavailable
from locks._async.io import NodeConnections
from locks._redis_py import stream_of

from .conftest import SINGLE_URL, async_clients, run

#: A node's time to answer in the tests that set it (the sync twin's tests use the same).
NODE_TIMEOUT_MS = 50


def test_async_single_grant_fence_refusal_and_stale_release(single, name):
    async def scenario():
        client = aioredis.Redis.from_url(SINGLE_URL)
        try:
            async with AsyncRedisLock(client, name, ttl_ms=2_000) as first:
                assert first.fence == 1
                with pytest.raises(NotAcquired):
                    await AsyncRedisLock(client, name, ttl_ms=2_000, timeout_ms=100).acquire()
            # The refused contender raised the "waiting" flag, so that release opened a hand-off
            # window for waiters; a single attempt (timeout 0) must come after it.
            await asyncio.sleep(0.05)
            stale = AsyncRedisLock(client, name, ttl_ms=100, timeout_ms=0)
            old = await stale.acquire()
            await asyncio.sleep(0.15)
            fresh = AsyncRedisLock(client, name, ttl_ms=5_000, timeout_ms=0)
            new = await fresh.acquire()
            assert new.fence > old.fence
            with pytest.raises(NotOwned):
                await stale.release()
            assert await client.get(name) == new.token.encode()
            extended = await fresh.extend(ttl_ms=8_000)
            assert extended.fence == new.fence and await client.pttl(name) > 7_000
            await fresh.release()
        finally:
            await client.aclose()

    run(scenario())


def test_async_waiters_are_woken_and_never_overlap(single, name):
    async def scenario():
        client = aioredis.Redis.from_url(SINGLE_URL)
        inside, overlaps, fences = [], [], []

        async def work():
            for _ in range(15):
                async with AsyncRedisLock(client, name, ttl_ms=5_000, timeout_ms=10_000) as lease:
                    inside.append(1)
                    if len(inside) > 1:
                        overlaps.append(lease)
                    fences.append(lease.fence)
                    await asyncio.sleep(0.001)
                    inside.pop()

        try:
            await asyncio.gather(*(work() for _ in range(5)))
        finally:
            await client.aclose()
        assert not overlaps
        assert fences == sorted(fences) and len(set(fences)) == 75

    run(scenario())


# It waits out renewals and a lost lease (about 1 s): make test runs it, not make check.
@pytest.mark.slow
def test_async_watchdog_renews_then_reports_loss(single, name):
    async def scenario():
        client = aioredis.Redis.from_url(SINGLE_URL)
        lost = []

        async def on_lost(lease, error):
            lost.append(error)

        try:
            with pytest.raises(LockLost) as raised:
                async with AsyncRedisLock(client, name, ttl_ms=300, timeout_ms=0, watchdog=True, on_lost=on_lost):
                    await asyncio.sleep(0.8)  # outlives the TTL only because the watchdog renews
                    assert await client.get(name) is not None and not lost
                    await client.delete(name)
                    await asyncio.sleep(0.3)
            assert lost and raised.value is lost[0]
        finally:
            await client.aclose()

    run(scenario())


def test_async_redlock_quorum_fences_and_pause(cluster, name):
    nodes, _ = cluster

    async def scenario():
        clients = async_clients(nodes)
        try:
            fences = []
            for _ in range(20):
                async with AsyncRedlock(clients, name, ttl_ms=2_000) as lease:
                    fences.append(lease.fence)
            assert fences == sorted(set(fences))
            nodes[0].kill()
            nodes[1].pause()
            started = time.monotonic()
            async with AsyncRedlock(clients, name, ttl_ms=2_000, node_timeout_ms=50) as lease:
                assert lease.fence > fences[-1]
            assert time.monotonic() - started < 0.1 + 0.5
            nodes[2].kill()
            started = time.monotonic()
            with pytest.raises(QuorumUnavailable):
                await AsyncRedlock(clients, name, ttl_ms=2_000, node_timeout_ms=50).acquire()
            assert time.monotonic() - started < 0.05 + 0.4
        finally:
            nodes[1].resume()
            for client in clients:
                await client.aclose()

    run(scenario())


def test_async_redlock_expiry_stale_release_and_extend(cluster, name):
    nodes, sync_clients = cluster

    async def scenario():
        clients = async_clients(nodes)
        try:
            # The 150 ms lease's own node timeout would be 8 ms: a first connect on two busy cores
            # missed it on all five nodes once in make test. The timeout is the sync test's.
            stale = AsyncRedlock(clients, name, ttl_ms=150, timeout_ms=0, node_timeout_ms=NODE_TIMEOUT_MS)
            old = await stale.acquire()
            await asyncio.sleep(0.2)
            fresh = AsyncRedlock(clients, name, ttl_ms=1_000, timeout_ms=0)
            new = await fresh.acquire()
            assert new.fence > old.fence
            with pytest.raises(NotOwned):
                await stale.release()
            assert all(c.get(name) == new.token.encode() for c in sync_clients)
            for c in sync_clients[:3]:
                c.delete(name)
            with pytest.raises(NotOwned, match="2 of 5"):
                await fresh.extend()
        finally:
            for client in clients:
                await client.aclose()

    run(scenario())


def _lose_with_etimedout(conn) -> None:
    """What the event loop does when the kernel ends a connection's receive with ETIMEDOUT (TCP
    gave up retransmitting to a host that vanished): its protocol learns the connection was lost
    with that error, and the stream's pending read raises it."""
    _, transport = stream_of(conn)
    transport.get_protocol().connection_lost(TimeoutError(errno.ETIMEDOUT, os.strerror(errno.ETIMEDOUT)))


@pytest.mark.parametrize("kind", ["single", "redlock"])
def test_async_a_read_ended_by_etimedout_is_a_node_failure_not_a_reply(cluster, name, kind):
    """Seen by reading redis-py (ninth session's audit): the locks read with
    ``read_response(timeout=math.inf)``, and an ``OSError`` with ETIMEDOUT is Python's builtin
    ``TimeoutError``, which is ``asyncio.TimeoutError`` on 3.11: redis-py took it for the caller's
    timeout and returned None, leaving the broken connection open, and the single-node lock then
    compared ``None > 0`` (TypeError; this test failed so). A Redlock round already counted a None
    as a node without a grant; for both, the read must fail as a node that did not answer and its
    socket be closed."""
    nodes, _ = cluster
    count = 1 if kind == "single" else 5

    async def scenario():
        clients = [aioredis.Redis(host="127.0.0.1", port=node.port, socket_timeout=2.0) for node in nodes[:count]]

        def make():
            if kind == "single":
                return AsyncRedisLock(clients[0], name, ttl_ms=5_000, timeout_ms=0)
            return AsyncRedlock(clients, name, ttl_ms=5_000, timeout_ms=0, node_timeout_ms=2_000)

        warm = make()
        await warm.acquire()
        await warm.release()
        # The connections the next acquire takes; every node holds its reply back until each
        # connection is lost with ETIMEDOUT, then answers again (a Redlock's undo round after the
        # failed one must not wait out its node timeout).
        conns = [NodeConnections.of(client)._idle[-1] for client in clients]
        transports = [stream_of(conn)[1] for conn in conns]
        for node in nodes[:count]:
            node.pause()

        def vanish() -> None:
            for conn in conns:
                _lose_with_etimedout(conn)
            for node in nodes[:count]:
                node.resume()

        loop = asyncio.get_running_loop()
        loop.call_later(0.1, vanish)
        started = loop.time()
        try:
            with pytest.raises(QuorumUnavailable):
                await make().acquire()
        finally:
            for node in nodes[:count]:
                node.resume()
        assert loop.time() - started < 1.5, "the acquire waited out the node timeout instead of failing"
        assert all(transport.is_closing() for transport in transports), "a socket lost with ETIMEDOUT was kept open"
        name_again = f"{name}:again"  # a thawed node may still run the failed acquire's script
        again = (
            AsyncRedisLock(clients[0], name_again, ttl_ms=5_000, timeout_ms=0)
            if kind == "single"
            else AsyncRedlock(clients, name_again, ttl_ms=5_000, timeout_ms=0, node_timeout_ms=2_000)
        )
        await again.acquire()  # the nodes serve the next acquire on fresh connections
        await again.release()
        for client in clients:
            await client.aclose()

    run(scenario())
