"""Redlock against five private redis-server processes, with nodes killed, paused and restarted.

Every test that takes a ``twin`` runs twice: with :class:`Redlock` and with :class:`AsyncRedlock`.
"""

from __future__ import annotations

import itertools
import multiprocessing
import random
import re
import threading
import time

import pytest

from locks import LockLost, NotAcquired, NotOwned, QuorumUnavailable, Redlock
from processes.relay import Relay

from .conftest import ROOMY_NODE_TIMEOUT_MS, SINGLE_URL, expire_now
from .workers import increment_under_lock

NODE_TIMEOUT_MS = 50
# Slack on top of the per-node timeout for a loaded two-core machine; still far below the TTL.
SLACK_S = 0.4
#: A waiter's timeout long enough that waking on the release and on the timeout are told apart by far.
LONG_WAIT_MS = 60_000


def gray_code_subsets(count: int):
    """Every subset of range(count), each differing from the previous in one element."""
    for i in range(2**count):
        code = i ^ (i >> 1)
        yield frozenset(bit for bit in range(count) if code >> bit & 1)


def test_quorum_for_every_subset_of_dead_nodes(twin, cluster, name):
    nodes, clients = cluster
    lock_clients = twin.clients([node.port for node in nodes])
    dead: set[int] = set()
    seen = 0
    for subset in gray_code_subsets(5):
        for index in subset - dead:
            nodes[index].kill()
        for index in dead - subset:
            nodes[index].start()
        dead = set(subset)
        # A grant is read on every live node: 500 ms a node there (a fresh clone's full run at load 8
        # saw a just-restarted node's first connect outlast 50 ms, and the grant went to 3 of 4). A
        # refusal keeps 50 ms: how fast it comes is what that branch checks.
        granting = 5 - len(dead) >= 3
        node_timeout_ms = 500 if granting else NODE_TIMEOUT_MS
        lock = twin.Redlock(lock_clients, name, ttl_ms=2_000, timeout_ms=0, node_timeout_ms=node_timeout_ms)
        started = time.monotonic()
        if granting:
            lease = twin(lock.acquire())
            # valid_until is the acquire's start + TTL - drift allowance (22 ms; locks/__init__.py):
            # what is left is bounded by the time the acquire took, not by a fixed figure a loaded
            # machine can overrun (1,445 ms left of 2,000, once in make check, against 1,500).
            took_ms = (time.monotonic() - started) * 1000
            assert 2_000 - 22 - took_ms - 5 < lease.remaining_ms() <= 2_000 - 22
            up = [i for i in range(5) if i not in dead]
            holders = sum(1 for i in up if clients[i].get(name) == lease.token.encode())
            assert holders == len(up), f"dead={sorted(dead)}: only {holders} live nodes hold the lock"
            twin(lock.release())
            assert all(clients[i].get(name) is None for i in up)
        else:
            with pytest.raises(QuorumUnavailable) as refused:
                twin(lock.acquire())
            assert time.monotonic() - started < NODE_TIMEOUT_MS / 1000 + SLACK_S
            assert all(node.url.split("/")[2] in str(refused.value) for node in nodes)
            up = [i for i in range(5) if i not in dead]
            assert all(clients[i].get(name) is None for i in up), "a failed acquire must unlock every node"
        seen += 1
    assert seen == 32


@pytest.mark.parametrize("paused", [1, 2, 3])
def test_paused_nodes_do_not_stall_acquire_past_the_node_timeout(twin, cluster, name, paused):
    nodes, _ = cluster
    clients = twin.clients([node.port for node in nodes])
    warm = twin.Redlock(clients, name, ttl_ms=2_000, timeout_ms=1_000, node_timeout_ms=NODE_TIMEOUT_MS)
    twin(warm.acquire())  # warm connections, so the frozen nodes hold an open socket as in production
    twin(warm.release())
    for node in list(nodes)[:paused]:
        node.pause()
    try:
        for _ in range(3):
            lock = twin.Redlock(clients, name, ttl_ms=2_000, timeout_ms=0, node_timeout_ms=NODE_TIMEOUT_MS)
            started = time.monotonic()
            if paused < 3:
                twin(lock.acquire())
                elapsed = time.monotonic() - started
                twin(lock.release())
            else:
                with pytest.raises(QuorumUnavailable):
                    twin(lock.acquire())
                elapsed = time.monotonic() - started
            assert elapsed < NODE_TIMEOUT_MS / 1000 + SLACK_S, elapsed
    finally:
        for node in nodes:
            node.resume()


