"""The blocking locks' own connections to each Redis node, and their non-blocking connects.

:class:`NodeConnections` keeps the idle connections of one node; :func:`start_connect`,
:func:`finish_connect` and :func:`pending_connect` let one round connect to every node at once
without waiting for any of them (see :func:`locks._sync.io.eval_all`). The asyncio
twin takes :func:`connection_kwargs` and the constants from here.
"""

from __future__ import annotations

import errno
import functools
import os
import select
import socket
import struct
import threading
import weakref
from collections import deque

import redis
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError
from redis.retry import Retry

from ._core import node_name, server_key
from ._redis_py import connect_on, pool_kwargs, socket_of

#: A connect that outlasted a round is not waited for again, nor retried, for this long: an
#: unreachable host would otherwise cost every round a full node timeout.
CONNECT_BACKOFF_S = 1.0
#: What the library waits per reply when the client sets no ``socket_timeout`` (redis-py's default).
DEFAULT_SOCKET_TIMEOUT_S = 5.0


def connection_kwargs(client) -> dict:
    """The client's connection settings, made fit for the lock's own connections."""
    kwargs = pool_kwargs(client)
    # RESP2 and no CLIENT SETINFO: connecting then costs no round trip a frozen node could stall.
    kwargs["driver_info"] = None
    kwargs["protocol"] = 2
    # The lock retries by its own rules; redis-py's reconnect backoff would stall a round for seconds.
    kwargs["retry"] = Retry(NoBackoff(), 0)
    kwargs["socket_timeout"] = kwargs.get("socket_timeout") or DEFAULT_SOCKET_TIMEOUT_S
    return kwargs


class ByClient:
    """One object per client, found by the client's identity, kept while the client lives.

    A lookup is a dict ``get`` by ``id(client)`` and a call of the weak reference kept with it: a
    ``WeakKeyDictionary`` made and hashed a new weak reference on every lookup, and a lock looks
    its node up once per node each time it is built (about 700 client instructions a lookup fewer,
    callgrind: ``scripts/lock_instructions.py``)."""

    def __init__(self) -> None:
        #: id(client) -> (weak reference to the client, its object)
        self.entries: dict[int, tuple[weakref.ref, object]] = {}
        self._lock = threading.Lock()

    def add(self, client, make):
        """The object of ``client``, made by ``make(client)`` unless another thread just did."""
        key = id(client)
        with self._lock:
            entry = self.entries.get(key)
            if entry is not None and entry[0]() is client:
                return entry[1]
            made = make(client)
            self.entries[key] = (weakref.ref(client, functools.partial(self._drop, key)), made)
            return made

    def _drop(self, key: int, ref: weakref.ref) -> None:
        # A weakref callback: no lock (the collector may run it inside ``add`` on this thread). Only
        # the dead client's entry goes; a client made since under the same id keeps its own.
        entry = self.entries.get(key)
        if entry is not None and entry[0] is ref:
            self.entries.pop(key, None)

    def values(self) -> list:
        return [made for _, made in list(self.entries.values())]


class NodeConnections:
    """Idle connections to one Redis node, shared by every lock built on the same client.

    The library keeps its own connections rather than borrowing from the client's pool so that
    connecting sends no handshake commands (a frozen node could stall them) and taking one costs
    a deque pop. ``timeout_s`` is the client's ``socket_timeout`` (:data:`DEFAULT_SOCKET_TIMEOUT_S`
    if it has none): every read on these connections is bounded by it. Safe across threads
    (deque append/pop are atomic) and across fork (a child drops the parent's sockets).
    """

    _registry = ByClient()

    def __init__(self, client: redis.Redis) -> None:
        kwargs = connection_kwargs(client)
        connection_class = client.connection_pool.connection_class
        self._factory = lambda: connection_class(**kwargs)
        self.name = node_name(client)
        self.server = server_key(client)  # which server, for Redlock's check (one per client)
        # The last Redlock node list, starting here, found to be distinct servers (AsyncRedlock.__init__).
        self.distinct_list: list | tuple = ()
        self.timeout_s = float(kwargs["socket_timeout"])
        self._address = None if "path" in kwargs else (kwargs.get("host", "localhost"), kwargs.get("port", 6379))
        self._idle: deque = deque()
        # (connection, socket, monotonic start) of connects a round left unfinished, and the lock
        # that makes "none kept yet, keep this one" and "claim it, still pending, put it back" one
        # step each: between a claim's check (a poll, which lets other threads run) and its putting
        # back, another thread's round saw none kept and kept its own (two were left, seen).
        self.pending: deque = deque()
        self.pending_lock = threading.Lock()

    @classmethod
    def of(cls, client: redis.Redis) -> "NodeConnections":
        entry = cls._registry.entries.get(id(client))
        if entry is not None and entry[0]() is client:
            return entry[1]
        return cls._registry.add(client, cls)

    @classmethod
    def _forget_after_fork(cls) -> None:
        for node in list(cls._registry.values()):
            node._idle = deque()
            node.pending = deque()
            node.pending_lock = threading.Lock()  # another thread may have held it at the fork

    def take(self):
        """An idle connection, or a new one (unconnected: the caller connects it). An idle one
        whose server went away (its socket is at EOF, or has bytes nobody asked for) is never
        handed out: it is closed, and so is every other idle one, which point at the same
        process; the caller gets it back unconnected."""
        conn = self.take_unchecked()
        sock = socket_of(conn)
        if sock is not None and not _quiet_idle(conn, sock):
            self.went_away(conn)
        return conn

    def take_unchecked(self):
        """:meth:`take` without the check: the caller checks with :func:`went_away` (one ``poll``
        for every node of a round), then calls :meth:`went_away` for each that did."""
        try:
            return self._idle.pop()
        except IndexError:
            return self._factory()

    def went_away(self, conn) -> None:
        """``conn``'s server went away: close it and every idle connection of this node."""
        conn.disconnect()
        self.drop_idle()

    def fresh(self):
        """A new, unconnected connection: for a retry that must not meet an old one."""
        return self._factory()

    def give(self, conn) -> None:
        self._idle.append(conn)

    def drop_idle(self) -> None:
        """Close every idle connection: the node reset one, so the others point at a dead process."""
        idle, self._idle = self._idle, deque()
        while idle:  # pop, not iterate: another thread may still be taking from the old deque
            try:
                conn = idle.pop()
            except IndexError:
                return
            conn.disconnect()


