"""Blocking I/O for the locks in ``sync.py``; ``_aio_io.py`` is its asyncio twin, name for name.

Everything that waits lives here, and every wait has a deadline:

* :func:`eval_all` writes a script call to every node, then reads the replies as they arrive
  (one ``poll`` over every socket) until one deadline. Nodes without a connection are connected
  at the same time, without blocking: the connect, its handshake and the reply all fit in the
  same deadline; a connect that outlasts it (SYNs dropped) stays pending and is not waited for
  again for :data:`CONNECT_BACKOFF_S`. ``NOSCRIPT`` is answered with ``EVAL`` on the same connection under
  the same deadline.
* :func:`eval_one` is the single node's round trip; its reads are bounded by the connection's
  socket timeout, which is the node timeout (see :class:`NodeConnections`).
* A connection whose reply did not come in time is closed, never reused: a late reply can
  never be read as the answer to a later command.
"""

from __future__ import annotations

import errno
import os
import select
import socket
import threading
import time
import weakref
from collections import deque
from typing import Callable, Sequence

import redis
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError
from redis.retry import Retry

from ._core import Script, node_name, pack_eval, pack_evalsha, signal_key

Client = redis.Redis

#: A connect that outlasted a round is not waited for again, nor retried, for this long: an
#: unreachable host would otherwise cost every round a full node timeout.
CONNECT_BACKOFF_S = 1.0
#: What the library waits per reply when the client sets no ``socket_timeout`` (redis-py's default).
DEFAULT_SOCKET_TIMEOUT_S = 5.0


def connection_kwargs(client) -> dict:
    """The client's connection settings, made fit for the lock's own connections."""
    kwargs = dict(client.connection_pool.connection_kwargs)
    for key in (
        "maint_notifications_config",
        "maint_notifications_pool_handler",
        "orig_host_address",
        "orig_socket_timeout",
        "orig_socket_connect_timeout",
    ):
        kwargs.pop(key, None)
    # RESP2 and no CLIENT SETINFO: connecting then costs no round trip a frozen node could stall.
    kwargs["driver_info"] = None
    kwargs["protocol"] = 2
    # The lock retries by its own rules; redis-py's reconnect backoff would stall a round for seconds.
    kwargs["retry"] = Retry(NoBackoff(), 0)
    kwargs["socket_timeout"] = kwargs.get("socket_timeout") or DEFAULT_SOCKET_TIMEOUT_S
    return kwargs


class NodeConnections:
    """Idle connections to one Redis node, shared by every lock built on the same client.

    The library keeps its own connections rather than borrowing from the client's pool so that
    connecting sends no handshake commands (a frozen node could stall them) and taking one costs
    a deque pop. ``timeout_s`` is the client's ``socket_timeout`` (:data:`DEFAULT_SOCKET_TIMEOUT_S`
    if it has none): every read on these connections is bounded by it. Safe across threads
    (deque append/pop are atomic) and across fork (a child drops the parent's sockets).
    """

    _registry: "weakref.WeakKeyDictionary[redis.Redis, NodeConnections]" = weakref.WeakKeyDictionary()
    _registry_lock = threading.Lock()

    def __init__(self, client: redis.Redis) -> None:
        kwargs = connection_kwargs(client)
        connection_class = client.connection_pool.connection_class
        self._factory = lambda: connection_class(**kwargs)
        self.name = node_name(client)
        self.timeout_s = float(kwargs["socket_timeout"])
        self._address = None if "path" in kwargs else (kwargs.get("host", "localhost"), kwargs.get("port", 6379))
        self._idle: deque = deque()
        # (connection, socket, monotonic start) of connects a round left unfinished.
        self.pending: deque = deque()

    @classmethod
    def of(cls, client: redis.Redis) -> "NodeConnections":
        node = cls._registry.get(client)
        if node is None:
            with cls._registry_lock:
                node = cls._registry.get(client)
                if node is None:
                    node = cls._registry[client] = cls(client)
        return node

    @classmethod
    def _forget_after_fork(cls) -> None:
        for node in list(cls._registry.values()):
            node._idle = deque()
            node.pending = deque()

    def take(self):
        try:
            return self._idle.pop()
        except IndexError:
            return self._factory()

    def give(self, conn) -> None:
        self._idle.append(conn)


os.register_at_fork(after_in_child=NodeConnections._forget_after_fork)


def _start_connect(node: NodeConnections, conn) -> socket.socket | None:
    """Begin a non-blocking TCP connect for ``conn``; None for a unix socket (connected at once)."""
    if node._address is None:
        conn.connect()
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


