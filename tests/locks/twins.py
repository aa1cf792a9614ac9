"""Run one test body against both twins: the blocking locks and their asyncio counterparts.

A :class:`Twin` hands out clients and lock classes of its kind and runs whatever a lock method
returns (``twin(lock.acquire())``): a value as is, a coroutine on the twin's own event loop. A
thread that needs its own locks calls :meth:`Twin.spawn`, which gives the body a fresh twin (own
loop, own clients), so asyncio clients are never shared across loops.
"""

from __future__ import annotations

import asyncio
import inspect
import threading

import redis
import redis.asyncio as aioredis

from locks import AsyncRedisLock, AsyncRedlock, RedisLock, Redlock, aclose_connections

KINDS = ["sync", "asyncio"]


class Twin:
    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.is_async = kind == "asyncio"
        self.RedisLock = AsyncRedisLock if self.is_async else RedisLock
        self.Redlock = AsyncRedlock if self.is_async else Redlock
        self.loop = asyncio.new_event_loop() if self.is_async else None
        self._clients: list = []

    def __call__(self, value):
        if inspect.isawaitable(value):
            return self.loop.run_until_complete(value)
        return value

    def client(self, port: int, *, socket_timeout: float = 1.0):
        cls = aioredis.Redis if self.is_async else redis.Redis
        client = cls(host="127.0.0.1", port=port, socket_timeout=socket_timeout)
        self._clients.append(client)
        return client

    def clients(self, ports, **kwargs) -> list:
        return [self.client(port, **kwargs) for port in ports]

    def close(self) -> None:
        for client in self._clients:
            self(client.aclose() if self.is_async else client.close())
        if self.loop is not None:
            # A connect to an unreachable node is left pending by design; end it with the loop.
            pending = asyncio.all_tasks(self.loop)
            for task in pending:
                task.cancel()
            if pending:
                self.loop.run_until_complete(asyncio.wait(pending))
            self.loop.run_until_complete(aclose_connections())  # the locks' own connections are the loop's
            self.loop.close()

    def spawn(self, body) -> threading.Thread:
        """Start ``body(twin)`` in a thread with a twin of its own; join the returned thread."""

        def run() -> None:
            twin = Twin(self.kind)
            try:
                body(twin)
            finally:
                twin.close()

        thread = threading.Thread(target=run)
        thread.start()
        return thread