os.register_at_fork(after_in_child=NodeConnections._forget_after_fork)


def quiet(sock) -> bool:
    """Whether an idle socket has nothing to read and no hang-up: a server that exited (or
    restarted) left its old sockets readable at EOF."""
    poller = select.poll()
    poller.register(sock, select.POLLIN | select.POLLHUP)
    return not poller.poll(0)


def _quiet_idle(conn, sock) -> bool:
    """:func:`quiet` for an idle connection's socket, with the poll object kept on the connection
    (``_lock_poller``, for its current socket): a lock takes a connection twice per acquisition,
    and a new poll object each time cost 3,500 client instructions of the 115,000 an acquire and
    release took (callgrind: ``scripts/lock_instructions.py``)."""
    kept = conn.__dict__.get("_lock_poller")
    if kept is None or kept[0] is not sock:
        poller = select.poll()
        poller.register(sock, select.POLLIN | select.POLLHUP)
        kept = conn._lock_poller = (sock, poller)
    return not kept[1].poll(0)


def went_away(socks: list) -> set[int]:
    """The descriptors among ``socks`` (idle sockets) that have something to read or a hang-up:
    :func:`quiet` for several sockets in one system call."""
    poller = select.poll()
    for sock in socks:
        poller.register(sock, select.POLLIN | select.POLLHUP)
    return {fd for fd, _ in poller.poll(0)}


def bound_blocking(sock, timeout_s: float) -> None:
    """Put a connected socket in blocking mode and let the kernel bound each send and receive to
    ``timeout_s`` (``SO_SNDTIMEO``, ``SO_RCVTIMEO``): a wait that runs out raises
    :class:`BlockingIOError`. Python's own socket timeout bounds the same waits with a ``poll``
    before every send and every receive; this way a round trip is two system calls, not four."""
    seconds = max(timeout_s, 0.001)
    timeval = struct.pack("ll", int(seconds), int(seconds % 1 * 1_000_000))
    sock.settimeout(None)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, timeval)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, timeval)


def writable(sock, timeout_s: float) -> bool:
    """Whether ``sock`` becomes writable (a non-blocking connect finished) within ``timeout_s``.

    ``poll``, not ``select``: a gunicorn worker holding a spike's keep-alive connections has
    descriptors above 1024, which ``select`` refuses ("filedescriptor out of range").
    """
    poller = select.poll()
    poller.register(sock, select.POLLOUT)
    return bool(poller.poll(timeout_s * 1000))


def start_connect(node: NodeConnections, conn) -> socket.socket | None:
    """Begin a non-blocking TCP connect for ``conn``; None for a unix socket (connected at once)."""
    if node._address is None:
        conn.connect()
        bound_blocking(socket_of(conn), node.timeout_s)
        return None
    family, _, _, _, address = socket.getaddrinfo(*node._address, type=socket.SOCK_STREAM)[0]
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.setblocking(False)
    code = sock.connect_ex(address)
    if code not in (0, errno.EINPROGRESS):
        sock.close()
        raise RedisConnectionError(f"{node.name}: {os.strerror(code)}")
    return sock


def finish_connect(node: NodeConnections, conn, sock: socket.socket, timeout_s: float) -> None:
    """Hand a connected socket to ``conn``; its handshake (AUTH, SELECT, if any) waits at most
    ``timeout_s``, and every later send and receive at most the node timeout (:func:`bound_blocking`)."""
    code = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
    if code:
        sock.close()
        raise RedisConnectionError(f"{node.name}: {os.strerror(code)}")
    sock.settimeout(max(timeout_s, 0.001))
    connect_on(conn, sock)
    bound_blocking(sock, node.timeout_s)


def keep_pending(node: NodeConnections, conn, sock, started: float) -> None:
    """Keep a connect its round could not wait for on ``node``, unless the node keeps one already
    (another thread's round left it meanwhile): then this one is closed. One is all a later round
    needs, and each kept beside it stayed open for the kernel's SYN retries (minutes)."""
    with node.pending_lock:
        kept = not node.pending
        if kept:
            node.pending.append((conn, sock, started))
    if not kept:
        sock.close()  # not yet the connection's: ``conn`` holds no socket


def pending_connect(node: NodeConnections, started: float):
    """A connect of ``node`` that an earlier round left unfinished: ``(conn, None)`` once it is
    connected, ``(None, error)`` while it is still pending (or failed), so the round does not
    wait for it; ``(None, None)`` when there is none, or it was given up after the back-off."""
    with node.pending_lock:
        if not node.pending:
            return None, None
        conn, sock, since = node.pending.pop()
        done = writable(sock, 0)
        if not done and started - since < CONNECT_BACKOFF_S:
            node.pending.append((conn, sock, since))
            return None, RedisTimeoutError(f"{node.name}: connect pending for {(started - since) * 1000:.0f} ms")
    if not done:
        sock.close()
        return None, None
    try:
        finish_connect(node, conn, sock, node.timeout_s)
    except Exception as error:  # noqa: BLE001 - refused: the next round connects afresh
        conn.disconnect()
        node.give(conn)
        return None, error
    return conn, None
