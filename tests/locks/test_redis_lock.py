"""RedisLock against the machine's Redis (database 11): grants, fences, expiry, extend, waiting."""

from __future__ import annotations

import dataclasses
import multiprocessing
import threading
import time

import pytest
import redis
import redis.asyncio as aioredis

from locks import AsyncRedisLock, AsyncRedlock, Lease, LockError, LockLost, NotAcquired, NotOwned, RedisLock, Redlock

from .conftest import SINGLE_URL
from .workers import increment_under_lock


def test_grant_carries_token_fence_and_validity(single, name):
    lock = RedisLock(single, name, ttl_ms=2_000, timeout_ms=0)
    lease = lock.acquire()
    assert isinstance(lease, Lease) and lease.name == name and len(lease.token) == 32
    assert lease.fence == 1
    assert 1_900 < lease.remaining_ms() <= 2_000
    assert single.get(name) == lease.token.encode()
    assert 1_900 < single.pttl(name) <= 2_000
    lock.release()
    assert single.get(name) is None
    with RedisLock(single, name, ttl_ms=2_000) as second:
        assert second.fence == 2


def test_a_granted_lease_is_the_frozen_dataclass_the_constructor_makes(single, name):
    """A grant builds its lease without ``Lease.__init__`` (``_core.new_lease``): it must be the same
    value, as frozen, equal and hashable as one the constructor makes, for both locks."""
    for lock in (RedisLock(single, name, ttl_ms=2_000, timeout_ms=0), Redlock([single], name, ttl_ms=2_000)):
        lease = lock.acquire()
        built = Lease(lease.name, lease.token, lease.fence, lease.valid_until)
        assert type(lease) is Lease and lease == built and hash(lease) == hash(built) and repr(lease) == repr(built)
        assert list(vars(lease)) == ["name", "token", "fence", "valid_until"]
        with pytest.raises(dataclasses.FrozenInstanceError):
            lease.fence = 0
        assert dataclasses.replace(lease, fence=lease.fence + 1).fence == lease.fence + 1
        lock.release()


def test_held_lock_is_refused_and_error_names_key_and_node(single, name):
    with RedisLock(single, name, ttl_ms=5_000):
        started = time.monotonic()
        with pytest.raises(NotAcquired) as refused:
            RedisLock(single, name, ttl_ms=5_000, timeout_ms=150).acquire()
        assert time.monotonic() - started > 0.14  # it waited its timeout
        assert single.get(name) is not None  # and gave up while the lock was still held, not when it ran out
        assert refused.value.name == name and refused.value.nodes == ["127.0.0.1:6379"]
        assert name in str(refused.value) and "127.0.0.1:6379" in str(refused.value)


def test_expiry_then_stale_release_is_ignored(single, name):
    stale = RedisLock(single, name, ttl_ms=100, timeout_ms=0)
    old = stale.acquire()
    time.sleep(0.15)
    new_lock = RedisLock(single, name, ttl_ms=5_000, timeout_ms=0)
    new = new_lock.acquire()
    assert new.fence > old.fence
    with pytest.raises(NotOwned):
        stale.release()
    assert single.get(name) == new.token.encode(), "the stale release must leave the new holder's lock"
    new_lock.release()


def test_extend_resets_ttl_only_for_the_owner_and_is_bounded(single, name):
    """A fresh clone's full run (2026-12-06, load average 9) failed the first extend with "extend
    after the lease's validity ended": it gave a 300 ms lease 200 ms of sleep, and the process
    stalled for the other 100. The lease is now 1 s against 0.1 s of sleep (the extend still moves
    the validity forward: to 3 s)."""
    lock = RedisLock(single, name, ttl_ms=1_000, timeout_ms=0, max_extensions=2)
    first = lock.acquire()
    time.sleep(0.1)
    extended = lock.extend(ttl_ms=3_000)
    assert extended.token == first.token and extended.fence == first.fence
    assert extended.valid_until > first.valid_until
    assert 2_000 < single.pttl(name) <= 3_000
    lock.extend()
    with pytest.raises(LockError, match="extension limit"):
        lock.extend()
    lock.release()

    expired = RedisLock(single, name, ttl_ms=100, timeout_ms=0)
    expired.acquire()
    time.sleep(0.15)
    with pytest.raises(NotOwned):
        expired.extend()


def test_leaving_with_block_after_expiry_raises_lock_lost(single, name):
    with pytest.raises(LockLost), RedisLock(single, name, ttl_ms=100, timeout_ms=0):
        time.sleep(0.15)


#: A waiter's timeout, and the holder's TTL above it: long, so that a waiter that was not woken
#: by the release (it sleeps until the TTL or its timeout) is told apart from one that was by
#: far more than a loaded machine's delays.
LONG_WAIT_MS = 60_000


def test_waiter_wakes_on_release_not_on_timeout(single, name):
    holder = RedisLock(single, name, ttl_ms=2 * LONG_WAIT_MS, timeout_ms=0)
    holder.acquire()
    granted_at: list[float] = []

    def wait() -> None:
        with RedisLock(single, name, ttl_ms=10_000, timeout_ms=LONG_WAIT_MS):
            granted_at.append(time.monotonic())

    waiter = threading.Thread(target=wait)
    waiter.start()
    time.sleep(0.3)
    released_at = time.monotonic()
    holder.release()
    waiter.join(LONG_WAIT_MS / 1000 + 5)
    # Granted after the release, and long before the waiter's timeout (or the holder's TTL) ended its sleep.
    assert granted_at and released_at <= granted_at[0] < released_at + LONG_WAIT_MS / 1000 / 2, granted_at


