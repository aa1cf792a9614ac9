"""``lockbench``'s ZooKeeper rows: acquire + release per second on a private 3-member ensemble, fsync on.

* ``floor-zookeeper``: the raw operations of the recipe with kazoo on one member: create an
  ephemeral sequential znode under the lock's path, then delete it; no lock object, no look at
  the other contenders, no failover, no time limits.
* ``ours-zookeeper``: a new :class:`~locks.zookeeper.ZooKeeperLock` per acquisition, as
  the shop uses it: the create, one ``getChildren`` to see it is the lowest, the delete.

Both are two ZooKeeper writes per cycle, each fsynced on a majority of the members. Slices of the
two rows alternate (:func:`~loadtests.bench.alternate`) so machine noise hits both alike.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Callable

from kazoo.client import KazooClient

from locks.zookeeper import LOCK_ROOT, ZooKeeperClient, ZooKeeperLock
from processes.zookeeper_ensemble import ZooKeeperEnsemble

from .bench import alternate

LOCK_NAME = "lockbench:zookeeper"
SESSION_MS = 10_000
#: The acquire's timeout: no one else holds the lock, so it bounds only a stall of the service, as
#: nothing bounds the floor's own calls (with 0, a ZooKeeper create that took over a second ended
#: a whole lockbench run in a traceback).
STALL_MS = 5_000
# On the project's disk, like the shop's ensemble: the rate is the disk's fsync rate.
RUN_DIR = Path(__file__).resolve().parents[1] / ".run" / "lockbench-zookeeper"


def _floor(zk: KazooClient) -> Callable[[], None]:
    path = f"{LOCK_ROOT}/{LOCK_NAME}/floor"
    zk.ensure_path(path)

    def op() -> None:
        zk.delete(zk.create(f"{path}/n-", ephemeral=True, sequence=True))

    return op


def _ours(client: ZooKeeperClient) -> Callable[[], None]:
    def op() -> None:
        lock = ZooKeeperLock(client, LOCK_NAME, timeout_ms=STALL_MS)
        lock.acquire()
        lock.release()

    return op


def zookeeper_rows(seconds: float, base_port: int) -> list[dict]:
    """Start a new ensemble on ``base_port``..+2 (quorum +10.., election +20..), measure each row for
    ``seconds``, remove it. Rows: ``{"name", "ops_per_s", "us_per_op"}``."""
    ensemble = ZooKeeperEnsemble(client_ports=[base_port + i for i in range(3)], run_dir=RUN_DIR)
    ensemble.wipe()
    ensemble.start()
    raw = KazooClient(hosts=ensemble.hosts[0])
    client = ZooKeeperClient(ensemble.hosts, session_ms=SESSION_MS)
    try:
        raw.start(timeout=10)
        client.kazoo(time.monotonic() + 10)
        return alternate({"floor-zookeeper": _floor(raw), "ours-zookeeper": _ours(client)}, seconds)
    finally:
        raw.stop()
        raw.close()
        client.close()
        ensemble.wipe()