def _finish_connect(node: NodeConnections, conn, sock: socket.socket, timeout_s: float) -> None:
    """Hand a connected socket to ``conn``; its handshake (AUTH, SELECT, if any) waits at most ``timeout_s``."""
    code = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
    if code:
        sock.close()
        raise RedisConnectionError(f"{node.name}: {os.strerror(code)}")
    sock.settimeout(max(timeout_s, 0.001))
    conn._connect = lambda: sock
    try:
        conn.connect_check_health(check_health=False, retry_socket_connect=False)
    finally:
        del conn._connect
    sock.settimeout(conn.socket_timeout)


def _send(conn, packed: list[bytes]) -> None:
    """Write one packed command on a connected socket. redis-py's send_packed_command and
    read_response wrap these calls in checks the lock does not need; on the hot path they cost
    more than the lock's own Python code."""
    try:
        conn._sock.sendall(packed[0])
    except OSError as error:
        raise RedisConnectionError(f"error writing to the node: {error}") from error


def _read(conn):
    try:
        reply = conn._parser.read_response()
    except OSError as error:  # the parser passes a reset connection through as a bare OSError
        raise RedisConnectionError(f"error reading from the node: {error}") from error
    if isinstance(reply, ResponseError):
        raise reply
    return reply


def eval_one(node: NodeConnections, conn, script: Script, keys: Sequence[str], argv: Sequence):
    """Run a script on one node over ``conn`` and return its reply; exceptions propagate, and a
    connection that failed is closed. Every read waits at most ``node.timeout_s``, the NOSCRIPT
    fallback included (its read gets what is left of that time)."""
    try:
        if conn._sock is None:
            sock = _start_connect(node, conn)
            if sock is not None:
                if not select.select([], [sock], [], node.timeout_s)[1]:
                    sock.close()
                    raise RedisTimeoutError(f"{node.name}: connect timed out")
                _finish_connect(node, conn, sock, node.timeout_s)
        started = time.monotonic()
        _send(conn, pack_evalsha(script, keys, argv))
        try:
            return _read(conn)
        except NoScriptError:
            _send(conn, pack_eval(script, keys, argv))
            conn._sock.settimeout(max(node.timeout_s - (time.monotonic() - started), 0.001))
            try:
                return _read(conn)
            finally:
                if conn._sock is not None:
                    conn._sock.settimeout(node.timeout_s)
    except ResponseError:
        raise
    except BaseException:
        conn.disconnect()
        raise


def call_one(node: NodeConnections, script: Script, keys: Sequence[str], argv: Sequence):
    conn = node.take()
    try:
        return eval_one(node, conn, script, keys, argv)
    finally:
        node.give(conn)


def _pending_connect(node: NodeConnections, started: float):
    """A connect of ``node`` that an earlier round left unfinished: ``(conn, None)`` once it is
    connected, ``(None, error)`` while it is still pending (or failed), so the round does not
    wait for it; ``(None, None)`` when there is none, or it was given up after the back-off."""
    try:
        conn, sock, since = node.pending.pop()  # atomic: two threads never claim the same connect
    except IndexError:
        return None, None
    if not select.select([], [sock], [], 0)[1]:
        if started - since < CONNECT_BACKOFF_S:
            node.pending.append((conn, sock, since))
            return None, RedisTimeoutError(f"{node.name}: connect pending for {(started - since) * 1000:.0f} ms")
        sock.close()
        return None, None
    try:
        _finish_connect(node, conn, sock, node.timeout_s)
    except Exception as error:  # noqa: BLE001 - refused: the next round connects afresh
        conn.disconnect()
        node.give(conn)
        return None, error
    return conn, None


