"""The blocking locks: :class:`RedisLock` (one node) and :class:`Redlock` (a majority of N).

See the package docstring for what they guarantee. Both talk to Redis through :class:`_Node`,
a few raw redis-py connections per client kept by the library: an operation packs its command
once, writes it to every node, and only then reads the replies against one deadline, so a
Redlock round costs one round trip and a silent node costs at most the per-node timeout.
"""
from __future__ import annotations

import os
import random
import select
import threading
import time
import weakref
from collections import deque
from typing import Callable, Sequence

import redis
from redis.exceptions import NoScriptError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError
from redis.retry import Retry
from redis.backoff import NoBackoff

from ._core import (
    ACQUIRE,
    pack_evalsha,
    EXTEND,
    RAISE_FENCE,
    RELEASE,
    SIGNAL_LIFETIME_MS,
    Lease,
    LockError,
    LockLost,
    NotAcquired,
    NotOwned,
    QuorumUnavailable,
    Script,
    check_arguments,
    confirmations,
    fence_and_laggards,
    granted_votes,
    majority_denies,
    refused_round,
    validity_ms,
    default_node_timeout_ms,
    drift_ms,
    fence_key,
    new_token,
    node_name,
    signal_key,
    waiting_key,
    handoff_key,
    HANDOFF_WINDOW_MS,
)

# A connect to a node that is down is refused at once; one to a frozen node is accepted by the
# kernel and then hangs, so connecting must not wait longer than a lock round may.
CONNECT_TIMEOUT_S = 0.1


class _Node:
    """Idle connections to one Redis node, shared by every lock built on the same client.

    The library keeps its own connections rather than borrowing from the client's pool so that
    connecting sends no handshake commands (a frozen node could stall them) and taking one costs
    a deque pop. Safe across threads (deque append/pop are atomic) and across fork (an at-fork
    hook makes a child drop the parent's sockets instead of sharing them).
    """

    _registry: "weakref.WeakKeyDictionary[redis.Redis, _Node]" = weakref.WeakKeyDictionary()
    _registry_lock = threading.Lock()

    def __init__(self, client: redis.Redis) -> None:
        pool = client.connection_pool
        kwargs = dict(pool.connection_kwargs)
        for key in ("maint_notifications_config", "maint_notifications_pool_handler", "orig_host_address",
                    "orig_socket_timeout", "orig_socket_connect_timeout"):
            kwargs.pop(key, None)
        # RESP2 and no CLIENT SETINFO: connecting then costs no round trip a frozen node could stall.
        kwargs["driver_info"] = None
        kwargs["protocol"] = 2
        # The lock retries by its own rules; redis-py's reconnect backoff would stall a round for seconds.
        kwargs["retry"] = Retry(NoBackoff(), 0)
        connect_timeout = kwargs.get("socket_connect_timeout")
        kwargs["socket_connect_timeout"] = min(connect_timeout or CONNECT_TIMEOUT_S, CONNECT_TIMEOUT_S)
        self._factory = lambda: pool.connection_class(**kwargs)
        self.name = node_name(client)
        self._idle: deque = deque()

    @classmethod
    def of(cls, client: redis.Redis) -> "_Node":
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

    def take(self):
        try:
            return self._idle.pop()
        except IndexError:
            return self._factory()

    def give(self, conn) -> None:
        self._idle.append(conn)


os.register_at_fork(after_in_child=_Node._forget_after_fork)


def _connect_within(conn, timeout_s: float) -> None:
    """Connect a closed connection, letting any handshake (AUTH, SELECT) wait at most ``timeout_s``."""
    socket_timeout = conn.socket_timeout
    conn.socket_timeout = max(timeout_s, 0.001)
    try:
        conn.connect()
    finally:
        conn.socket_timeout = socket_timeout
    conn._sock.settimeout(socket_timeout)


