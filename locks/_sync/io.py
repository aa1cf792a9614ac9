"""Blocking I/O for the locks in ``_sync/locks.py``; ``_async/io.py`` is its asyncio twin, name for name (both by hand).

Everything that waits lives here, and every wait has a deadline:

* :func:`eval_all` writes a script call to every node, then reads the replies as they arrive
  (one ``poll`` over every socket) until one deadline. Nodes without a connection are connected
  at the same time, without blocking: the connect, its handshake and the reply all fit in the
  same deadline; a connect that outlasts it (SYNs dropped) stays pending and is not waited for
  again for ``_connections.CONNECT_BACKOFF_S``. ``NOSCRIPT`` is answered with ``EVAL`` on the same connection under
  the same deadline.
* :func:`eval_one` is the single node's round trip; its sends and reads are bounded by the
  kernel's socket timeouts, set to the node timeout (``_connections.bound_blocking``: a round trip is
  one send and one receive, no ``poll`` before each).
* A connection whose reply did not come in time is closed, never reused: a late reply can
  never be read as the answer to a later command.
"""

from __future__ import annotations

import contextlib
import inspect
import select
import socket
import threading
import time
from typing import Callable, Sequence

import redis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from .._connections import (
    NodeConnections,
    bound_blocking,
    finish_connect,
    keep_pending,
    pending_connect,
    start_connect,
    went_away,
    writable,
)
from .._core import Round, Script, pack_eval, pack_evalsha, signal_key
from .._redis_py import INCOMPLETE, read_available, read_reply, socket_of

Client = redis.Redis


def _send(conn, packed: list[bytes]) -> None:
    """Write one packed command on a connected socket. redis-py's send_packed_command and
    read_response wrap these calls in checks the lock does not need; on the hot path they cost
    more than the lock's own Python code."""
    try:
        socket_of(conn).sendall(packed[0])
    except OSError as error:
        raise RedisConnectionError(f"error writing to the node: {error}") from error


def eval_one(node: NodeConnections, conn, script: Script, keys: Sequence[str], argv: Sequence, *, text: bool = False):
    """Run a script on one node over ``conn`` and return its reply; exceptions propagate, and a
    connection that failed is closed. Every read waits at most ``node.timeout_s``, the NOSCRIPT
    fallback included (its read gets what is left of that time)."""
    try:
        if socket_of(conn) is None:
            sock = start_connect(node, conn)
            if sock is not None:
                if not writable(sock, node.timeout_s):
                    sock.close()
                    raise RedisTimeoutError(f"{node.name}: connect timed out")
                finish_connect(node, conn, sock, node.timeout_s)
        started = time.monotonic()
        _send(conn, pack_eval(script, keys, argv) if text else pack_evalsha(script, keys, argv))
        try:
            return read_reply(conn)
        except NoScriptError:
            _send(conn, pack_eval(script, keys, argv))
            bound_blocking(socket_of(conn), node.timeout_s - (time.monotonic() - started))
            try:
                return read_reply(conn)
            finally:
                if socket_of(conn) is not None:
                    bound_blocking(socket_of(conn), node.timeout_s)
    except ResponseError:
        raise
    except RedisConnectionError:
        conn.disconnect()
        node.drop_idle()
        raise
    except BaseException:
        conn.disconnect()
        raise


def call_one(
    node: NodeConnections,
    script: Script,
    keys: Sequence[str],
    argv: Sequence,
    *,
    fresh: bool = False,
    text: bool = False,
):
    """:func:`eval_one` on an idle connection, or with ``fresh`` on a new one. With ``text`` the
    script goes as EVAL, not EVALSHA: a clean-up on a slow link gets no NOSCRIPT it cannot wait for."""
    conn = node.fresh() if fresh else node.take()
    try:
        return eval_one(node, conn, script, keys, argv, text=text)
    finally:
        node.give(conn)


