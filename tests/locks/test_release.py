"""What a release reports (issue 16): gone and taken told apart, a failed node named, an
ambiguous retry logged as such, against real redis-server processes and both twins."""

from __future__ import annotations

import logging
import threading
import time

import pytest

from locks import NotOwned
from locks.scripts import RELEASE

from .conftest import ROOMY_NODE_TIMEOUT_MS
from .netfaults import Proxy

NODE_TIMEOUT_MS = 50
#: A release round long enough for a waiter it wakes to take the lock on every node meanwhile.
SLOW_ROUND_MS = 500


def test_a_release_tells_a_key_gone_from_a_key_taken(twin, cluster, name):
    nodes, sync_clients = cluster
    client = twin.client(nodes[0].port)
    gone = twin.RedisLock(client, name, ttl_ms=5_000, timeout_ms=0)
    twin(gone.acquire())
    sync_clients[0].delete(name)
    with pytest.raises(NotOwned, match="the key is gone"):
        twin(gone.release())
    taken = twin.RedisLock(client, name, ttl_ms=5_000, timeout_ms=0)
    twin(taken.acquire())
    sync_clients[0].set(name, "another token")
    with pytest.raises(NotOwned, match="another holder took over"):
        twin(taken.release())
    assert sync_clients[0].get(name) == b"another token"


def test_a_redlock_release_names_each_node_it_could_not_reach(twin, cluster, name, caplog):
    nodes, sync_clients = cluster
    clients = twin.clients([node.port for node in nodes])
    # A roomy node timeout: the release's nodes are killed, which refuse at once, so it waits for
    # nothing; at 50 ms the acquire's first connects missed all five nodes once at load 9 (a fresh
    # clone's make test, the asyncio twin: "connect did not finish within 50 ms").
    lock = twin.Redlock(clients, name, ttl_ms=5_000, timeout_ms=0, node_timeout_ms=ROOMY_NODE_TIMEOUT_MS)
    twin(lock.acquire())
    nodes[1].kill()
    nodes[3].kill()
    with caplog.at_level(logging.WARNING, logger="locks"):
        twin(lock.release())
    failed = [record.getMessage() for record in caplog.records if "failed on" in record.getMessage()]
    assert len(failed) == 2, failed
    assert f":{nodes[1].port} " in failed[0] and f":{nodes[3].port} " in failed[1], failed
    assert all(sync_clients[i].get(name) is None for i in (0, 2, 4))


def test_a_retry_after_a_timed_out_release_that_finds_the_key_gone_is_ambiguous(twin, cluster, name, caplog):
    """The first attempt times out on a frozen node, which runs it once thawed; the retry then
    finds the key gone: that is not an expiry, and must not be reported as one."""
    nodes, sync_clients = cluster
    client = twin.client(nodes[0].port, socket_timeout=0.5)
    lock = twin.RedisLock(client, name, ttl_ms=10_000, timeout_ms=0)
    twin(lock.acquire())
    nodes[0].pause()
    thaw = threading.Timer(0.7, nodes[0].resume)
    thaw.start()
    try:
        started = time.monotonic()
        with caplog.at_level(logging.WARNING, logger="locks"):
            twin(lock.release())
        took = time.monotonic() - started
    finally:
        thaw.join()
        nodes[0].resume()
    assert any("ambiguous" in record.getMessage() for record in caplog.records), caplog.text
    assert sync_clients[0].get(name) is None
    assert took < 0.5 * 2 + 0.4, took  # the first attempt and one retry, each within the node timeout


def wait_until(condition, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out waiting"
        time.sleep(0.01)


def test_a_retry_after_a_timed_out_release_that_finds_the_woken_waiter_holding_is_ambiguous(
    twin, cluster, name, caplog
):
    """The release ran on every node, but no reply came back within the round; it woke the waiter,
    which took the lock on every node before the retry, so the retry finds another token. That is
    the hand-off the release itself made, not a holder that took over a lost lease. Before: "release
    refused: another holder took over" with the lease's whole TTL left (seen in the fault test of
    test_redlock.py as 987 ms of a 1 s lease left, one node down)."""
    nodes, sync_clients = cluster
    for client in sync_clients:
        client.script_load(RELEASE.text)  # the muted EVALSHA must run, not be answered NOSCRIPT
    proxies = [Proxy(node.port, mute_on=RELEASE.sha.encode()) for node in nodes]
    waiting = []
    done = threading.Event()
    waiter = None

    def wait(other) -> None:
        clients = other.clients([node.port for node in nodes])
        lock = other.Redlock(clients, name, ttl_ms=10_000, timeout_ms=5_000, node_timeout_ms=NODE_TIMEOUT_MS)
        waiting.append(other(lock.acquire()))
        done.wait(10)
        other(lock.release())

    try:
        clients = twin.clients([proxy.port for proxy in proxies])
        holder = twin.Redlock(clients, name, ttl_ms=10_000, timeout_ms=0, node_timeout_ms=SLOW_ROUND_MS)
        lease = twin(holder.acquire())
        waiter = twin.spawn(wait)
        wait_until(lambda: any(client.info("clients")["blocked_clients"] for client in sync_clients))
        with caplog.at_level(logging.WARNING, logger="locks"):
            twin(holder.release())
        assert all(proxy.muted.is_set() for proxy in proxies), "every node ran the first attempt, unanswered"
        assert waiting, "the release woke the waiter, which took the lock"
        assert waiting[0].fence > lease.fence
        # It may have reached a node before the release did there, so a majority, not every node.
        assert sum(client.get(name) == waiting[0].token.encode() for client in sync_clients) >= 3
        assert any("ambiguous" in record.getMessage() for record in caplog.records), caplog.text
    finally:
        done.set()
        if waiter is not None:
            waiter.join(10)
        for proxy in proxies:
            proxy.close()
