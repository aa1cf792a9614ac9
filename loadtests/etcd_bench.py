"""``lockbench``'s etcd rows: acquire + release per second on a private 3-member cluster, fsync on.

* ``floor-etcd``: the raw operations of the recipe with etcd3gw on one member: a put-if-absent
  transaction of a fresh key bound to a session lease granted once, then a delete; no lock
  object, no ownership read, no failover, no timeouts.
* ``ours-etcd``: a new :class:`~locks.etcd.EtcdLock` per acquisition, as the shop uses it.

Both are two raft commits per cycle, each fsynced on a majority: the disk bounds them, not the
client. Slices of the two rows alternate so machine noise hits both alike.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Callable

import etcd3gw

from locks.etcd import EtcdLock
from locks.etcd_client import EtcdClient
from processes.etcd_cluster import EtcdCluster

from .bench import alternate

LOCK_NAME = "lockbench:etcd"
TTL_MS = 10_000
#: The acquire's timeout: no one else holds the lock, so it bounds only a stall of the service, as
#: nothing bounds the floor's own calls (with 0, a ZooKeeper create that took over a second ended
#: a whole lockbench run in a traceback).
STALL_MS = 5_000
# On the project's disk, like the shop's cluster: the rate is the disk's fsync rate.
RUN_DIR = Path(__file__).resolve().parents[1] / ".run" / "lockbench-etcd"


def _floor(endpoint_port: int, seconds: float) -> Callable[[], None]:
    client = etcd3gw.Etcd3Client(host="127.0.0.1", port=endpoint_port, api_path="/v3/")
    # Long enough for the whole run, so that the floor needs no keepalive.
    lease = client.lease(ttl=int(2 * seconds) + 60)

    def op() -> None:
        key = f"{LOCK_NAME}/floor/{os.urandom(16).hex()}"
        if not client.create(key, "", lease=lease):
            raise RuntimeError("put-if-absent of a fresh key was refused")
        client.delete(key)

    return op


def _ours(client: EtcdClient) -> Callable[[], None]:
    def op() -> None:
        lock = EtcdLock(client, LOCK_NAME, ttl_ms=TTL_MS, timeout_ms=STALL_MS)
        lock.acquire()
        lock.release()

    return op


def etcd_rows(seconds: float, base_port: int) -> list[dict]:
    """Start a new cluster on ``base_port``..+2 (peers +3..+5), measure each row for ``seconds``, remove it.

    Rows: ``{"name", "ops_per_s", "us_per_op"}``, as lockbench's other uncontended rows.
    """
    cluster = EtcdCluster(client_ports=[base_port + i for i in range(3)], run_dir=RUN_DIR, peer_offset=3)
    cluster.wipe()
    cluster.start()
    client = EtcdClient(cluster.endpoints)
    try:
        return alternate({"floor-etcd": _floor(base_port, seconds), "ours-etcd": _ours(client)}, seconds)
    finally:
        client.close()
        cluster.wipe()
