"""processes.replication: a real master + replica; holding the stream delays writes, a failover loses them."""

from __future__ import annotations

import socket

import pytest
import redis

from processes.nodes import NodeError, RedisNode
from processes.replication import ReplicatedPair
from tests import slots

BASE_PORT = slots.REPLICATION_BASE_PORT  # this module's own master + replica, and a foreign node after them


@pytest.fixture
def pair(tmp_path):
    with ReplicatedPair(base_port=BASE_PORT, run_dir=tmp_path / "pair") as pair:
        yield pair


def test_a_held_stream_reaches_the_replica_only_when_released(pair):
    master, replica = pair.master.client(), pair.replica.client()
    pair.hold_replication()
    master.set("k", 1)
    assert replica.get("k") is None
    master_offset, replica_offset = pair.offsets()
    assert master_offset > replica_offset
    pair.release_replication()
    pair.wait_in_sync()
    assert replica.get("k") == b"1"


def test_fail_over_drops_the_held_writes_and_the_front_follows_the_primary(pair):
    front = redis.Redis.from_url(pair.front.url, socket_timeout=1.0)
    front.set("replicated", 1)
    pair.wait_in_sync()
    pair.hold_replication()
    front.set("held", 1)
    assert front.info("server")["tcp_port"] == pair.master.port
    pair.fail_over()
    assert not pair.master.ping() and pair.primary is pair.replica
    front = redis.Redis.from_url(pair.front.url, socket_timeout=1.0)
    assert front.info("server")["tcp_port"] == pair.replica.port
    assert (front.get("replicated"), front.get("held")) == (b"1", None)
    assert pair.running()


@pytest.mark.slow  # a foreign server started and waited for (2 s)
def test_a_port_held_by_a_server_the_pair_did_not_start_is_refused(tmp_path):
    foreign = RedisNode(port=BASE_PORT + 3, run_dir=tmp_path / "foreign")
    foreign.start()
    try:
        pair = ReplicatedPair(base_port=BASE_PORT + 2, run_dir=tmp_path / "pair")
        with pytest.raises(NodeError, match=f"port {BASE_PORT + 3} is taken by a redis-server this pair did not"):
            pair.start()
        pair.stop()
        assert foreign.ping()
    finally:
        foreign.stop()


def test_stop_closes_the_relays_and_the_nodes(tmp_path):
    pair = ReplicatedPair(base_port=BASE_PORT, run_dir=tmp_path / "pair")
    pair.start()
    front_port = pair.front.port
    pair.stop()
    assert not pair.master.ping() and not pair.replica.ping()
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", front_port), timeout=1.0)


def test_a_node_refuses_a_port_that_another_run_s_server_holds(tmp_path):
    """Two runs on one port would share a node, each flushing, killing and restarting the other's
    (a second daemonized redis-server on a busy port exits 0 and writes no pidfile): a node whose
    port answers without a live pid in its own pidfile refuses to start, and leaves the other be."""
    port = BASE_PORT + 4
    other = RedisNode(port=port, run_dir=tmp_path / "other")
    other.start()
    try:
        mine = RedisNode(port=port, run_dir=tmp_path / "mine")
        with pytest.raises(NodeError, match=f"port {port} is taken by a redis-server this run did not start"):
            mine.start()
        assert other.ping() and other.pid() is not None and mine.pid() is None
    finally:
        other.stop()
