"""Arguments the locks cannot honour are refused with a ValueError naming the argument, at
construction (or at the top of ``extend`` and ``advance_fence``), before any round trip.

Each refusal here was seen to do harm without it: a name that is another lock's helper key
(``q:signal``) let a release delete a held lock's key; ``extend(ttl_ms=-1)`` deleted the key and
returned normally; a NaN timeout waited forever; ``advance_fence(2**53)`` returned a fence not
above the one passed. Constructor checks need no server; the others run on the private nodes.
"""

from __future__ import annotations

import pytest

from locks.etcd import EtcdLock
from locks.zookeeper import ZooKeeperClient, ZooKeeperLock
from tests import slots

from .conftest import ROOMY_NODE_TIMEOUT_MS

#: No server listens here (nor needs to: constructors do not connect).
PORT = slots.LOCK_TEST_BASE_PORT
ETCD = ["http://127.0.0.1:9"]
NAN, INF = float("nan"), float("inf")
HELPER_SUFFIXES = (":fence", ":signal", ":waiters", ":handoff")


def redis_locks(twin):
    """A constructor for each Redis lock of the twin: ``make(name, **kwargs)``."""
    return {
        "RedisLock": lambda name, **kw: twin.RedisLock(twin.client(PORT), name, **kw),
        "Redlock": lambda name, **kw: twin.Redlock(twin.clients([PORT, PORT + 1, PORT + 2]), name, **kw),
    }


# --- names -------------------------------------------------------------------------------------


@pytest.mark.parametrize("suffix", HELPER_SUFFIXES)
def test_a_redis_lock_name_that_is_another_locks_helper_key_is_refused(twin, suffix):
    # Seen: RedisLock "q:signal" held, then lock "q" released with a waiter deleted "q:signal"
    # and a second holder of "q:signal" was granted; "x:fence" held made acquiring "x" fail
    # ("value is not an integer") after its SET NX had run, stranding "x" for its TTL.
    for kind, make in redis_locks(twin).items():
        with pytest.raises(ValueError, match=r"name .*helper") as refused:
            make(f"q{suffix}")
        assert repr(f"q{suffix}") in str(refused.value), kind


@pytest.mark.parametrize("name", ["flashsale:lock:phone-x", "flashsale:lock:SKU1", "fence", "q:fences", "q:fence:x"])
def test_the_shops_lock_names_and_other_colons_are_accepted(twin, name):
    for make in redis_locks(twin).values():
        assert make(name).name == name


@pytest.mark.parametrize("name", [b"x", 1, None, ""])
def test_a_name_that_is_not_a_non_empty_str_is_refused_by_every_lock(twin, name):
    # Seen: b"x" accepted, its keys "b'x'" and "b'x':fence" (the bytes' repr).
    for make in redis_locks(twin).values():
        with pytest.raises(ValueError, match="name"):
            make(name)
    with pytest.raises(ValueError, match="name"):
        EtcdLock(ETCD, name)
    with pytest.raises(ValueError, match="name"):
        ZooKeeperLock(ZooKeeperClient(["127.0.0.1:9"]), name)


@pytest.mark.parametrize("name", ["\ud800", "sku-\udcff"], ids=["lone-high-surrogate", "lone-low-surrogate"])
def test_a_name_that_is_not_utf8_encodable_is_refused_by_every_lock(twin, name):
    # Seen: accepted by every constructor; RedisLock's acquire then failed with a bare
    # UnicodeEncodeError ("surrogates not allowed") that named no lock. Keys go out as UTF-8.
    for make in redis_locks(twin).values():
        with pytest.raises(ValueError, match="UTF-8"):
            make(name)
    with pytest.raises(ValueError, match="UTF-8"):
        EtcdLock(ETCD, name)
    with pytest.raises(ValueError, match="UTF-8"):
        ZooKeeperLock(ZooKeeperClient(["127.0.0.1:9"]), name)


@pytest.mark.parametrize("name", ["é锁", "a*", "a?", "a[b", "{sku}", "x\x00y"])
def test_non_ascii_names_and_glob_or_brace_characters_are_accepted(twin, name):
    for make in redis_locks(twin).values():
        assert make(name).name == name