def test_release_hands_the_lock_to_a_waiter_before_a_newcomer(single, name):
    holder = RedisLock(single, name, ttl_ms=10_000, timeout_ms=0)
    holder.acquire()
    granted: list = []
    waiter = threading.Thread(
        target=lambda: granted.append(RedisLock(single, name, ttl_ms=10_000, timeout_ms=5_000).acquire())
    )
    waiter.start()
    time.sleep(0.2)
    holder.release()
    with pytest.raises(NotAcquired):
        RedisLock(single, name, ttl_ms=10_000, timeout_ms=0).acquire()
    waiter.join(5)
    assert granted and single.get(name) == granted[0].token.encode()


def test_waiter_takes_over_when_holder_dies_without_release(single, name):
    dead = RedisLock(single, name, ttl_ms=300, timeout_ms=0).acquire()
    started = time.monotonic()
    with RedisLock(single, name, ttl_ms=1_000, timeout_ms=LONG_WAIT_MS) as lease:
        # Not before the dead holder's lease ran out; woken when it did (the TTL it was told), not
        # at the end of its own timeout.
        assert 0.2 < time.monotonic() - started < LONG_WAIT_MS / 1000 / 2
        assert lease.fence > dead.fence


@pytest.mark.parametrize("wait", ["notify", "poll"])
def test_threads_never_overlap(single, name, wait):
    inside = []
    overlaps = []
    fences = []

    def work() -> None:
        for _ in range(20):
            with RedisLock(single, name, ttl_ms=5_000, timeout_ms=10_000, wait=wait, retry_delay_ms=2) as lease:
                inside.append(1)
                if len(inside) > 1:
                    overlaps.append(lease)
                fences.append(lease.fence)
                time.sleep(0.0005)
                inside.pop()

    threads = [threading.Thread(target=work) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert not overlaps
    assert fences == sorted(fences) and len(set(fences)) == 120


@pytest.mark.slow
def test_lost_update_counter_across_processes(single, name):
    processes, times = 8, 25
    ctx = multiprocessing.get_context("fork")
    workers = [
        ctx.Process(target=increment_under_lock, args=("redis", [SINGLE_URL], name, SINGLE_URL, times))
        for _ in range(processes)
    ]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(60)
        assert worker.exitcode == 0
    assert int(single.get(f"{name}:counter")) == processes * times


@pytest.mark.slow
def test_watchdog_keeps_a_short_lock_across_long_work(single, name):
    lost = []
    with RedisLock(
        single, name, ttl_ms=1_000, timeout_ms=0, watchdog=True, on_lost=lambda lease, error: lost.append(error)
    ) as lease:
        for _ in range(5):
            time.sleep(1.0)
            with pytest.raises(NotAcquired):
                RedisLock(single, name, ttl_ms=1_000, timeout_ms=0).acquire()
        assert single.get(name) == lease.token.encode()
    assert not lost
    assert single.get(name) is None


def test_watchdog_reports_loss_when_key_is_removed(single, name):
    lost = []
    started = time.monotonic()
    with (
        pytest.raises(LockLost) as raised,
        RedisLock(
            single,
            name,
            ttl_ms=600,
            timeout_ms=0,
            watchdog=True,
            on_lost=lambda lease, error: lost.append((lease, error)),
        ) as lease,
    ):
        single.delete(name)
        while not lost and time.monotonic() - started < 30:
            time.sleep(0.01)
    assert lost and lost[0][0].token == lease.token
    assert raised.value is lost[0][1]
    # Seen at the first renewal that found the key gone, not when the lease would have run out.
    assert isinstance(raised.value.__cause__, NotOwned)
    assert "could not renew" in str(raised.value)


def test_a_process_with_descriptors_above_1024_can_still_connect(name):
    """Seen in a spike: a gunicorn worker holding thousands of keep-alive connections answered
    every purchase with a 500 ("filedescriptor out of range in select()") because the lock
    connected through select(). The descriptors here stand in for those connections."""
    import os
    import resource

    import redis

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 1200:
        pytest.skip(f"RLIMIT_NOFILE hard limit {hard} is below 1200")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 1200), hard))
    held = []
    try:
        while not held or held[-1] <= 1100:
            held.append(os.open(os.devnull, os.O_RDONLY))
        client = redis.Redis.from_url(SINGLE_URL, socket_timeout=2.0)  # its socket gets a descriptor > 1100
        try:
            with RedisLock(client, name, ttl_ms=1000, timeout_ms=0) as lease:
                assert lease.fence > 0
        finally:
            client.close()
    finally:
        for fd in held:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_the_blocking_locks_refuse_a_coroutine_function_as_on_lost(name):
    """Before: accepted, then called from the watchdog thread and never awaited ("RuntimeWarning:
    coroutine ... was never awaited"): the loss was never reported. The asyncio twins await it."""

    async def on_lost(lease, error):
        pass

    client = redis.Redis(host="127.0.0.1", port=1)  # never connected: the refusal comes first
    with pytest.raises(ValueError, match="coroutine function"):
        RedisLock(client, name, watchdog=True, on_lost=on_lost)
    with pytest.raises(ValueError, match="coroutine function"):
        Redlock([client], name, watchdog=True, on_lost=on_lost)
    assert RedisLock(client, name, on_lost=lambda lease, error: None).on_lost is not None
    async_client = aioredis.Redis(host="127.0.0.1", port=1)
    assert AsyncRedisLock(async_client, name, on_lost=on_lost).on_lost is on_lost
    assert AsyncRedlock([async_client], name, on_lost=on_lost).on_lost is on_lost