def test_a_majority_that_missed_the_first_round_is_asked_once_more(twin, cluster, name):
    """Before: a majority that missed an acquire's first round raised QuorumUnavailable at once,
    whatever ``timeout_ms`` was left. A worker's first round also connects to every node, and on a
    loaded machine that outlasted the node timeout: CI's ASGI pod answered its first Redlock
    purchase busy (tests/test_asgi.py, 2026-12-03). Here three nodes are frozen for the first round
    only (thawed 1.5 node timeouts after it starts): the acquire is granted, in a later round."""
    nodes, sync_clients = cluster
    clients = twin.clients([node.port for node in nodes])
    node_timeout_ms = 200
    lock = twin.Redlock(clients, name, ttl_ms=2_000, timeout_ms=5_000, node_timeout_ms=node_timeout_ms)
    for node in list(nodes)[:3]:
        node.pause()
    thaw = threading.Timer(1.5 * node_timeout_ms / 1000, lambda: [node.resume() for node in nodes])
    started = time.monotonic()
    thaw.start()
    try:
        lease = twin(lock.acquire())
        elapsed = time.monotonic() - started
    finally:
        thaw.join()
    assert elapsed > node_timeout_ms / 1000, "granted in the first round: the nodes were not frozen for it"
    assert sum(client.get(name) == lease.token.encode() for client in sync_clients) >= 3
    twin(lock.release())


def test_a_frozen_majority_costs_two_rounds_with_time_left_and_one_without(twin, cluster, name):
    """The second round is one round, not a wait: a majority still silent in it is QuorumUnavailable
    after two node timeouts (the live nodes saw two acquires), and a try-lock stops after one."""
    nodes, sync_clients = cluster
    clients = twin.clients([node.port for node in nodes])
    warm = twin.Redlock(clients, name, ttl_ms=2_000, timeout_ms=1_000, node_timeout_ms=NODE_TIMEOUT_MS)
    twin(warm.acquire())  # warm connections: the rounds below pay no connect
    twin(warm.release())
    live = sync_clients[3:]
    for node in list(nodes)[:3]:
        node.pause()
    try:
        for timeout_ms, rounds in ((5_000, 2), (0, 1)):
            before = [evals(client) for client in live]
            lock = twin.Redlock(clients, name, ttl_ms=2_000, timeout_ms=timeout_ms, node_timeout_ms=NODE_TIMEOUT_MS)
            started = time.monotonic()
            with pytest.raises(QuorumUnavailable):
                twin(lock.acquire())
            elapsed = time.monotonic() - started
            # Each round: one acquire, then the release of its token on every node.
            assert [evals(client) - seen for client, seen in zip(live, before, strict=True)] == [2 * rounds] * 2
            assert rounds * NODE_TIMEOUT_MS / 1000 <= elapsed < rounds * NODE_TIMEOUT_MS / 1000 + SLACK_S, elapsed
            assert all(client.get(name) is None for client in live)
    finally:
        for node in nodes:
            node.resume()


def evals(client) -> int:
    """How many scripts the node has run (EVALSHA and EVAL)."""
    stats = client.info("commandstats")
    return sum(int(stats.get(f"cmdstat_{command}", {}).get("calls", 0)) for command in ("evalsha", "eval"))


def test_majority_held_elsewhere_refuses_within_timeout(twin, cluster, name):
    nodes, sync_clients = cluster
    clients = twin.clients([node.port for node in nodes])
    holder = twin.Redlock(clients, name, ttl_ms=5_000)
    lease = twin(holder.acquire())
    started = time.monotonic()
    with pytest.raises(NotAcquired) as refused:
        twin(twin.Redlock(clients, name, ttl_ms=5_000, timeout_ms=200).acquire())
    assert not isinstance(refused.value, QuorumUnavailable)
    assert time.monotonic() - started > 0.19  # it waited its timeout
    # ... and gave up while the holder's lock was still there, not when it ran out
    assert all(client.get(name) == lease.token.encode() for client in sync_clients)
    twin(holder.release())


