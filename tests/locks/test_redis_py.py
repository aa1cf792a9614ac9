"""The lock library's uses of redis-py internals (``locks/_redis_py.py``), each run against a real
``redis-server`` with the installed redis-py: a redis-py upgrade that renames or reshapes one of
them fails here, by name, instead of somewhere inside a lock round. And how the asyncio twin's
reads meet redis-py's ``read_response`` when the kernel ends a receive with ETIMEDOUT, injected on
the lock's own connection (white box)."""

from __future__ import annotations

import asyncio
import errno
import gc
import os
import socket
import time

import pytest
import redis
import redis.asyncio as aioredis
from redis.exceptions import NoScriptError

from locks import AsyncRedisLock, AsyncRedlock, QuorumUnavailable, _redis_py
from locks._async.io import NodeConnections
from locks._connections import NodeConnections as SyncNodeConnections
from locks._connections import bound_blocking, connection_kwargs

from .conftest import run


def new_connection(client):
    return client.connection_pool.connection_class(**_redis_py.pool_kwargs(client))


def test_pool_kwargs_make_a_working_connection_without_the_pools_own_keys(cluster):
    nodes, _ = cluster
    client = redis.Redis(host="127.0.0.1", port=nodes[0].port, socket_timeout=1.0)
    kwargs = _redis_py.pool_kwargs(client)
    assert kwargs["port"] == nodes[0].port and kwargs["socket_timeout"] == 1.0
    assert not set(_redis_py.POOL_ONLY_KWARGS) & set(kwargs)
    conn = new_connection(client)
    try:
        _redis_py.connect_quietly(conn)
        conn.send_command("PING")
        assert conn.read_response() == b"PONG"
    finally:
        conn.disconnect()
        client.close()


def test_the_socket_and_the_parser_of_a_connection(cluster):
    nodes, _ = cluster
    client = redis.Redis(host="127.0.0.1", port=nodes[0].port, socket_timeout=1.0)
    conn = new_connection(client)
    assert _redis_py.socket_of(conn) is None  # not connected yet
    try:
        _redis_py.connect_quietly(conn)
        sock = _redis_py.socket_of(conn)
        assert isinstance(sock, socket.socket)
        sock.sendall(b"*2\r\n$4\r\nECHO\r\n$5\r\nhello\r\n")
        assert _redis_py.read_reply(conn) == b"hello"
        conn.disconnect()
        assert _redis_py.socket_of(conn) is None
    finally:
        client.close()


def test_a_reply_is_read_within_the_kernels_timeout_and_an_error_reply_is_raised(cluster):
    nodes, _ = cluster
    client = redis.Redis(host="127.0.0.1", port=nodes[0].port, socket_timeout=1.0)
    conn = new_connection(client)
    try:
        _redis_py.connect_quietly(conn)
        sock = _redis_py.socket_of(conn)
        bound_blocking(sock, 0.05)  # blocking mode: the kernel bounds the receive
        assert sock.gettimeout() is None
        started = time.monotonic()
        with pytest.raises(redis.TimeoutError):
            _redis_py.read_reply(conn)  # nothing was sent, so no reply comes
        assert time.monotonic() - started < 0.5
        sock.sendall(b"*3\r\n$7\r\nEVALSHA\r\n$40\r\n" + b"0" * 40 + b"\r\n$1\r\n0\r\n")
        with pytest.raises(NoScriptError):
            _redis_py.read_reply(conn)
        sock.sendall(b"*1\r\n$4\r\nPING\r\n")
        assert _redis_py.read_reply(conn) == b"PONG"  # the error reply was read whole
    finally:
        conn.disconnect()
        client.close()


def test_a_reply_is_read_from_what_has_arrived_without_waiting(cluster):
    """``read_available`` (a Redlock round's read): part of a reply is INCOMPLETE at once, the
    rest completes it; an error reply is raised. Two ends of a socket pair stand in for the node."""
    nodes, _ = cluster
    client = redis.Redis(host="127.0.0.1", port=nodes[0].port, socket_timeout=1.0)
    conn = client.connection_pool.connection_class(**connection_kwargs(client))  # the locks' own: no handshake
    ours, node = socket.socketpair()
    try:
        ours.settimeout(1.0)
        _redis_py.connect_on(conn, ours)
        bound_blocking(ours, 1.0)
        started = time.monotonic()
        assert _redis_py.read_available(conn) is _redis_py.INCOMPLETE  # nothing yet
        node.sendall(b"$5\r\nhel")
        assert _redis_py.read_available(conn) is _redis_py.INCOMPLETE  # part of it
        assert time.monotonic() - started < 0.5  # neither waited for the socket's second
        node.sendall(b"lo\r\n:7\r\n")
        assert _redis_py.read_available(conn) == b"hello"
        assert _redis_py.read_available(conn) == 7  # the next reply, already in the buffer
        node.sendall(b"-NOSCRIPT No matching script\r\n")
        with pytest.raises(NoScriptError):
            _redis_py.read_available(conn)
        node.close()
        with pytest.raises(redis.ConnectionError):
            _redis_py.read_available(conn)  # the other end closed
    finally:
        conn.disconnect()
        client.close()


