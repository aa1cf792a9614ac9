"""asyncio I/O for the locks in ``_async/locks.py``: the twin of ``_sync/io.py``, name for name (both by hand).

Every wait has a deadline on the loop's clock (``time.monotonic()``), enforced with
``asyncio.timeout_at`` around reads that redis-py itself does not time out: these connections
have no ``socket_timeout``, and every read is ``read_response()`` with no ``timeout``. Given one
(a number, or ``math.inf`` for none), redis-py returns None for any ``TimeoutError`` raised
during the read and keeps the connection, reply still owed, which a later command would then
read as its own answer; and on Python 3.11 ``asyncio.TimeoutError`` is the builtin
``TimeoutError``, which is also the ``OSError`` of a receive the kernel ended with ETIMEDOUT (TCP
gave up on a host that vanished), so even a broken connection read as None. Without ``timeout``
that error closes the connection and raises redis-py's ``TimeoutError``; a read our deadline
cancels closes it too (redis-py disconnects on any BaseException during a read).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import threading
import weakref
from collections import deque
from typing import Callable, Sequence

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from .._connections import CONNECT_BACKOFF_S, DEFAULT_SOCKET_TIMEOUT_S, ByClient, connection_kwargs, quiet, went_away
from .._core import Round, Script, node_name, pack_eval, pack_evalsha, server_key, signal_key
from .._redis_py import connect_quietly_async, stream_of, unread_bytes

Client = aioredis.Redis


class NodeConnections:
    """Idle asyncio connections to one node, per client and per event loop (see ``_connections.NodeConnections``).

    A connection belongs to the loop that opened it (its streams wait on that loop's futures): each
    loop takes and gives back only its own, kept in :data:`_loops`, and :func:`aclose_connections`
    closes them on their loop."""

    _registry = ByClient()

    def __init__(self, client: aioredis.Redis) -> None:
        kwargs = connection_kwargs(client)
        kwargs["retry"] = Retry(NoBackoff(), 0)
        self.timeout_s = float(kwargs["socket_timeout"] or DEFAULT_SOCKET_TIMEOUT_S)
        # Deadlines are enforced here; redis-py's per-write timeout would cost a task per send.
        kwargs["socket_timeout"] = None
        kwargs["socket_connect_timeout"] = None
        connection_class = client.connection_pool.connection_class
        self._factory = lambda: connection_class(**kwargs)
        self.name = node_name(client)
        self.server = server_key(client)  # which server, for Redlock's check (one per client)
        # The last Redlock node list, starting here, found to be distinct servers (AsyncRedlock.__init__).
        self.distinct_list: list | tuple = ()
        # (loop, its idle connections) of the last loop that used this node: one tuple, read and
        # replaced whole, so a thread running another loop never takes from this one's.
        self._here: tuple = (None, deque())
        # Per loop, (connection, connect task, loop-time start) of a connect a round left unfinished:
        # at most one a loop (a connect task runs on its loop, and only that loop may end it).
        self.pending: dict = {}

    @classmethod
    def of(cls, client: aioredis.Redis) -> "NodeConnections":
        entry = cls._registry.entries.get(id(client))
        if entry is not None and entry[0]() is client:
            return entry[1]
        return cls._registry.add(client, cls)

    def idle(self) -> deque:
        """The running loop's idle connections to this node."""
        loop = asyncio.get_running_loop()
        here = self._here
        if here[0] is not loop:
            with _loops_lock:
                here = (loop, _loops.setdefault(loop, {}).setdefault(self, deque()))
            self._here = here
        return here[1]

    async def take(self):
        """An idle connection of this loop, or a new one; one whose server went away is closed,
        with every other idle one, and handed out unconnected (see ``_connections.NodeConnections.take``)."""
        conn = self.take_unchecked()
        if conn.is_connected and not _quiet(conn):
            await self.went_away(conn)
        return conn

    def take_unchecked(self):
        """:meth:`take` without the check: the caller checks with :func:`_went_away` (one ``poll``
        for every node of a round), then calls :meth:`went_away` for each that did."""
        try:
            return self.idle().pop()
        except IndexError:
            return self._factory()

    async def went_away(self, conn) -> None:
        """``conn``'s server went away: close it and every idle connection of this node."""
        await _disconnect(conn)
        await self.drop_idle()

    def fresh(self):
        self.idle()  # registered on this loop: a connect it leaves pending is closed with the loop's
        return self._factory()

    def give(self, conn) -> None:
        self.idle().append(conn)

    async def drop_idle(self) -> None:
        """Close every idle connection of this loop: the node reset one, so the others point at a dead process."""
        loop, idle, emptied = asyncio.get_running_loop(), self.idle(), deque()
        with _loops_lock:
            _loops.setdefault(loop, {})[self] = emptied
        self._here = (loop, emptied)
        while idle:  # pop, not iterate: another task may take from the old deque meanwhile
            await _disconnect(idle.pop())


#: Every event loop's idle lock connections, per node. Kept by the loop, not by the node, so that
#: those of a client dropped while its loop runs (a strategy replaced) are closed with the others.
_loops: "weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[NodeConnections, deque]]" = (
    weakref.WeakKeyDictionary()
)
_loops_lock = threading.Lock()


async def aclose_connections() -> None:
    """Close the lock connections the running loop keeps idle, every node's (a dropped client's
    too), and a connect still pending on it. An asyncio connection cannot be closed once its loop
    is: await this last on a loop that ends, when no lock is in use on it (an ASGI lifespan's
    shutdown, the end of an ``asyncio.run``). A later acquire on this loop opens new ones."""
    loop = asyncio.get_running_loop()
    with _loops_lock:
        nodes = _loops.pop(loop, {})
    for node, idle in nodes.items():
        if node._here[0] is loop:
            node._here = (None, deque())
        pending = node.pending.pop(loop, None)
        if pending is not None:
            pending[1].cancel()
            await _disconnect(pending[0])
        while idle:
            await _disconnect(idle.pop())
    # A transport closes its socket on the loop's next turn: give it that turn before returning.
    await asyncio.sleep(0)


def _quiet(conn) -> bool:
    """Whether an idle connection has nothing to read and no hang-up. The loop may already have
    read the EOF a dead server left (the stream is at EOF, the transport closing); if not, the
    socket polls readable."""
    sock = _idle_socket(conn)
    return sock is not None and quiet(sock)


def _idle_socket(conn):
    """The socket still to poll of an idle connection, or None when the loop already saw that its
    server went away (or it has no socket)."""
    reader, transport = stream_of(conn)
    if transport.is_closing() or reader.at_eof() or unread_bytes(reader):
        return None
    return transport.get_extra_info("socket")


async def _disconnect(conn) -> None:
    # Closing a broken socket may fail; it is dropped either way.
    with contextlib.suppress(Exception):
        await conn.disconnect(nowait=True)


async def _read(conn, script: Script, keys: Sequence[str], argv: Sequence, deadline: float):
    """The reply to the script call sent on ``conn``, by ``deadline``; NOSCRIPT is answered with
    EVAL on the same connection under the same deadline."""
    async with asyncio.timeout_at(deadline):
        try:
            return await conn.read_response()
        except NoScriptError:
            await conn.send_packed_command(pack_eval(script, keys, argv), check_health=False)
            return await conn.read_response()


async def eval_one(
    node: NodeConnections, conn, script: Script, keys: Sequence[str], argv: Sequence, *, text: bool = False
):
    """Run a script on one node over ``conn``; connect, send and reply within ``node.timeout_s``."""
    deadline = asyncio.get_running_loop().time() + node.timeout_s
    try:
        if not conn.is_connected:
            async with asyncio.timeout_at(deadline):
                await connect_quietly_async(conn)
        packed = pack_eval(script, keys, argv) if text else pack_evalsha(script, keys, argv)
        await conn.send_packed_command(packed, check_health=False)
        return await _read(conn, script, keys, argv, deadline)
    except ResponseError:
        raise
    except TimeoutError as error:
        await _disconnect(conn)
        raise RedisTimeoutError(f"{node.name} did not answer within {node.timeout_s * 1000:.0f} ms") from error
    except RedisConnectionError:
        await _disconnect(conn)
        await node.drop_idle()
        raise
    except BaseException:
        await _disconnect(conn)
        raise


async def call_one(
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
    conn = node.fresh() if fresh else await node.take()
    try:
        return await eval_one(node, conn, script, keys, argv, text=text)
    finally:
        node.give(conn)


async def _connect_and_send(conn, packed: list, round_open: list) -> bool:
    """Connect, then send ``packed`` if the round that started this is still open (True if sent):
    a connect that completes after its round never leaves a reply owed."""
    await connect_quietly_async(conn)
    if round_open[0]:
        await conn.send_packed_command(packed, check_health=False)
        return True
    return False


def _pending_connect(node: NodeConnections, loop, started: float):
    """The asyncio version of ``_connections.pending_connect``, for ``loop``'s connect pending on
    ``node``: ``(conn, None)``, ``(None, error)`` or ``(None, None)``."""
    conn, task, since = node.pending[loop]
    if not task.done():
        if started - since < CONNECT_BACKOFF_S:
            return None, RedisTimeoutError(f"{node.name}: connect pending for {(started - since) * 1000:.0f} ms")
        del node.pending[loop]
        task.cancel()
        return None, None
    del node.pending[loop]
    if task.cancelled() or task.exception() is not None:
        node.give(conn)
        return None, task.exception() if not task.cancelled() else None
    return conn, None


async def eval_all(
    nodes: Sequence[NodeConnections],
    script: Script,
    keys: Sequence[str],
    argv: Sequence,
    timeout_s: float,
    held: list | None = None,
    fresh: bool = False,
    text: bool = False,
) -> list:
    """Write the script call to every node, then read every reply against one deadline (same
    contract as ``_sync/io.py``'s ``eval_all``, pending connects included). Nodes without a connection
    connect concurrently, inside the same deadline."""
    round_ = _Round(nodes, script, keys, argv, timeout_s, fresh)
    if text:  # EVAL, as for call_one
        round_.packed = pack_eval(script, keys, argv)
    try:
        await round_.take_all()
        for index, conn in enumerate(round_.conns):
            if conn is not None:
                await round_.send(index, conn)
        await round_.finish_connects()
        await round_.read_all()
    except BaseException:
        round_.round_open[0] = False  # cancelled: a connect that completes later sends nothing
        await round_.abandon()
        raise
    round_.give_back(held)
    return round_.replies


class _Round(Round):
    """One :func:`eval_all`, with the connect tasks it waits for."""

    def __init__(
        self,
        nodes: Sequence[NodeConnections],
        script: Script,
        keys: Sequence[str],
        argv: Sequence,
        timeout_s: float,
        fresh: bool = False,
    ) -> None:
        self.loop = asyncio.get_running_loop()
        super().__init__(nodes, script, keys, argv, timeout_s, started=self.loop.time(), fresh=fresh)
        self.connects: dict = {}
        self.round_open = [True]

    async def take_all(self) -> None:
        """A connection per node, as ``_sync/io.py``'s ``_Round.take_all``: a connect left pending once
        it completed, else an idle one (all checked in one ``poll``), else a new one."""
        idle: dict = {}
        for index, node in enumerate(self.nodes):
            conn = None
            # Only this loop's, and in a fresh round (a release's retry) too: another loop's dropped
            # here, or one more connect beside it, stayed open for the kernel's SYN retries.
            if node.pending and self.loop in node.pending:
                conn, self.replies[index] = _pending_connect(node, self.loop, self.started)
                if self.replies[index] is not None:
                    continue
            if conn is None:
                conn = node.fresh() if self.fresh else node.take_unchecked()
                if conn.is_connected:
                    sock = _idle_socket(conn)
                    if sock is None:
                        await node.went_away(conn)
                    else:
                        idle[sock.fileno()] = index
            self.conns[index] = conn
        if idle:
            for fd in went_away(list(idle)):
                await self.nodes[idle[fd]].went_away(self.conns[idle[fd]])

    async def send(self, index: int, conn) -> None:
        """Write the command to one node, or start its connect; a failure is that node's reply."""
        if not conn.is_connected:
            # As EVAL, not EVALSHA: a node this round connects to may be new (restarted) and lack the
            # script, and its NOSCRIPT would need one more round trip after the wait for every
            # connect, which a connect that never finishes (SYNs dropped) has taken to the deadline.
            packed = pack_eval(self.script, self.keys, self.argv)
            task = self.connects[index] = self.loop.create_task(_connect_and_send(conn, packed, self.round_open))
            # A connect can end after every round that could read it (one left pending, then never
            # asked for again; one the cancelled round no longer waits for): its error is read here,
            # so asyncio never reports it as never retrieved.
            task.add_done_callback(_retrieve)
            return
        try:
            await conn.send_packed_command(self.packed, check_health=False)
        except Exception as error:  # noqa: BLE001 - a node's failure is a vote, not a crash
            await self.fail(index, error)

    async def finish_connects(self) -> None:
        """Wait for the connects until the deadline; one still running stays pending on its node."""
        if not self.connects:
            return
        done, _ = await asyncio.wait(self.connects.values(), timeout=max(self.deadline - self.loop.time(), 0))
        self.round_open[0] = False
        for index, task in self.connects.items():
            conn = self.conns[index]
            name = self.nodes[index].name
            if task not in done:
                await self.keep_pending(index, conn, task)
                self.conns[index] = None
                self.replies[index] = RedisTimeoutError(
                    f"{name}: connect did not finish within {self.timeout_s * 1000:.0f} ms"
                )
                continue
            try:
                sent = task.result()
            except Exception as error:  # noqa: BLE001
                await self.fail(index, error)
            else:
                if not sent:
                    self.replies[index] = RedisTimeoutError(f"{name}: connected too late")

    async def keep_pending(self, index: int, conn, task: asyncio.Task) -> None:
        """Keep the node's unfinished connect for this loop's later rounds, unless another round on
        this loop kept one meanwhile: then this one is ended (one is all a later round needs)."""
        pending = self.nodes[index].pending
        if self.loop in pending:
            task.cancel()
            await _disconnect(conn)
        else:
            pending[self.loop] = (conn, task, self.started)

    async def read_all(self) -> None:
        """Read each node's reply until the deadline; a connection that timed out is closed."""
        for index, conn in enumerate(self.conns):
            if conn is None or self.replies[index] is not None:
                continue
            try:
                self.replies[index] = await _read(conn, self.script, self.keys, self.argv, self.deadline)
            except ResponseError as error:
                self.replies[index] = error
            except TimeoutError:
                await _disconnect(conn)
                self.replies[index] = RedisTimeoutError(
                    f"{self.nodes[index].name} did not answer within {self.timeout_s * 1000:.0f} ms"
                )
            except Exception as error:  # noqa: BLE001
                await self.fail(index, error)

    async def fail(self, index: int, error: Exception) -> None:
        """A node's connection failed: close it, and after a reset the node's idle ones too."""
        await _disconnect(self.conns[index])
        if isinstance(error, RedisConnectionError):
            await self.nodes[index].drop_idle()
        self.replies[index] = error

    async def abandon(self) -> None:
        """The round was cancelled: a connection whose reply was read goes back to its node, one whose
        reply is still owed (or that may have sent nothing) is closed, and a connect still running
        gives its connection back to its node once it has connected (it sends nothing now)."""
        for index, task in self.connects.items():
            if not task.done():
                task.add_done_callback(functools.partial(_connected_late, self.nodes[index], self.conns[index]))
                self.conns[index] = None
        for index, conn in enumerate(self.conns):
            if conn is None:
                continue
            if self.replies[index] is None:
                await _disconnect(conn)
            self.nodes[index].give(conn)

    def give_back(self, held: list | None) -> None:
        """Every connection back to its node, but the first refusing one when ``held`` asks for it."""
        for index, conn in enumerate(self.conns):
            if conn is None:
                continue
            reply = self.replies[index]
            if held is not None and not held and conn.is_connected and type(reply) is int and reply <= 0:
                held.append((index, conn))
            else:
                self.nodes[index].give(conn)


def _retrieve(task: asyncio.Task) -> None:
    if not task.cancelled():
        task.exception()


def _connected_late(node: NodeConnections, conn, task: asyncio.Task) -> None:
    """A connect its cancelled round stopped waiting for has ended: its connection, connected and
    unused, is the node's; a failed one was closed by redis-py."""
    if not task.cancelled() and task.exception() is None and conn.is_connected:
        node.give(conn)


async def block_on_signal(node: NodeConnections, conn, name: str, wait_s: float) -> None:
    """Wait up to ``wait_s`` on ``conn`` for a release to push to the lock's signal list (same
    contract as ``_sync/io.py``'s ``block_on_signal``)."""
    wait_s = max(wait_s, 0.001)
    try:
        if not conn.is_connected:
            return
        async with asyncio.timeout(wait_s + node.timeout_s):
            await conn.send_command("BLPOP", signal_key(name), f"{wait_s:.3f}", check_health=False)
            await conn.read_response()
    except Exception:  # noqa: BLE001 - the caller retries the lock; a dead node only ends the wait
        await _disconnect(conn)


sleep = asyncio.sleep

#: Clean-ups running after a cancellation: the loop keeps only a weak reference to a task.
_cleanups: set = set()


async def clean_up(error: BaseException, function: Callable, *args) -> None:
    """Undo what a failed acquire may have left, best effort: ``await function(*args)``, its
    failures let go. After a cancellation (``error``) it runs as a task of its own instead, so the
    cancellation comes through at once (``_sync/io.py``: inline)."""
    if isinstance(error, asyncio.CancelledError):
        task = asyncio.get_running_loop().create_task(_quietly(function, *args))
        _cleanups.add(task)
        task.add_done_callback(_cleanups.discard)
    else:
        await _quietly(function, *args)


async def _quietly(function: Callable, *args) -> None:
    with contextlib.suppress(Exception):  # best effort: what it could not undo expires by its TTL
        await function(*args)


def check_on_lost(on_lost: Callable) -> None:
    """Any callable will do: :func:`call` awaits what it returns (``_sync/io.py`` refuses a
    coroutine function)."""


async def call(function: Callable, *args) -> None:
    result = function(*args)
    if inspect.isawaitable(result):
        await result


class Watchdog:
    """Runs ``body(watchdog)`` as a task on the running loop until :meth:`stop`."""

    def __init__(self, name: str, body: Callable) -> None:
        self._stopped = asyncio.Event()
        self._task = asyncio.get_running_loop().create_task(body(self), name=name)

    async def wait(self, seconds: float) -> bool:
        """Sleep up to ``seconds``; True if :meth:`stop` was called meanwhile."""
        try:
            async with asyncio.timeout(max(seconds, 0)):
                await self._stopped.wait()
        except TimeoutError:
            return False
        return True

    def stopped(self) -> bool:
        return self._stopped.is_set()

    async def stop(self) -> None:
        self._stopped.set()
        if self._task is not asyncio.current_task():
            await self._task