def test_expiry_then_stale_release_is_ignored(twin, cluster, name):
    nodes, sync_clients = cluster
    clients = twin.clients([node.port for node in nodes])
    # Roomy node timeouts: a release's first try that times out makes it ambiguous, not refused.
    stale = twin.Redlock(clients, name, ttl_ms=10_000, timeout_ms=0, node_timeout_ms=ROOMY_NODE_TIMEOUT_MS)
    old = twin(stale.acquire())
    expire_now(sync_clients, name)
    fresh = twin.Redlock(clients, name, ttl_ms=5_000, timeout_ms=0, node_timeout_ms=ROOMY_NODE_TIMEOUT_MS)
    new = twin(fresh.acquire())
    assert new.fence > old.fence
    with pytest.raises(NotOwned):
        twin(stale.release())
    assert all(client.get(name) == new.token.encode() for client in sync_clients)
    twin(fresh.release())


def test_extend_needs_a_majority_within_validity(twin, cluster, name):
    nodes, clients = cluster
    # The quorum is what this test varies (nodes forget the key), not the time: the lease and the
    # node timeout are wide enough that a busy CI runner's 50 ms stall of the whole process (seen
    # once: 0 of 5 nodes inside 50 ms) cannot fail it. test_extend_after_validity_is_refused
    # covers the clock.
    lock = twin.Redlock(
        twin.clients([node.port for node in nodes]),
        name,
        ttl_ms=1_000,
        timeout_ms=0,
        max_extensions=3,
        node_timeout_ms=250,
    )
    first = twin(lock.acquire())
    time.sleep(0.2)
    second = twin(lock.extend(ttl_ms=2_000))
    assert second.fence == first.fence and second.valid_until > first.valid_until
    assert all(1_500 < client.pttl(name) <= 2_000 for client in clients)
    # Two nodes forget the key: three still confirm, so the extension counts.
    clients[0].delete(name)
    clients[1].delete(name)
    twin(lock.extend())
    # A third forgets: only two of five confirm, so it must not count.
    clients[2].delete(name)
    with pytest.raises(NotOwned, match="2 of 5"):
        twin(lock.extend())
    nodes_holding = sum(1 for client in clients if client.get(name) is not None)
    assert nodes_holding == 2


def test_extend_after_validity_is_refused(twin, cluster, name):
    nodes, _ = cluster
    lock = twin.Redlock(
        twin.clients([node.port for node in nodes]), name, ttl_ms=100, timeout_ms=0, node_timeout_ms=NODE_TIMEOUT_MS
    )
    twin(lock.acquire())
    time.sleep(0.12)
    with pytest.raises(NotOwned):
        twin(lock.extend())


@pytest.mark.slow
def test_lost_update_counter_across_processes(cluster, single, name):
    nodes, _ = cluster
    processes, times = 8, 20
    ctx = multiprocessing.get_context("fork")
    workers = [
        ctx.Process(target=increment_under_lock, args=("redlock", nodes.urls, name, SINGLE_URL, times))
        for _ in range(processes)
    ]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(90)
        assert worker.exitcode == 0
    assert int(single.get(f"{name}:counter")) == processes * times


#: The fault test's lease. A killed node stays down at least this long before it restarts empty
#: (distlock's delayed restart), so no lease it granted is still alive when it comes back.
FAULT_TTL_MS = 1_000
#: A release this close to the lease's end may find it gone by the time it reaches the nodes.
RELEASE_MARGIN_MS = 4 * NODE_TIMEOUT_MS


