"""The asyncio twins of :mod:`inventory.locks.sync`: :class:`AsyncRedisLock`, :class:`AsyncRedlock`.

Same arguments, scripts, arithmetic and guarantees (see the package docstring), on
``redis.asyncio`` clients; ``async with lock as lease:``. The watchdog is a task on the running
loop, and ``on_lost`` may be a plain function or a coroutine function.
"""
from __future__ import annotations

import asyncio
import inspect
import random
import time
import weakref
from collections import deque
from typing import Callable, Sequence

import redis
import redis.asyncio as aioredis
from redis.exceptions import NoScriptError, ResponseError
from redis.asyncio.retry import Retry
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
from .sync import CONNECT_TIMEOUT_S

__all__ = ["AsyncRedisLock", "AsyncRedlock"]


class _AsyncNode:
    """Idle asyncio connections to one node, per client and per event loop (see ``sync._Node``)."""

    _registry: "weakref.WeakKeyDictionary[aioredis.Redis, _AsyncNode]" = weakref.WeakKeyDictionary()

    def __init__(self, client: aioredis.Redis) -> None:
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
        self._loop = None

    @classmethod
    def of(cls, client: aioredis.Redis) -> "_AsyncNode":
        node = cls._registry.get(client)
        if node is None:
            node = cls._registry[client] = cls(client)
        return node

    def take(self):
        loop = asyncio.get_running_loop()
        if self._loop is not loop:
            self._idle = deque()
            self._loop = loop
        try:
            return self._idle.pop()
        except IndexError:
            return self._factory()

    def give(self, conn) -> None:
        self._idle.append(conn)


def _pack(conn, script: Script, keys: Sequence[str], argv: Sequence) -> list:
    return pack_evalsha(conn, script, keys, argv)


async def _disconnect(conn) -> None:
    try:
        await conn.disconnect()
    except Exception:  # noqa: BLE001 - closing a broken socket may fail; it is dropped either way
        pass


async def eval_one(node: _AsyncNode, script: Script, keys: Sequence[str], argv: Sequence,
                   timeout_s: float | None = None):
    conn = node.take()
    try:
        await conn.send_packed_command(_pack(conn, script, keys, argv), check_health=False)
        try:
            return await conn.read_response(timeout=timeout_s)
        except NoScriptError:
            await conn.send_command("EVAL", script.text, len(keys), *keys, *argv, check_health=False)
            return await conn.read_response()
    except BaseException:
        await _disconnect(conn)
        raise
    finally:
        node.give(conn)


async def eval_all(nodes: Sequence[_AsyncNode], script: Script, keys: Sequence[str], argv: Sequence,
                   timeout_s: float) -> list:
    """Write the script call to every node, then read every reply against one deadline."""
    deadline = time.monotonic() + timeout_s
    packed = None
    pending: list = []
    for node in nodes:
        conn = node.take()
        try:
            if packed is None:
                packed = _pack(conn, script, keys, argv)
            async with asyncio.timeout(max(deadline - time.monotonic(), 0.0001)):
                await conn.send_packed_command(packed, check_health=False)
        except Exception as error:  # noqa: BLE001 - a node's failure is a vote, not a crash
            await _disconnect(conn)
            node.give(conn)
            pending.append(error)
        else:
            pending.append(conn)
    replies: list = []
    retry: list[int] = []
    for index, (node, conn) in enumerate(zip(nodes, pending)):
        if isinstance(conn, Exception):
            replies.append(conn)
            continue
        try:
            replies.append(await conn.read_response(timeout=max(deadline - time.monotonic(), 0.0001)))
        except NoScriptError as error:
            replies.append(error)
            retry.append(index)
        except ResponseError as error:
            replies.append(error)
        except Exception as error:  # noqa: BLE001
            await _disconnect(conn)
            replies.append(error)
        node.give(conn)
    for index in retry:
        try:
            replies[index] = await eval_one(nodes[index], script, keys, argv,
                                            timeout_s=max(deadline - time.monotonic(), 0.0001))
        except Exception as error:  # noqa: BLE001
            replies[index] = error
    return replies


async def block_on_signal(node: _AsyncNode, name: str, wait_s: float) -> None:
    wait_s = max(wait_s, 0.001)
    conn = node.take()
    try:
        await conn.send_command("BLPOP", signal_key(name), f"{wait_s:.3f}", check_health=False)
        await conn.read_response(timeout=wait_s + 0.25)
    except Exception:  # noqa: BLE001 - the caller retries the lock; a dead node only ends the wait
        await _disconnect(conn)
        await asyncio.sleep(min(wait_s, 0.01))
    finally:
        node.give(conn)