def test_an_etcd_lock_name_with_a_slash_is_refused():
    # Seen: "shop/sku" held blocked an unrelated lock "shop" (its keys are under "shop/").
    with pytest.raises(ValueError, match="'/'"):
        EtcdLock(ETCD, "shop/sku")
    assert EtcdLock(ETCD, "flashsale:lock:phone-x").prefix == "flashsale:lock:phone-x/"


@pytest.mark.parametrize("name", [".", ".."])
def test_a_zookeeper_lock_name_that_is_a_relative_path_is_refused(name):
    # Seen: accepted, then acquire raised kazoo's bare "ValueError: relative paths not allowed".
    with pytest.raises(ValueError, match=r"ZooKeeper lock name"):
        ZooKeeperLock(ZooKeeperClient(["127.0.0.1:9"]), name)
    assert ZooKeeperLock(ZooKeeperClient(["127.0.0.1:9"]), "...").path.endswith("/...")


@pytest.mark.parametrize(
    "name", ["a\x00", "a\x01b", "a\x7f", "a\x9f", "a\ue000", "a\uf8ff", "a\ufff0", "a\uffff", "a\U0001f512"], ids=repr
)
def test_a_zookeeper_lock_name_with_a_character_zookeeper_refuses_is_refused(name):
    # Seen: accepted, then every acquire was NotAcquired ("ZooKeeper refused the request:
    # BadArgumentsError()"), which the shop answers as busy: ZooKeeper refuses control characters,
    # U+007F-U+009F, U+D800-U+F8FF and U+FFF0-U+FFFF in a path, and so every character beyond
    # U+FFFF (Java's UTF-16 surrogates), each tried on the ensemble of tests/locks/test_zookeeper.py.
    with pytest.raises(ValueError, match="ZooKeeper lock name"):
        ZooKeeperLock(ZooKeeperClient(["127.0.0.1:9"]), name)
    assert ZooKeeperLock(ZooKeeperClient(["127.0.0.1:9"]), "é锁\u00a0\uf900\uffef").name == "é锁\u00a0\uf900\uffef"


def test_an_etcd_or_zookeeper_lock_name_longer_than_64_kib_is_refused():
    # Seen with a 1.6 MB name: etcd took the put past its request limit as a member not answering
    # (QuorumUnavailable after the whole timeout), and the put's unknown outcome retired the
    # process's session, so every other lock the process held lost its lease within a TTL;
    # ZooKeeper dropped the connection at each try (90 suspensions in 2 s), so every holder in the
    # process had to look again before writing.
    longest = "x" * (64 * 1024 - 3) + "锁"  # 64 KiB of UTF-8
    assert EtcdLock(ETCD, longest).name == longest
    assert ZooKeeperLock(ZooKeeperClient(["127.0.0.1:9"]), longest).name == longest
    with pytest.raises(ValueError, match="65536 bytes"):
        EtcdLock(ETCD, longest + "x")
    with pytest.raises(ValueError, match="65536 bytes"):
        ZooKeeperLock(ZooKeeperClient(["127.0.0.1:9"]), longest + "x")


# --- numbers at construction -------------------------------------------------------------------

#: Not a whole number of ms, at or below the drift allowance (1 % + 2 ms), or past what every
#: script computes exactly (2**31 - 1).
BAD_TTLS = [0, -1, 1, 2, 0.5, 2.5, NAN, INF, "10000", None, True, 2**31, 2**63]


@pytest.mark.parametrize("ttl_ms", BAD_TTLS, ids=repr)
def test_a_redis_lock_ttl_that_is_not_a_whole_number_above_the_drift_allowance_is_refused(twin, ttl_ms):
    # Seen: ttl_ms=1 or 2 granted a lease already expired; Redlock ttl_ms=2 retried until its
    # timeout; 0.5 and 2**63 "QuorumUnavailable: the node did not answer: invalid expire time";
    # NaN, inf, "10000": bare ValueError, OverflowError, TypeError without the lock's name.
    for make in redis_locks(twin).values():
        with pytest.raises(ValueError, match="ttl_ms") as refused:
            make("flashsale:lock:sku", ttl_ms=ttl_ms)
        assert "flashsale:lock:sku" in str(refused.value)