def eval_all(
    nodes: Sequence[NodeConnections],
    script: Script,
    keys: Sequence[str],
    argv: Sequence,
    timeout_s: float,
    held: list | None = None,
) -> list:
    """Run a script on every node at once: write to all, then read all against one deadline.

    Returns one entry per node: the reply, or the exception that node produced (refused, timed
    out, still connecting, script error). With ``held`` (an empty list), the connection of the
    first node that answered with a refusal (an integer <= 0) is appended to it as
    ``(index, conn)`` instead of going back to the pool, so a waiter can block on the same
    server session that registered it; every other connection goes back at once, so a fence
    write-back that follows finds them idle.

    A connect that does not finish within the deadline is kept pending on the node: later rounds
    use it as soon as it completes but do not wait for it, and only after
    :data:`CONNECT_BACKOFF_S` is a fresh connect tried. An unreachable node (SYNs dropped) so
    costs one deadline per back-off period, not one per round; a slow connect is not wasted.
    """
    started = time.monotonic()
    deadline = started + timeout_s
    packed = pack_evalsha(script, keys, argv)
    replies: list = [None] * len(nodes)
    conns: list = [None] * len(nodes)
    by_fd: dict[int, int] = {}
    connecting: dict[int, socket.socket] = {}
    poller = select.poll()
    for index, node in enumerate(nodes):
        conn = None
        if node.pending:
            conn, replies[index] = _pending_connect(node, started)
            if replies[index] is not None:
                continue
        conn = conns[index] = conn or node.take()
        try:
            if conn._sock is None:
                sock = _start_connect(node, conn)
                if sock is not None:
                    fd = sock.fileno()
                    connecting[index] = sock
                    by_fd[fd] = index
                    poller.register(fd, select.POLLOUT)
                    continue
            _send(conn, packed)
        except Exception as error:  # noqa: BLE001 - a node's failure is a vote, not a crash
            conn.disconnect()
            replies[index] = error
            continue
        fd = conn._sock.fileno()
        by_fd[fd] = index
        poller.register(fd, select.POLLIN)
    retried: set[int] = set()
    while by_fd:
        events = poller.poll(max((deadline - time.monotonic()) * 1000.0, 0.0))
        if not events:
            break
        for fd, _ in events:
            index = by_fd[fd]
            conn = conns[index]
            try:
                if connecting and index in connecting:
                    _finish_connect(nodes[index], conn, connecting.pop(index), deadline - time.monotonic())
                    _send(conn, packed)
                    poller.modify(fd, select.POLLIN)
                    continue
                replies[index] = _read(conn)
            except NoScriptError as error:
                replies[index] = error
                if index not in retried:
                    # The node restarted and forgot the script: EVAL sends the text and caches it again.
                    retried.add(index)
                    try:
                        _send(conn, pack_eval(script, keys, argv))
                        continue
                    except Exception as send_error:  # noqa: BLE001
                        conn.disconnect()
                        replies[index] = send_error
            except ResponseError as error:
                replies[index] = error
            except Exception as error:  # noqa: BLE001
                conn.disconnect()
                replies[index] = error
            del by_fd[fd]
            poller.unregister(fd)
    for index in by_fd.values():
        sock = connecting.pop(index, None)
        if sock is not None:
            nodes[index].pending.append((conns[index], sock, started))
            conns[index] = None
            replies[index] = RedisTimeoutError(
                f"{nodes[index].name}: connect did not finish within {timeout_s * 1000:.0f} ms"
            )
        else:
            conns[index].disconnect()
            replies[index] = RedisTimeoutError(f"{nodes[index].name} did not answer within {timeout_s * 1000:.0f} ms")
    for index, conn in enumerate(conns):
        if conn is not None:
            if (
                held is not None
                and not held
                and conn._sock is not None
                and type(replies[index]) is int
                and replies[index] <= 0
            ):
                held.append((index, conn))
            else:
                nodes[index].give(conn)
    return replies


def block_on_signal(node: NodeConnections, conn, name: str, wait_s: float) -> None:
    """Wait up to ``wait_s`` on ``conn`` for a release to push to the lock's signal list.

    ``conn`` must be the connection of the refused attempt that registered the caller as a
    waiter: if that server restarted since, this connection is closed, the wait ends at once,
    and the caller tries the fresh server instead of waiting on one that never heard of it.
    The read waits at most ``wait_s`` plus the node timeout.
    """
    wait_s = max(wait_s, 0.001)
    try:
        if conn._sock is None:
            return
        conn.send_command("BLPOP", signal_key(name), f"{wait_s:.3f}", check_health=False)
        conn.read_response(timeout=wait_s + node.timeout_s)
    except Exception:  # noqa: BLE001 - the caller retries the lock; a dead node only ends the wait
        conn.disconnect()


sleep = time.sleep


def call(function: Callable, *args) -> None:
    function(*args)


class Watchdog:
    """Runs ``body(watchdog)`` in a daemon thread until :meth:`stop`."""

    def __init__(self, name: str, body: Callable) -> None:
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=body, args=(self,), name=name, daemon=True)
        self._thread.start()

    def wait(self, seconds: float) -> bool:
        """Sleep up to ``seconds``; True if :meth:`stop` was called meanwhile."""
        return self._stopped.wait(max(seconds, 0))

    def stopped(self) -> bool:
        return self._stopped.is_set()

    def stop(self) -> None:
        self._stopped.set()
        if self._thread is not threading.current_thread():
            self._thread.join()
