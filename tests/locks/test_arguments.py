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