def test_a_redis_lock_ttl_that_is_a_whole_number_is_kept_as_an_int(twin):
    for make in redis_locks(twin).values():
        for ttl_ms, kept in [(3, 3), (10_000.0, 10_000), (2**31 - 1, 2**31 - 1)]:
            lock = make("flashsale:lock:sku", ttl_ms=ttl_ms)
            assert lock.ttl_ms == kept and type(lock.ttl_ms) is int


@pytest.mark.parametrize("timeout_ms", [-1, NAN, INF, "5000", None], ids=repr)
def test_an_acquire_timeout_that_is_not_a_finite_number_of_0_or_more_is_refused_by_every_lock(twin, timeout_ms):
    # Seen: NaN accepted by all four locks, and acquire then waited forever (every comparison with
    # NaN is False).
    for make in redis_locks(twin).values():
        with pytest.raises(ValueError, match="timeout_ms"):
            make("flashsale:lock:sku", timeout_ms=timeout_ms)
    with pytest.raises(ValueError, match="timeout_ms"):
        EtcdLock(ETCD, "flashsale:lock:sku", timeout_ms=timeout_ms)
    with pytest.raises(ValueError, match="timeout_ms"):
        ZooKeeperLock(ZooKeeperClient(["127.0.0.1:9"]), "flashsale:lock:sku", timeout_ms=timeout_ms)


@pytest.mark.parametrize("ttl_ms", [0, -1, 0.5, NAN, INF, "10000", 2**63], ids=repr)
def test_an_etcd_ttl_that_is_not_a_positive_whole_number_is_refused(ttl_ms):
    with pytest.raises(ValueError, match="ttl_ms"):
        EtcdLock(ETCD, "flashsale:lock:sku", ttl_ms=ttl_ms)


@pytest.mark.parametrize("node_timeout_ms", [-5, 0, NAN, INF, "50", 2**31], ids=repr)
def test_a_redlock_node_timeout_that_is_not_positive_and_finite_is_refused(twin, node_timeout_ms):
    # Seen: -5 accepted (every round "did not answer within -5 ms"); 0 silently meant 50 ms.
    with pytest.raises(ValueError, match="node_timeout_ms"):
        redis_locks(twin)["Redlock"]("flashsale:lock:sku", node_timeout_ms=node_timeout_ms)
    lock = redis_locks(twin)["Redlock"]("flashsale:lock:sku", node_timeout_ms=0.5)
    assert lock.node_timeout_s == 0.0005


@pytest.mark.parametrize(
    ("argument", "value"),
    [
        ("retry_delay_ms", -1),
        ("retry_delay_ms", NAN),
        ("retry_delay_ms", INF),
        ("retry_delay_ms", "10"),
        ("max_extensions", -1),
        ("max_extensions", 1.5),
        ("max_extensions", NAN),
        ("max_renewals", -1),
        ("max_renewals", 2.5),
        ("max_renewals", None),
    ],
    ids=repr,
)
def test_a_negative_or_non_finite_retry_delay_or_limit_is_refused(twin, argument, value):
    # Seen: retry_delay_ms=-1 with wait="poll": the blocking twin raised a bare "sleep length must
    # be non-negative" at acquire, the asyncio one sent thousands of EVALSHA a second; negative
    # limits were accepted.
    for make in redis_locks(twin).values():
        with pytest.raises(ValueError, match=argument):
            make("flashsale:lock:sku", wait="poll", **{argument: value})


@pytest.mark.parametrize("session_ms", [-1, 0, 0.5, NAN, INF, "10000", 2**31], ids=repr)
def test_a_zookeeper_session_that_is_not_a_positive_whole_number_is_refused_by_the_client(session_ms):
    # Seen: ZooKeeperClient(session_ms=-1) accepted; the lock then said "ttl_ms must be positive,
    # got -1", an argument it does not take.
    with pytest.raises(ValueError, match="session_ms"):
        ZooKeeperClient(["127.0.0.1:9"], session_ms=session_ms)
    assert ZooKeeperClient(["127.0.0.1:9"], session_ms=10_000.0).session_ms == 10_000