def test_a_reset_connection_is_a_connection_error(cluster):
    """A receive the peer reset (ECONNRESET, an ``OSError``) comes out of ``read_reply`` as redis-py's
    ``ConnectionError``, as a closed one does: the lock's round trip reads through it alone. A
    socket pair stands in for the node: closed with our request still unread, it resets."""
    nodes, _ = cluster
    client = redis.Redis(host="127.0.0.1", port=nodes[0].port, socket_timeout=1.0)
    conn = client.connection_pool.connection_class(**connection_kwargs(client))
    ours, node = socket.socketpair()
    try:
        ours.settimeout(1.0)
        _redis_py.connect_on(conn, ours)
        bound_blocking(ours, 1.0)
        ours.sendall(b"*1\r\n$4\r\nPING\r\n")  # never read by the node
        node.close()
        with pytest.raises(redis.ConnectionError, match="error reading from the node"):
            _redis_py.read_reply(conn)
    finally:
        conn.disconnect()
        client.close()


def test_a_connection_adopts_a_socket_connected_elsewhere(cluster):
    nodes, _ = cluster
    client = redis.Redis(host="127.0.0.1", port=nodes[0].port, db=3, socket_timeout=1.0)
    conn = new_connection(client)
    sock = socket.create_connection(("127.0.0.1", nodes[0].port), timeout=1.0)
    try:
        _redis_py.connect_on(conn, sock)  # the handshake (SELECT 3) runs on this socket
        assert _redis_py.socket_of(conn) is sock
        conn.send_command("CLIENT", "INFO")
        assert b" db=3 " in conn.read_response()
    finally:
        conn.disconnect()
        client.close()


def test_an_asyncio_connection_connects_quietly(cluster):
    nodes, _ = cluster

    async def ping() -> bytes:
        client = aioredis.Redis(host="127.0.0.1", port=nodes[0].port, socket_timeout=1.0)
        conn = new_connection(client)
        try:
            await _redis_py.connect_quietly_async(conn)
            await conn.send_command("PING")
            return await conn.read_response()
        finally:
            await conn.disconnect()
            await client.aclose()

    assert asyncio.run(ping()) == b"PONG"


def test_an_asyncio_connections_stream_and_its_unread_bytes(cluster):
    nodes, _ = cluster

    async def probe() -> tuple:
        client = aioredis.Redis(host="127.0.0.1", port=nodes[0].port, socket_timeout=1.0)
        conn = new_connection(client)
        try:
            await _redis_py.connect_quietly_async(conn)
            reader, transport = _redis_py.stream_of(conn)
            before = (transport.is_closing(), reader.at_eof(), _redis_py.unread_bytes(reader))
            await conn.send_command("PING")
            while not _redis_py.unread_bytes(reader):  # the reply arrives, nobody reads it yet
                await asyncio.sleep(0.01)
            return before, _redis_py.unread_bytes(reader)
        finally:
            await conn.disconnect()
            await client.aclose()

    before, unread = asyncio.run(asyncio.wait_for(probe(), 5))
    assert before == (False, False, 0) and unread == len(b"+PONG\r\n")


def _lose_with_etimedout(conn) -> None:
    """What the event loop does when the kernel ends a connection's receive with ETIMEDOUT (TCP
    gave up retransmitting to a host that vanished): its protocol learns the connection was lost
    with that error, and the stream's pending read raises it."""
    _, transport = _redis_py.stream_of(conn)
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
        conns = [NodeConnections.of(client).idle()[-1] for client in clients]
        transports = [_redis_py.stream_of(conn)[1] for conn in conns]
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

    run(scenario())  # the locks' connections of the loop closed with it


def test_a_clients_node_is_found_by_identity_and_forgotten_with_the_client(cluster):
    """``NodeConnections.of`` (both twins' registry, ``_connections.ByClient``): the same node for
    the same client, another for another client of the same server, and the entry goes with its
    client, so a process that builds clients over and over keeps no node, nor its sockets, for them."""
    nodes, _ = cluster
    registry = SyncNodeConnections._registry
    first = redis.Redis(host="127.0.0.1", port=nodes[0].port, socket_timeout=1.0)
    second = redis.Redis(host="127.0.0.1", port=nodes[0].port, socket_timeout=1.0)
    node = SyncNodeConnections.of(first)
    assert SyncNodeConnections.of(first) is node
    assert SyncNodeConnections.of(second) is not node
    key = id(first)
    assert registry.entries[key][1] is node
    del first, node
    gc.collect()
    assert key not in registry.entries
    assert SyncNodeConnections.of(second) in registry.values()
    second.close()