def eval_one(node: _Node, script: Script, keys: Sequence[str], argv: Sequence, timeout_s: float | None = None):
    """Run a script on one node and return its reply (exceptions propagate)."""
    conn = node.take()
    try:
        conn.send_packed_command(pack_evalsha(conn, script, keys, argv), check_health=False)
        try:
            return conn.read_response() if timeout_s is None else conn.read_response(timeout=timeout_s)
        except NoScriptError:
            conn.send_command("EVAL", script.text, len(keys), *keys, *argv, check_health=False)
            return conn.read_response()
    finally:
        node.give(conn)


def eval_all(nodes: Sequence[_Node], script: Script, keys: Sequence[str], argv: Sequence,
             timeout_s: float) -> list:
    """Run a script on every node at once: write to all, then read all against one deadline.

    Returns one entry per node: the reply, or the exception that node produced (refused,
    timed out, script error). A node that did not answer in time has its connection closed, so a
    late reply can never be read as the answer to a later command.
    """
    deadline = time.monotonic() + timeout_s
    packed = None
    pending: list = []
    for node in nodes:
        conn = node.take()
        try:
            if conn._sock is None:
                _connect_within(conn, deadline - time.monotonic())
            if packed is None:
                packed = pack_evalsha(conn, script, keys, argv)
            conn.send_packed_command(packed, check_health=False)
        except Exception as error:  # noqa: BLE001 - a node's failure is a vote, not a crash
            conn.disconnect()
            node.give(conn)
            pending.append(error)
        else:
            pending.append(conn)
    # One poll over every socket instead of a timed read per node: replies are read in the
    # order they arrive, and a socket timeout never has to be set and reset on each read.
    replies: list = [None] * len(nodes)
    waiting: dict[int, int] = {}
    poller = select.poll()
    for index, conn in enumerate(pending):
        if isinstance(conn, Exception):
            replies[index] = conn
        else:
            fd = conn._sock.fileno()
            waiting[fd] = index
            poller.register(fd, select.POLLIN)
    retry: list[int] = []
    while waiting:
        events = poller.poll(max((deadline - time.monotonic()) * 1000.0, 0.0))
        if not events:
            break
        for fd, _ in events:
            index = waiting.pop(fd)
            poller.unregister(fd)
            conn = pending[index]
            try:
                replies[index] = conn.read_response()
            except NoScriptError as error:
                replies[index] = error
                retry.append(index)
            except ResponseError as error:
                replies[index] = error
            except Exception as error:  # noqa: BLE001
                conn.disconnect()
                replies[index] = error
    for index in waiting.values():
        pending[index].disconnect()
        replies[index] = RedisTimeoutError(f"{nodes[index].name} did not answer within {timeout_s * 1000:.0f} ms")
    for node, conn in zip(nodes, pending):
        if not isinstance(conn, Exception):
            node.give(conn)
    if retry:
        # The node restarted and forgot the script: EVAL sends the text and caches it again.
        for index in retry:
            try:
                replies[index] = eval_one(nodes[index], script, keys, argv,
                                          timeout_s=max(deadline - time.monotonic(), 0.0001))
            except Exception as error:  # noqa: BLE001
                replies[index] = error
    return replies


def block_on_signal(node: _Node, name: str, wait_s: float) -> None:
    """Wait up to ``wait_s`` for a release on ``node`` to push to the lock's signal list."""
    wait_s = max(wait_s, 0.001)
    conn = node.take()
    try:
        conn.send_command("BLPOP", signal_key(name), f"{wait_s:.3f}", check_health=False)
        conn.read_response(timeout=wait_s + 0.25)
    except Exception:  # noqa: BLE001 - the caller retries the lock; a dead node only ends the wait
        conn.disconnect()
        time.sleep(min(wait_s, 0.01))
    finally:
        node.give(conn)


class _Watchdog(threading.Thread):
    """Renews the lease every ttl/3 until stopped, at most ``max_renewals`` times; on a failed
    renewal, or when the bound runs out and the lease expires while still held, it reports the
    loss to the lock and stops."""

    def __init__(self, lock: "_BaseLock") -> None:
        super().__init__(name=f"lock-watchdog:{lock.name}", daemon=True)
        self.lock = lock
        self.stopped = threading.Event()

    def run(self) -> None:
        lock = self.lock
        interval = lock.ttl_ms / 3000.0
        renewals = 0
        while not self.stopped.wait(interval):
            if renewals >= lock.max_renewals:
                lease = lock._lease
                if lease is not None and not self.stopped.wait(max(lease.valid_until - time.monotonic(), 0)):
                    lock._mark_lost(None, f"the lease expired after the watchdog's {renewals} renewals")
                return
            try:
                lock._renew()
            except Exception as error:  # noqa: BLE001 - every failure is reported, none swallowed
                if not self.stopped.is_set():
                    lock._mark_lost(error, "the watchdog could not renew the lease")
                return
            renewals += 1