# --- extend and advance_fence ------------------------------------------------------------------


def held_locks(twin, cluster, name):
    """A RedisLock on the first private node and a Redlock on all five, each holding a 10 s lease."""
    nodes, sync_clients = cluster
    ports = [node.port for node in nodes]
    redlock = twin.Redlock(
        twin.clients(ports), f"{name}-redlock", ttl_ms=10_000, timeout_ms=0, node_timeout_ms=ROOMY_NODE_TIMEOUT_MS
    )
    locks = [
        (twin.RedisLock(twin.client(ports[0]), name, ttl_ms=10_000, timeout_ms=0), sync_clients[:1]),
        (redlock, sync_clients),
    ]
    for lock, _ in locks:
        twin(lock.acquire())
    return locks


@pytest.mark.parametrize("ttl_ms", [0, -1, 0.5, 2, NAN, INF, "1000", 2**31], ids=repr)
def test_an_extend_to_a_ttl_not_a_whole_number_above_the_drift_allowance_is_refused(twin, cluster, name, ttl_ms):
    # Seen: RedisLock.extend(ttl_ms=-1) returned normally and the key was deleted (PEXPIRE -1);
    # Redlock.extend(-1) deleted it on every node, then raised "NotOwned: extend confirmed by 5 of
    # 5 nodes ..., 3 needed" while lease.remaining_ms() still said ~9.9 s; 0.5 did as -1; 0
    # silently meant the lock's TTL.
    for lock, clients in held_locks(twin, cluster, name):
        lease = lock.lease
        with pytest.raises(ValueError, match="ttl_ms") as refused:
            twin(lock.extend(ttl_ms=ttl_ms))
        assert lock.name in str(refused.value)
        assert lock.lease == lease and lease.remaining_ms() > 9_000
        assert all(client.pttl(lock.name) > 9_000 for client in clients), "the keys were touched"
        extended = twin(lock.extend(ttl_ms=20_000.0))  # a whole number still extends, and None is the TTL
        assert extended.remaining_ms() > 19_000 and twin(lock.extend()).remaining_ms() < 10_001
        twin(lock.release())


@pytest.mark.parametrize("past", [-1, 2**53, 2**53 + 5, 2**63, NAN, INF, 1.9, "5", None, True], ids=repr)
def test_an_advance_past_a_fence_the_scripts_cannot_pass_exactly_is_refused(twin, cluster, name, past):
    # Seen: past=2**53 returned 2**53 (not above it: Lua computes in doubles), 2**53+5 returned
    # 2**53+4, 2**63 a misleading NotOwned, NaN a bare ValueError, 1.9 silently became 1.
    for lock, clients in held_locks(twin, cluster, name):
        lease = lock.lease
        with pytest.raises(ValueError, match="past") as refused:
            twin(lock.advance_fence(past))
        assert lock.name in str(refused.value)
        assert lock.lease == lease
        assert all(client.get(f"{lock.name}:fence") == b"1" for client in clients), "a counter moved"
        twin(lock.release())


def test_an_advance_past_the_largest_exact_fence_returns_the_next_one(twin, cluster, name):
    for lock, _ in held_locks(twin, cluster, name):
        assert twin(lock.advance_fence(5.0)) == 6
        assert twin(lock.advance_fence(2**53 - 1)) == 2**53 == lock.lease.fence
        twin(lock.release())


# --- Redlock's nodes ---------------------------------------------------------------------------