@pytest.mark.slow
# After the delayed restarts, one full fresh-clone run in two (2026-12-02) still saw one release
# refused ("another holder took over") with 987 ms of its 1 s lease left, one node down. Probable
# cause, since fixed: a first release round that ran but answered too late, whose retry found the
# waiter it woke holding (docs/locks.md, "A release refused under node kills"). The fences held
# every time; the reruns stay until a full run shows it gone.
@pytest.mark.flaky(reruns=2)
def test_fences_strictly_increase_over_1000_grants_with_nodes_killed_and_restarted(twin, cluster, name):
    nodes, _ = cluster
    ports = [node.port for node in nodes]
    grants: list[int] = []
    record = threading.Lock()
    stop = threading.Event()
    refused: list[tuple[NotOwned, float]] = []
    faults = {"kills": 0}

    def contend(other) -> None:
        clients = other.clients(ports)
        while not stop.is_set():
            lock = other.Redlock(clients, name, ttl_ms=FAULT_TTL_MS, timeout_ms=2_000, node_timeout_ms=NODE_TIMEOUT_MS)
            try:
                lease = other(lock.acquire())
            except NotAcquired:
                continue
            try:
                with record:
                    if len(grants) >= 1_000:
                        stop.set()
                    elif len(grants) < 200 * faults["kills"]:
                        # Spread the 1,000 recorded grants over at least five kill cycles, however fast
                        # the grants come (a subsequence of the grants must increase as they all do).
                        grants.append(lease.fence)
            finally:
                remaining_ms = lease.remaining_ms()
                try:
                    other(lock.release())
                except NotOwned as error:
                    refused.append((error, remaining_ms))

    def inject() -> None:
        # One node down at a time: killed (forgetting keys and counters), and restarted empty only
        # once every lease it granted has expired. Restarting sooner is outside Redlock's model:
        # two nodes forgetting within one lease hand it to a second holder (the test below).
        rng = random.Random(3)
        while not stop.is_set():
            victim = nodes[rng.randrange(5)]
            victim.kill()
            faults["kills"] += 1
            stop.wait(FAULT_TTL_MS / 1000 + rng.uniform(0.05, 0.15))
            victim.start()
            stop.wait(rng.uniform(0.05, 0.15))

    threads = [twin.spawn(contend) for _ in range(4)] + [threading.Thread(target=inject)]
    threads[-1].start()
    for thread in threads:
        thread.join(120)
    assert len(grants) == 1_000
    broken = [i for i, (a, b) in enumerate(itertools.pairwise(grants)) if a >= b]
    assert not broken, f"fences must strictly increase: {grants[max(broken[0] - 3, 0) : broken[0] + 4]}"
    assert faults["kills"] >= 5
    # A release is refused only for a lease its holder could already see was over (a thread
    # descheduled past its TTL on a loaded machine); never while the lease still had time.
    live = [(str(error), remaining) for error, remaining in refused if remaining > RELEASE_MARGIN_MS]
    assert not live, f"releases refused while the lease had time left (ms): {live[:5]}"


def test_two_nodes_forgetting_within_one_lease_let_a_second_holder_in(twin, cluster, name):
    """Why the fault test above delays restarts: a lease granted by four nodes (the fifth down)
    loses its majority when two of them restart empty one after the other, each alone down, and
    a second holder is granted while the first lease still has seconds to run. Seen in CI as a
    release refused with "another holder took over" when a holder outlived two kill cycles."""
    nodes, _ = cluster
    clients = twin.clients([node.port for node in nodes])
    nodes[4].kill()
    first = twin.Redlock(clients, name, ttl_ms=30_000, timeout_ms=0, node_timeout_ms=NODE_TIMEOUT_MS)
    lease = twin(first.acquire())
    nodes[4].start()
    for index in (0, 1):
        nodes[index].kill()
        nodes[index].start()
    second = twin.Redlock(clients, name, ttl_ms=30_000, timeout_ms=0, node_timeout_ms=NODE_TIMEOUT_MS)
    other = twin(second.acquire())
    assert lease.remaining_ms() > 20_000, "the first lease is still valid by its holder's clock"
    assert other.token != lease.token
    with pytest.raises(NotOwned, match="another holder took over") as refused:
        twin(first.release())
    # The message says what each node answered: the two that forgot and the fifth hold the second
    # holder's token now; the two that never restarted still released the first's.
    said = dict(re.findall(r"(127\.0\.0\.1:\d+) (released|gone|taken|ambiguous|failed)", str(refused.value)))
    assert list(said.values()) == ["taken", "taken", "released", "released", "taken"], refused.value
    twin(second.release())


@pytest.mark.slow
def test_watchdog_keeps_a_short_lock_across_long_work(cluster, name):
    _, clients = cluster
    lost = []
    with Redlock(
        clients, name, ttl_ms=1_000, timeout_ms=0, watchdog=True, on_lost=lambda lease, error: lost.append(error)
    ) as lease:
        for _ in range(5):
            time.sleep(1.0)
            with pytest.raises(NotAcquired):
                Redlock(clients, name, ttl_ms=1_000, timeout_ms=0).acquire()
        assert all(client.get(name) == lease.token.encode() for client in clients)
    assert not lost


def test_watchdog_reports_loss_when_keys_are_removed(cluster, name):
    _, clients = cluster
    lost = []
    started = time.monotonic()
    with (
        pytest.raises(LockLost) as raised,
        Redlock(
            clients, name, ttl_ms=600, timeout_ms=0, watchdog=True, on_lost=lambda lease, error: lost.append(error)
        ),
    ):
        for client in clients:
            client.delete(name)
        while not lost and time.monotonic() - started < 30:
            time.sleep(0.01)
    assert lost and raised.value is lost[0]
    # Seen at the first renewal that found the keys gone, not when the lease would have run out.
    assert "could not renew" in str(raised.value)