def eval_all(
    nodes: Sequence[NodeConnections],
    script: Script,
    keys: Sequence[str],
    argv: Sequence,
    timeout_s: float,
    held: list | None = None,
    fresh: bool = False,
    text: bool = False,
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
    ``_connections.CONNECT_BACKOFF_S`` is a fresh connect tried. An unreachable node (SYNs dropped) so
    costs one deadline per back-off period, not one per round; a slow connect is not wasted.
    With ``fresh``, every node gets a new connection (a retry that must not meet an old one).
    """
    round_ = _Round(nodes, script, keys, argv, timeout_s, fresh)
    if text:  # EVAL, as for call_one
        round_.packed = pack_eval(script, keys, argv)
    round_.take_all()
    for index, conn in enumerate(round_.conns):
        if conn is not None:
            round_.send(index, conn)
    round_.poll()
    if round_.by_fd:
        round_.time_out()
    round_.give_back(held)
    return round_.replies


class _Round(Round):
    """One :func:`eval_all`, with the sockets it polls."""

    def __init__(
        self,
        nodes: Sequence[NodeConnections],
        script: Script,
        keys: Sequence[str],
        argv: Sequence,
        timeout_s: float,
        fresh: bool = False,
    ) -> None:
        super().__init__(nodes, script, keys, argv, timeout_s, started=time.monotonic(), fresh=fresh)
        self.by_fd: dict[int, int] = {}
        self.connecting: dict[int, socket.socket] = {}
        self.retried: set[int] = set()
        self.poller = select.poll()

    def take_all(self) -> None:
        """A connection per node: a connect an earlier round left pending once it completed (one
        still pending is that node's reply), else an idle one, else a new one. The idle ones are
        checked together (one ``poll``): one whose server went away is closed, with its node's
        other idle ones, and connected afresh (``NodeConnections.take``, for every node at once)."""
        idle: dict = {}
        for index, node in enumerate(self.nodes):
            conn = None
            # A fresh round (a release's retry) reads it too: one more connect beside it, to a host
            # that drops SYNs, stayed open for the kernel's SYN retries (one socket a release, seen).
            if node.pending:
                conn, self.replies[index] = pending_connect(node, self.started)
                if self.replies[index] is not None:
                    continue
            if conn is None:
                conn = node.fresh() if self.fresh else node.take_unchecked()
                sock = socket_of(conn)
                if sock is not None:
                    idle[sock.fileno()] = index
            self.conns[index] = conn
        if idle:
            for fd in went_away(list(idle)):
                self.nodes[idle[fd]].went_away(self.conns[idle[fd]])

    def send(self, index: int, conn) -> None:
        """Write the command to one node, or start its connect; a failure is that node's reply."""
        sock = socket_of(conn)
        try:
            if sock is None:
                sock = start_connect(self.nodes[index], conn)
                if sock is not None:
                    fd = sock.fileno()
                    self.connecting[index] = sock
                    self.by_fd[fd] = index
                    self.poller.register(fd, select.POLLOUT)
                    return
                sock = socket_of(conn)
            sock.sendall(self.packed[0])
        except OSError as error:
            self.fail(index, RedisConnectionError(f"error writing to the node: {error}"))
            return
        except Exception as error:  # noqa: BLE001 - a node's failure is a vote, not a crash
            self.fail(index, error)
            return
        fd = sock.fileno()
        self.by_fd[fd] = index
        self.poller.register(fd, select.POLLIN)

    def poll(self) -> None:
        """Read the replies (and finish the connects) as they come, until all are in or the deadline."""
        by_fd, poller = self.by_fd, self.poller
        while by_fd:
            events = poller.poll(max((self.deadline - time.monotonic()) * 1000.0, 0.0))
            if not events:
                return
            for fd, _ in events:
                if self._ready(fd, by_fd[fd]):
                    del by_fd[fd]
                    poller.unregister(fd)

    def _ready(self, fd: int, index: int) -> bool:
        """Act on a socket that is ready; True when that node's reply is final."""
        conn = self.conns[index]
        try:
            if index in self.connecting:
                finish_connect(self.nodes[index], conn, self.connecting.pop(index), self.deadline - time.monotonic())
                _send(conn, self.packed)
                self.poller.modify(fd, select.POLLIN)
                return False
            reply = read_available(conn)
            if reply is INCOMPLETE:
                return False  # part of the reply: the rest is polled for, within the round's deadline
            self.replies[index] = reply
        except NoScriptError as error:
            self.replies[index] = error
            if index not in self.retried:
                # The node restarted and forgot the script: EVAL sends the text and caches it again.
                self.retried.add(index)
                try:
                    _send(conn, pack_eval(self.script, self.keys, self.argv))
                    return False
                except Exception as send_error:  # noqa: BLE001
                    conn.disconnect()
                    self.replies[index] = send_error
        except ResponseError as error:
            self.replies[index] = error
        except OSError as error:  # a reset connection comes through as a bare OSError
            self.fail(index, RedisConnectionError(f"error reading from the node: {error}"))
        except Exception as error:  # noqa: BLE001
            self.fail(index, error)
        return True

    def fail(self, index: int, error: Exception) -> None:
        """A node's connection failed: close it, and after a reset the node's idle ones too."""
        self.conns[index].disconnect()
        if isinstance(error, RedisConnectionError):
            self.nodes[index].drop_idle()
        self.replies[index] = error

    def time_out(self) -> None:
        """Nodes still silent at the deadline: a connect is kept pending, a read's connection is closed."""
        for index in self.by_fd.values():
            sock = self.connecting.pop(index, None)
            name = self.nodes[index].name
            if sock is not None:
                keep_pending(self.nodes[index], self.conns[index], sock, self.started)
                self.conns[index] = None
                self.replies[index] = RedisTimeoutError(
                    f"{name}: connect did not finish within {self.timeout_s * 1000:.0f} ms"
                )
            else:
                self.conns[index].disconnect()
                self.replies[index] = RedisTimeoutError(f"{name} did not answer within {self.timeout_s * 1000:.0f} ms")

    def give_back(self, held: list | None) -> None:
        """Every connection back to its node, but the first refusing one when ``held`` asks for it."""
        nodes, replies = self.nodes, self.replies
        for index, conn in enumerate(self.conns):
            if conn is None:
                continue
            reply = replies[index]
            if held is not None and not held and type(reply) is int and reply <= 0 and socket_of(conn) is not None:
                held.append((index, conn))
            else:
                nodes[index].give(conn)


def block_on_signal(node: NodeConnections, conn, name: str, wait_s: float) -> None:
    """Wait up to ``wait_s`` on ``conn`` for a release to push to the lock's signal list.

    ``conn`` must be the connection of the refused attempt that registered the caller as a
    waiter: if that server restarted since, this connection is closed, the wait ends at once,
    and the caller tries the fresh server instead of waiting on one that never heard of it.
    The read waits at most ``wait_s`` plus the node timeout.
    """
    wait_s = max(wait_s, 0.001)
    try:
        if socket_of(conn) is None:
            return
        conn.send_command("BLPOP", signal_key(name), f"{wait_s:.3f}", check_health=False)
        conn.read_response(timeout=wait_s + node.timeout_s)
        # redis-py leaves the socket with Python's timeout after a read with its own: back to the
        # kernel's (still set to the node timeout), which costs no poll per call.
        socket_of(conn).settimeout(None)
    except (redis.RedisError, OSError):  # the caller retries the lock; a dead node only ends the wait
        conn.disconnect()
    except BaseException:
        # Not the node's: an exception from a signal handler (a script's alarm, Ctrl-C) comes
        # through, its connection closed (a BLPOP reply may still be owed on it).
        conn.disconnect()
        raise


sleep = time.sleep


def clean_up(error: BaseException, function: Callable, *args) -> None:
    """Undo what a failed acquire may have left, best effort: ``function(*args)``, its failures
    let go (``_async/io.py`` runs it as a task of its own after a cancellation)."""
    _quietly(function, *args)


def _quietly(function: Callable, *args) -> None:
    with contextlib.suppress(Exception):  # best effort: what it could not undo expires by its TTL
        function(*args)


def check_on_lost(on_lost: Callable) -> None:
    """Refuse a coroutine function: the blocking lock calls ``on_lost`` from its watchdog thread,
    where nothing could await it (the loss would never be reported)."""
    if inspect.iscoroutinefunction(on_lost) or inspect.iscoroutinefunction(type(on_lost).__call__):
        raise ValueError(
            "on_lost is a coroutine function: the blocking lock calls it from its watchdog thread and "
            "cannot await it; pass a plain function, or use the asyncio twin (AsyncRedisLock, AsyncRedlock)"
        )


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