def test_a_redlock_given_one_node_twice_is_refused(twin):
    # Seen: Redlock([c, c, c]) accepted, and never acquired ("not acquired within 500 ms"): the
    # first node's grant made its other two copies refuse, so no majority could form.
    client = twin.client(PORT)
    with pytest.raises(ValueError, match=rf"127\.0\.0\.1:{PORT}.*more than once"):
        twin.Redlock([client, client, client], "flashsale:lock:sku")
    # Two client objects for the same host, port and database are one node too.
    with pytest.raises(ValueError, match=rf"127\.0\.0\.1:{PORT}"):
        twin.Redlock([twin.client(PORT), twin.client(PORT + 1), twin.client(PORT)], "flashsale:lock:sku")
    redis_cls = type(client)
    same_db = [redis_cls(host="127.0.0.1", port=PORT, db=3), redis_cls(host="127.0.0.1", port=PORT, db=3)]
    with pytest.raises(ValueError, match="more than once"):
        twin.Redlock(same_db, "flashsale:lock:sku")
    unix = [redis_cls(unix_socket_path="/tmp/no-such.sock"), redis_cls(unix_socket_path="/tmp/no-such.sock")]
    with pytest.raises(ValueError, match="unix:/tmp/no-such.sock"):
        twin.Redlock(unix, "flashsale:lock:sku")
    # Other ports are other nodes.
    assert twin.Redlock(twin.clients([PORT, PORT + 1, PORT + 2]), "flashsale:lock:sku").quorum == 2


def test_a_redlock_given_one_server_under_two_databases_or_two_names_is_refused(twin):
    # Seen: Redlock over db 3, db 4 and db 5 of one server was accepted with a quorum of 2: one
    # process failing (or restarting without persistence) took every "node" with it, so the
    # majority Redlock's safety rests on was one machine's. Two names of loopback are one server too.
    redis_cls = type(twin.client(PORT))
    tcp = [redis_cls(host="127.0.0.1", port=PORT, db=db) for db in (3, 4, 5)]
    with pytest.raises(ValueError, match=rf"server 127\.0\.0\.1:{PORT} is given more than once") as refused:
        twin.Redlock(tcp, "flashsale:lock:sku")
    assert "clients 0 and 1" in str(refused.value) and "'flashsale:lock:sku'" in str(refused.value)
    with pytest.raises(ValueError, match=rf"server 127\.0\.0\.1:{PORT} is given more than once"):
        twin.Redlock([*twin.clients([PORT + 1, PORT + 2]), tcp[0], twin.client(PORT + 3), tcp[1]], "x")
    unix = [redis_cls(unix_socket_path="/tmp/no-such.sock", db=db) for db in (1, 2, 3)]
    with pytest.raises(ValueError, match="server unix:/tmp/no-such.sock is given more than once"):
        twin.Redlock(unix, "flashsale:lock:sku")
    for alias in ("localhost", "LOCALHOST", "::1", "0:0:0:0:0:0:0:1", "::ffff:127.0.0.1"):
        aliased = [twin.client(PORT), redis_cls(host=alias, port=PORT, db=2), twin.client(PORT + 1)]
        with pytest.raises(ValueError, match=rf"server 127\.0\.0\.1:{PORT} is given more than once"):
            twin.Redlock(aliased, "flashsale:lock:sku")


def test_a_redlock_over_nodes_once_accepted_still_refuses_a_list_that_repeats_one(twin):
    # Construction remembers the last node list it found distinct (a Redlock is built per
    # purchase): a list with one of those nodes twice, or reordered, is still checked.
    clients = twin.clients([PORT, PORT + 1, PORT + 2])
    for _ in range(2):
        assert twin.Redlock(clients, "flashsale:lock:sku").quorum == 2
    assert twin.Redlock(clients[::-1], "flashsale:lock:sku").quorum == 2
    with pytest.raises(ValueError, match=rf"127\.0\.0\.1:{PORT + 2}.* more than once"):
        twin.Redlock([*clients, clients[2]], "flashsale:lock:sku")
    redis_cls = type(clients[0])
    with pytest.raises(ValueError, match=rf"127\.0\.0\.1:{PORT + 1} is given more than once"):
        twin.Redlock([*clients[:2], redis_cls(host="127.0.0.1", port=PORT + 1, db=7)], "flashsale:lock:sku")
    assert twin.Redlock(clients, "flashsale:lock:sku").quorum == 2