def test_waiter_wakes_on_release_not_on_expiry(twin, cluster, name):
    nodes, _ = cluster
    ports = [node.port for node in nodes]
    # The holder's TTL and the waiter's timeout are long: a waiter that was not woken by the release
    # sleeps until one of them, far longer than any delay of a loaded machine.
    holder = twin.Redlock(twin.clients(ports), name, ttl_ms=2 * LONG_WAIT_MS, timeout_ms=0)
    twin(holder.acquire())
    granted_at: list[float] = []

    def wait(other) -> None:
        lock = other.Redlock(other.clients(ports), name, ttl_ms=10_000, timeout_ms=LONG_WAIT_MS)
        other(lock.acquire())
        granted_at.append(time.monotonic())
        other(lock.release())

    waiter = twin.spawn(wait)
    time.sleep(0.3)
    released_at = time.monotonic()
    twin(holder.release())
    waiter.join(LONG_WAIT_MS / 1000 + 5)
    assert granted_at and released_at <= granted_at[0] < released_at + LONG_WAIT_MS / 1000 / 2, granted_at


def test_nodes_that_forgot_the_scripts_are_sent_them_again(twin, cluster, name):
    nodes, clients = cluster
    lock_clients = twin.clients([node.port for node in nodes])
    warm = twin.Redlock(lock_clients, name, ttl_ms=2_000, timeout_ms=0)
    twin(warm.acquire())
    twin(warm.release())
    for client in clients[:3]:
        client.script_flush()
    lock = twin.Redlock(lock_clients, name, ttl_ms=2_000, timeout_ms=0)
    lease = twin(lock.acquire())
    assert all(client.get(name) == lease.token.encode() for client in clients)
    twin(lock.release())
    assert all(client.get(name) is None for client in clients)


def test_a_grant_leaves_no_waiter_registration_on_the_nodes_that_refused(twin, cluster, name):
    """Before: with a stale key on 2 of 5 nodes, the acquire registered as a waiter on all five,
    was granted by three, released; nodes 3 and 4 kept the holder's token in `name:waiters` (~6 s),
    so every release there opened a hand-off window for nobody."""
    nodes, sync_clients = cluster
    for client in sync_clients[3:]:
        client.set(name, "stale", px=6_000)
    lock = twin.Redlock(
        twin.clients([node.port for node in nodes]),
        name,
        ttl_ms=10_000,
        timeout_ms=1_000,
        node_timeout_ms=NODE_TIMEOUT_MS,
    )
    twin(lock.acquire())
    twin(lock.release())
    assert [client.smembers(f"{name}:waiters") for client in sync_clients] == [set()] * 5
    assert [client.get(name) for client in sync_clients] == [None] * 3 + [b"stale"] * 2


def test_check_servers_finds_one_server_behind_a_port_forward(twin, cluster, name):
    """One node reached twice, directly and through a TCP relay on another port: the constructor
    sees five host:port pairs and accepts them (a quorum of 3, two of them one process); asking the
    servers their run_id refuses it. A node that is down is left out of the comparison."""
    nodes, _ = cluster
    relay = Relay(target_port=nodes[0].port)
    try:
        aliased = twin.Redlock(twin.clients([nodes[0].port, relay.port, *(n.port for n in nodes[1:4])]), name)
        assert aliased.quorum == 3
        with pytest.raises(ValueError, match=rf"127\.0\.0\.1:{nodes[0].port} and 127\.0\.0\.1:{relay.port}") as refused:
            twin(aliased.check_servers())
        assert "are one server" in str(refused.value) and "clients 0 and 1" in str(refused.value)
    finally:
        relay.close()
    lock = twin.Redlock(twin.clients([node.port for node in nodes]), name)
    ids = twin(lock.check_servers())
    assert len(set(ids)) == 5 and all(re.fullmatch(r"[0-9a-f]{40}", run_id) for run_id in ids)
    nodes[4].kill()
    assert twin(lock.check_servers(timeout_ms=500)) == [*ids[:4], None]
    with pytest.raises(ValueError, match="timeout_ms"):
        twin(lock.check_servers(timeout_ms=0))