class _BaseLock:
    """What both blocking locks share: waiting, the lease, extension, the watchdog, ``with``."""

    quorum: int
    # Per-acquisition state starts at these class defaults: a lock is built once per purchase,
    # so its constructor stays short.
    _lease: Lease | None = None
    _lost: LockLost | None = None
    _extensions = 0
    _watchdog: _Watchdog | None = None

    def __init__(self, name: str, *, ttl_ms: int, timeout_ms: int, wait: str, retry_delay_ms: float,
                 watchdog: bool, max_renewals: int, on_lost: Callable[[Lease, LockLost], None] | None,
                 max_extensions: int) -> None:
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
        waiting, handoff = waiting_key(name), handoff_key(name)
        self._keys = (name, fence_key(name), waiting, handoff)
        self._release_keys = (name, signal_key(name), waiting, handoff)
        self._drift_ms = drift_ms(self.ttl_ms)

    # Subclasses provide: _attempt(waiter) -> (Lease | None, hint_ms, split), _unlock(token) -> bool,
    # _extend_nodes(lease, ttl_ms) -> Lease, _wait_for_release(wait_s), node_names().

    @property
    def lease(self) -> Lease | None:
        return self._lease

    @property
    def lost(self) -> LockLost | None:
        return self._lost

    def _error(self, cls: type[LockError], message: str) -> LockError:
        return cls(message, name=self.name, nodes=self.node_names())

    def acquire(self) -> Lease:
        """Take the lock, waiting up to ``timeout_ms``; returns the :class:`Lease`."""
        if self._lease is not None:
            raise self._error(LockError, "this lock object already holds a lease; make one per acquisition")
        deadline = time.monotonic() + self.timeout_ms / 1000.0
        waiter = False
        while True:
            lease, hint_ms, split = self._attempt(waiter)
            if lease is not None:
                self._lease, self._lost, self._extensions = lease, None, 0
                if self.watchdog:
                    self._watchdog = _Watchdog(self)
                    self._watchdog.start()
                return lease
            waiter = True
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise self._error(NotAcquired, f"not acquired within {self.timeout_ms} ms")
            if self.wait == "poll" or split:
                # A split vote means every contender failed at once: a random pause desynchronizes them.
                time.sleep(min(remaining, random.uniform(0.5, 1.0) * self.retry_delay_ms / 1000.0))
            else:
                # Wake on the holder's release, or when it would have expired if it crashed.
                self._wait_for_release(min(remaining, (hint_ms + 1) / 1000.0 if hint_ms > 0 else 0.01))

    def release(self) -> None:
        """Give the lock up; raises :class:`NotOwned` if this token no longer holds it."""
        lease = self._lease
        if lease is None:
            raise self._error(NotOwned, "release of a lock this object does not hold")
        self._stop_watchdog()
        self._lease = None
        if not self._unlock(lease.token):
            raise self._error(NotOwned, "release refused: the lease expired or another holder took over")

    def extend(self, *, ttl_ms: int | None = None) -> Lease:
        """Reset the lease to ``ttl_ms`` (default: the lock's TTL) from now; at most ``max_extensions`` times."""
        if self._extensions >= self.max_extensions:
            raise self._error(LockError, f"extension limit reached ({self.max_extensions})")
        lease = self._renew(ttl_ms)
        self._extensions += 1
        return lease

    def _renew(self, ttl_ms: int | None = None) -> Lease:
        lease = self._lease
        if lease is None:
            raise self._error(NotOwned, "extend of a lock this object does not hold")
        self._lease = self._extend_nodes(lease, int(ttl_ms or self.ttl_ms))
        return self._lease

    def _mark_lost(self, cause: BaseException | None, message: str) -> None:
        lost = self._error(LockLost, message)
        lost.__cause__ = cause
        self._lost = lost
        if self.on_lost is not None and self._lease is not None:
            self.on_lost(self._lease, lost)

    def _stop_watchdog(self) -> None:
        watchdog, self._watchdog = self._watchdog, None
        if watchdog is not None:
            watchdog.stopped.set()
            if watchdog is not threading.current_thread():
                watchdog.join()

    def __enter__(self) -> Lease:
        return self.acquire()

    def __exit__(self, exc_type, exc, tb) -> None:
        self._stop_watchdog()
        lost = self._lost
        if lost is not None:
            try:
                self.release()
            except LockError:
                pass
            raise lost
        lease = self._lease
        try:
            self.release()
        except NotOwned as error:
            raise self._error(LockLost, "the lease expired while the block held it") from error
        overrun_ms = -lease.remaining_ms()
        if overrun_ms > 0:
            # Redis may not have expired the key yet, but the safety margin was spent: another
            # holder could have been granted, so the block's writes were unprotected by time.
            raise self._error(LockLost, f"the block ran {overrun_ms:.0f} ms past the lease's validity")