class _AsyncBaseLock:
    """The asyncio twin of ``sync._BaseLock``."""

    quorum: int

    def __init__(self, name: str, *, ttl_ms: int, timeout_ms: int, wait: str, retry_delay_ms: float,
                 watchdog: bool, max_renewals: int, on_lost: Callable | None, max_extensions: int) -> None:
        check_arguments(name, ttl_ms, timeout_ms)
        if wait not in ("notify", "poll"):
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
        self._lease: Lease | None = None
        self._lost: LockLost | None = None
        self._extensions = 0
        self._watchdog: asyncio.Task | None = None

    @property
    def lease(self) -> Lease | None:
        return self._lease

    @property
    def lost(self) -> LockLost | None:
        return self._lost

    def _error(self, cls: type[LockError], message: str) -> LockError:
        return cls(message, name=self.name, nodes=self.node_names())

    async def acquire(self) -> Lease:
        if self._lease is not None:
            raise self._error(LockError, "this lock object already holds a lease; make one per acquisition")
        deadline = time.monotonic() + self.timeout_ms / 1000.0
        waiter = False
        while True:
            lease, hint_ms, split = await self._attempt(waiter)
            if lease is not None:
                self._lease, self._lost, self._extensions = lease, None, 0
                if self.watchdog:
                    self._watchdog = asyncio.create_task(self._watch(), name=f"lock-watchdog:{self.name}")
                return lease
            waiter = True
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise self._error(NotAcquired, f"not acquired within {self.timeout_ms} ms")
            if self.wait == "poll" or split:
                await asyncio.sleep(min(remaining, random.uniform(0.5, 1.0) * self.retry_delay_ms / 1000.0))
            else:
                await self._wait_for_release(min(remaining, (hint_ms + 1) / 1000.0 if hint_ms > 0 else 0.01))

    async def release(self) -> None:
        lease = self._lease
        if lease is None:
            raise self._error(NotOwned, "release of a lock this object does not hold")
        await self._stop_watchdog()
        self._lease = None
        if not await self._unlock(lease.token):
            raise self._error(NotOwned, "release refused: the lease expired or another holder took over")

    async def extend(self, *, ttl_ms: int | None = None) -> Lease:
        if self._extensions >= self.max_extensions:
            raise self._error(LockError, f"extension limit reached ({self.max_extensions})")
        lease = await self._renew(ttl_ms)
        self._extensions += 1
        return lease

    async def _renew(self, ttl_ms: int | None = None) -> Lease:
        lease = self._lease
        if lease is None:
            raise self._error(NotOwned, "extend of a lock this object does not hold")
        self._lease = await self._extend_nodes(lease, int(ttl_ms or self.ttl_ms))
        return self._lease

    async def _watch(self) -> None:
        interval = self.ttl_ms / 3000.0
        for renewals in range(self.max_renewals):
            await asyncio.sleep(interval)
            try:
                await self._renew()
            except Exception as error:  # noqa: BLE001 - every failure is reported, none swallowed
                await self._mark_lost(error, "the watchdog could not renew the lease")
                return
        lease = self._lease
        if lease is not None:
            await asyncio.sleep(max(lease.valid_until - time.monotonic(), 0))
            await self._mark_lost(None, f"the lease expired after the watchdog's {self.max_renewals} renewals")

    async def _mark_lost(self, cause: BaseException | None, message: str) -> None:
        lost = self._error(LockLost, message)
        lost.__cause__ = cause
        self._lost = lost
        if self.on_lost is not None and self._lease is not None:
            result = self.on_lost(self._lease, lost)
            if inspect.isawaitable(result):
                await result

    async def _stop_watchdog(self) -> None:
        task, self._watchdog = self._watchdog, None
        if task is not None and task is not asyncio.current_task():
            task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                pass

    async def __aenter__(self) -> Lease:
        return await self.acquire()

    async def __aexit__(self, exc_type, exc, tb) -> None:
        await self._stop_watchdog()
        lost = self._lost
        if lost is not None:
            try:
                await self.release()
            except LockError:
                pass
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


class AsyncRedisLock(_AsyncBaseLock):
    """The asyncio twin of :class:`inventory.locks.RedisLock`."""

    quorum = 1

    def __init__(self, client: aioredis.Redis, name: str, *, ttl_ms: int = 10_000, timeout_ms: int = 5_000,
                 wait: str = "notify", retry_delay_ms: float = 10.0, watchdog: bool = False,
                 max_renewals: int = 1000, on_lost: Callable | None = None, max_extensions: int = 10) -> None:
        super().__init__(name, ttl_ms=ttl_ms, timeout_ms=timeout_ms, wait=wait, retry_delay_ms=retry_delay_ms,
                         watchdog=watchdog, max_renewals=max_renewals, on_lost=on_lost,
                         max_extensions=max_extensions)
        self.client = client
        self._node = _AsyncNode.of(client)

    def node_names(self) -> list[str]:
        return [self._node.name]

    async def _attempt(self, waiter: bool) -> tuple[Lease | None, float, bool]:
        token = new_token()
        start = time.monotonic()
        try:
            reply = await eval_one(self._node, ACQUIRE, self._keys, (token, self.ttl_ms, "1" if waiter else "0"))
        except redis.RedisError as error:
            raise self._error(QuorumUnavailable, f"the node did not answer: {error}") from error
        if reply > 0:
            return Lease(self.name, token, reply, start + (self.ttl_ms - self._drift_ms) / 1000.0), 0, False
        return None, -reply, False

    async def _unlock(self, token: str) -> bool:
        try:
            reply = await eval_one(self._node, RELEASE, self._release_keys,
                                   (token, SIGNAL_LIFETIME_MS, HANDOFF_WINDOW_MS))
            return reply == 1
        except redis.RedisError as error:
            raise self._error(NotOwned, f"release could not reach the node: {error}") from error

    async def _extend_nodes(self, lease: Lease, ttl_ms: int) -> Lease:
        start = time.monotonic()
        try:
            extended = await eval_one(self._node, EXTEND, (self.name,), (lease.token, ttl_ms)) == 1
        except redis.RedisError as error:
            raise self._error(NotOwned, f"extend could not reach the node: {error}") from error
        if not extended:
            raise self._error(NotOwned, "extend refused: the lease expired or another holder took over")
        return Lease(self.name, lease.token, lease.fence, start + (ttl_ms - drift_ms(ttl_ms)) / 1000.0)

    async def _wait_for_release(self, wait_s: float) -> None:
        await block_on_signal(self._node, self.name, wait_s)


