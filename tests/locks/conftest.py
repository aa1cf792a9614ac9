"""Real Redis for the lock tests: database 11 of the machine's server, and five private nodes.

The five nodes (ports 7679-7683, no persistence) are started once per session. Fault tests kill,
pause and restart them; the ``cluster`` fixture brings every node back up and empty before each
test, so no test sees another's faults or keys.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from pathlib import Path

import pytest
import redis
import redis.asyncio as aioredis

from locks import aclose_connections
from processes.nodes import RedisNodes
from tests import slots

from .twins import KINDS, Twin

SINGLE_URL = slots.LOCK_TEST_REDIS_URL
BASE_PORT = slots.LOCK_TEST_BASE_PORT
RUN_DIR = Path(__file__).resolve().parents[2] / ".run" / "test-locks"

#: A Redlock node timeout for tests about what a lock answers, not how fast: on a loaded 2-core
#: machine (load 8-13, a fresh clone's make test) a node's answer outlasted the default 50 ms, on
#: a first connect or on a release (whose timed-out try makes a stale release ambiguous, not refused).
ROOMY_NODE_TIMEOUT_MS = 1_000


@pytest.fixture(scope="session")
def redis_nodes():
    nodes = RedisNodes(base_port=BASE_PORT, count=5, run_dir=RUN_DIR)
    nodes.start()
    yield nodes
    nodes.stop()


@pytest.fixture
def cluster(redis_nodes):
    """The five nodes, all running and flushed; clients with short socket timeouts."""
    redis_nodes.reset()
    clients = [node.client(socket_timeout=1.0) for node in redis_nodes]
    yield redis_nodes, clients
    redis_nodes.reset()
    for client in clients:
        client.close()


@pytest.fixture(params=KINDS)
def twin(request):
    """The blocking locks, then the asyncio twins: a test using this runs once for each."""
    twin = Twin(request.param)
    yield twin
    twin.close()


@pytest.fixture
def single():
    client = redis.Redis.from_url(SINGLE_URL, socket_timeout=2.0)
    client.flushdb()
    yield client
    client.flushdb()
    client.close()


@pytest.fixture
def name():
    return f"test:lock:{uuid.uuid4().hex[:12]}"


def async_clients(nodes) -> list[aioredis.Redis]:
    return [aioredis.Redis(host="127.0.0.1", port=node.port, socket_timeout=1.0) for node in nodes]


def run(coro):
    """``asyncio.run(coro)``, then the locks' connections of that loop closed
    (:func:`locks.aclose_connections`), as an application does before its loop ends: left to the
    collector after ``asyncio.run`` has closed the loop, each was a ResourceWarning."""

    async def then_close():
        try:
            return await coro
        finally:
            await aclose_connections()

    return asyncio.run(then_close())


def expire_now(sync_clients, name: str) -> None:
    """Let ``name``'s key run out on every node now (``PEXPIRE`` 1 ms; Redis itself removes it) and
    return once no node holds it: a lease's expiry without a short TTL, which an acquire on a loaded
    machine could outlast before it was granted (a 150 ms lease, not granted within 0 ms at load 10)."""
    for client in sync_clients:
        client.pexpire(name, 1)
    deadline = time.monotonic() + 2.0
    while any(client.exists(name) for client in sync_clients):
        assert time.monotonic() < deadline, f"{name} outlived a 1 ms expiry by 2 s"
        time.sleep(0.005)