class RedisLock(_BaseLock):
    """A lock on one Redis node: ``SET NX PX`` plus a fencing ``INCR`` in one script.

    >>> lock = RedisLock(client, "flashsale:lock:SKU1", ttl_ms=10_000, timeout_ms=5_000)
    >>> with lock as lease:
    ...     write_with_fence(lease.fence)
    """

    quorum = 1

    def __init__(self, client: redis.Redis, name: str, *, ttl_ms: int = 10_000, timeout_ms: int = 5_000,
                 wait: str = "notify", retry_delay_ms: float = 10.0, watchdog: bool = False,
                 max_renewals: int = 1000, on_lost: Callable[[Lease, LockLost], None] | None = None,
                 max_extensions: int = 10) -> None:
        super().__init__(name, ttl_ms=ttl_ms, timeout_ms=timeout_ms, wait=wait, retry_delay_ms=retry_delay_ms,
                         watchdog=watchdog, max_renewals=max_renewals, on_lost=on_lost,
                         max_extensions=max_extensions)
        self.client = client
        self._node = _Node.of(client)

    def node_names(self) -> list[str]:
        return [self._node.name]

    def _attempt(self, waiter: bool) -> tuple[Lease | None, float, bool]:
        token = new_token()
        start = time.monotonic()
        try:
            reply = eval_one(self._node, ACQUIRE, self._keys, (token, self.ttl_ms, "1" if waiter else "0"))
        except redis.RedisError as error:
            raise self._error(QuorumUnavailable, f"the node did not answer: {error}") from error
        if reply > 0:
            return Lease(self.name, token, reply, start + (self.ttl_ms - self._drift_ms) / 1000.0), 0, False
        return None, -reply, False

    def _unlock(self, token: str) -> bool:
        try:
            reply = eval_one(self._node, RELEASE, self._release_keys, (token, SIGNAL_LIFETIME_MS, HANDOFF_WINDOW_MS))
            return reply == 1
        except redis.RedisError as error:
            raise self._error(NotOwned, f"release could not reach the node: {error}") from error

    def _extend_nodes(self, lease: Lease, ttl_ms: int) -> Lease:
        start = time.monotonic()
        try:
            extended = eval_one(self._node, EXTEND, (self.name,), (lease.token, ttl_ms)) == 1
        except redis.RedisError as error:
            raise self._error(NotOwned, f"extend could not reach the node: {error}") from error
        if not extended:
            raise self._error(NotOwned, "extend refused: the lease expired or another holder took over")
        return Lease(self.name, lease.token, lease.fence, start + (ttl_ms - drift_ms(ttl_ms)) / 1000.0)

    def _wait_for_release(self, wait_s: float) -> None:
        block_on_signal(self._node, self.name, wait_s)