class AsyncRedlock(_AsyncBaseLock):
    """The asyncio twin of :class:`inventory.locks.Redlock`."""

    def __init__(self, clients: Sequence[aioredis.Redis], name: str, *, ttl_ms: int = 10_000,
                 timeout_ms: int = 5_000, node_timeout_ms: float | None = None, wait: str = "notify",
                 retry_delay_ms: float = 10.0, watchdog: bool = False, max_renewals: int = 1000,
                 on_lost: Callable | None = None, max_extensions: int = 10) -> None:
        super().__init__(name, ttl_ms=ttl_ms, timeout_ms=timeout_ms, wait=wait, retry_delay_ms=retry_delay_ms,
                         watchdog=watchdog, max_renewals=max_renewals, on_lost=on_lost,
                         max_extensions=max_extensions)
        if not clients:
            raise ValueError("Redlock needs at least one node client")
        self.clients = list(clients)
        self._nodes = [_AsyncNode.of(client) for client in self.clients]
        self._signal_node = self._nodes[0]
        self.quorum = len(self._nodes) // 2 + 1
        self.node_timeout_s = (node_timeout_ms or default_node_timeout_ms(self.ttl_ms)) / 1000.0

    def node_names(self) -> list[str]:
        return [node.name for node in self._nodes]

    async def _attempt(self, waiter: bool) -> tuple[Lease | None, float, bool]:
        token = new_token()
        start = time.monotonic()
        argv = (token, self.ttl_ms, "1" if waiter else "0")
        replies = await eval_all(self._nodes, ACQUIRE, self._keys, argv, self.node_timeout_s)
        granted = granted_votes(replies)
        if len(granted) >= self.quorum:
            fence, laggards = fence_and_laggards(granted)
            confirmed = len(granted) - len(laggards)
            if laggards:
                # Write the fence back before granting so any later majority sees it (see the package docstring).
                raised = await eval_all([self._nodes[i] for i in laggards], RAISE_FENCE, self._keys[:2],
                                  (token, fence), self.node_timeout_s)
                confirmed += confirmations(raised)
            validity = validity_ms(self.ttl_ms, start, self._drift_ms)
            if confirmed >= self.quorum and validity > 0:
                return Lease(self.name, token, fence, start + validity / 1000.0), 0, False
        await self._unlock_all(token)
        answered, hint_ms, unavailable = refused_round(replies, self.quorum, self.node_names())
        if answered:
            self._signal_node = self._nodes[answered[0]]
        if unavailable:
            raise self._error(QuorumUnavailable, unavailable)
        return None, hint_ms, bool(granted)

    async def _unlock_all(self, token: str) -> list:
        return await eval_all(self._nodes, RELEASE, self._release_keys, (token, SIGNAL_LIFETIME_MS, HANDOFF_WINDOW_MS),
                        self.node_timeout_s)

    async def _unlock(self, token: str) -> bool:
        return not majority_denies(await self._unlock_all(token), self.quorum)

    async def _extend_nodes(self, lease: Lease, ttl_ms: int) -> Lease:
        start = time.monotonic()
        if start >= lease.valid_until:
            raise self._error(NotOwned, "extend after the lease's validity ended")
        replies = await eval_all(self._nodes, EXTEND, (self.name,), (lease.token, ttl_ms), self.node_timeout_s)
        extended = confirmations(replies)
        end = time.monotonic()
        validity = validity_ms(ttl_ms, start, drift_ms(ttl_ms), end)
        if extended < self.quorum or end >= lease.valid_until or validity <= 0:
            raise self._error(NotOwned, f"extend confirmed by {extended} of {len(self._nodes)} nodes "
                                        f"within the validity, {self.quorum} needed")
        return Lease(self.name, lease.token, lease.fence, start + validity / 1000.0)

    async def _wait_for_release(self, wait_s: float) -> None:
        await block_on_signal(self._signal_node, self.name, wait_s)