class Redlock(_BaseLock):
    """The Redlock algorithm over N independent Redis masters, with quorum-monotonic fences.

    >>> lock = Redlock([c1, c2, c3, c4, c5], "flashsale:lock:SKU1", ttl_ms=10_000, timeout_ms=5_000)
    >>> with lock as lease:
    ...     write_with_fence(lease.fence)
    """

    def __init__(self, clients: Sequence[redis.Redis], name: str, *, ttl_ms: int = 10_000,
                 timeout_ms: int = 5_000, node_timeout_ms: float | None = None, wait: str = "notify",
                 retry_delay_ms: float = 10.0, watchdog: bool = False, max_renewals: int = 1000,
                 on_lost: Callable[[Lease, LockLost], None] | None = None, max_extensions: int = 10) -> None:
        super().__init__(name, ttl_ms=ttl_ms, timeout_ms=timeout_ms, wait=wait, retry_delay_ms=retry_delay_ms,
                         watchdog=watchdog, max_renewals=max_renewals, on_lost=on_lost,
                         max_extensions=max_extensions)
        if not clients:
            raise ValueError("Redlock needs at least one node client")
        self.clients = list(clients)
        self._nodes = [_Node.of(client) for client in self.clients]
        self.quorum = len(self._nodes) // 2 + 1
        self._signal_node = self._nodes[0]
        self.node_timeout_s = (node_timeout_ms or default_node_timeout_ms(self.ttl_ms)) / 1000.0

    def node_names(self) -> list[str]:
        return [node.name for node in self._nodes]

    def _attempt(self, waiter: bool) -> tuple[Lease | None, float, bool]:
        token = new_token()
        start = time.monotonic()
        argv = (token, self.ttl_ms, "1" if waiter else "0")
        replies = eval_all(self._nodes, ACQUIRE, self._keys, argv, self.node_timeout_s)
        granted = granted_votes(replies)
        if len(granted) >= self.quorum:
            fence, laggards = fence_and_laggards(granted)
            confirmed = len(granted) - len(laggards)
            if laggards:
                # Write the fence back before granting so any later majority sees it (see the package docstring).
                raised = eval_all([self._nodes[i] for i in laggards], RAISE_FENCE, self._keys[:2],
                                  (token, fence), self.node_timeout_s)
                confirmed += confirmations(raised)
            validity = validity_ms(self.ttl_ms, start, self._drift_ms)
            if confirmed >= self.quorum and validity > 0:
                return Lease(self.name, token, fence, start + validity / 1000.0), 0, False
        self._unlock_all(token)
        answered, hint_ms, unavailable = refused_round(replies, self.quorum, self.node_names())
        if answered:
            self._signal_node = self._nodes[answered[0]]
        if unavailable:
            raise self._error(QuorumUnavailable, unavailable)
        return None, hint_ms, bool(granted)

    def _unlock_all(self, token: str) -> list:
        return eval_all(self._nodes, RELEASE, self._release_keys, (token, SIGNAL_LIFETIME_MS, HANDOFF_WINDOW_MS),
                        self.node_timeout_s)

    def _unlock(self, token: str) -> bool:
        return not majority_denies(self._unlock_all(token), self.quorum)

    def _extend_nodes(self, lease: Lease, ttl_ms: int) -> Lease:
        start = time.monotonic()
        if start >= lease.valid_until:
            raise self._error(NotOwned, "extend after the lease's validity ended")
        replies = eval_all(self._nodes, EXTEND, (self.name,), (lease.token, ttl_ms), self.node_timeout_s)
        extended = confirmations(replies)
        end = time.monotonic()
        validity = validity_ms(ttl_ms, start, drift_ms(ttl_ms), end)
        if extended < self.quorum or end >= lease.valid_until or validity <= 0:
            raise self._error(NotOwned, f"extend confirmed by {extended} of {len(self._nodes)} nodes "
                                        f"within the validity, {self.quorum} needed")
        return Lease(self.name, lease.token, lease.fence, start + validity / 1000.0)

    def _wait_for_release(self, wait_s: float) -> None:
        # Every release signals every node; waiting on the first live one keeps waiters in one queue.
        block_on_signal(self._signal_node, self.name, wait_s)
