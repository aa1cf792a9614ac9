"""``zookeeper``: a 3-member ZooKeeper ensemble; ZooKeeper's lock recipe with the znode's sequence as fence.

Each process holds one ZooKeeper session (timeout ``LOCK_TTL_MS``); a purchase creates an
ephemeral sequential znode under ``/flashsale/locks/flashsale:lock:{<sku>}``, owns the lock when
its sequence is the lowest, and otherwise watches the znode just before its own. Every grant is
a ZooKeeper write committed on a majority (fsynced), so the lock survives one member of three
down, and with two down the shopper is told busy within ``ACQUIRE_TIMEOUT_MS``.

Session loss is lock loss: once the session was suspended or expired after the grant, the
section stops before it writes (busy, rolled back). What can still go wrong: a holder paused
longer than the session timeout loses its znode, the next contender is granted, and the paused
holder may write before it learns of the loss. Its fence is the older sequence, so the storage
check refuses the late write. Sequences grow per SKU while the ensemble's data lives
(``RUN_DIR/zookeeper``); a wiped ensemble starts again from 0, below the fences on the rows, so
purchases are refused (busy) until the sale is reset, as with etcd. There is no
``advance_fence``: the sequence is the server's.
"""

from __future__ import annotations

from django.core import checks

from locks.zookeeper import ZooKeeperClient, ZooKeeperLock

from .contract import Needed
from .fenced import FencedLockStrategy


class ZooKeeperLockStrategy(FencedLockStrategy):
    name = "zookeeper"
    guard_label = "ZooKeeper: session, lowest ephemeral sequential znode, watch"
    check_label = "fence (znode sequence) + version"
    loop_refusal = "kazoo is a blocking client: its waits for the lock would stall the event loop"

    def __init__(self, *, config: dict) -> None:
        super().__init__(config=config)
        self.client = ZooKeeperClient(config["ZOOKEEPER_HOSTS"], session_ms=config["LOCK_TTL_MS"])

    def make_lock(self, name: str) -> ZooKeeperLock:
        return ZooKeeperLock(self.client, name, timeout_ms=self.config["ACQUIRE_TIMEOUT_MS"])

    @classmethod
    def needs(cls, config: dict) -> list[Needed]:
        return [Needed("zookeeper", tuple(config["ZOOKEEPER_HOSTS"]))]

    @classmethod
    def server_env(cls, config: dict) -> dict[str, str]:
        return {"ZOOKEEPER_HOSTS": ",".join(config["ZOOKEEPER_HOSTS"])}

    @classmethod
    def checks(cls, config: dict) -> list[checks.CheckMessage]:
        members = len(config["ZOOKEEPER_HOSTS"])
        if members < 3 or members % 2 == 0:
            return [
                checks.Warning(
                    f"ZOOKEEPER_HOSTS names {members} ZooKeeper members; a majority must answer for every grant",
                    hint="use 3 members (one may fail) or 5 (two may fail)",
                    id="inventory.W005",
                )
            ]
        return []

    def close(self) -> None:
        self.client.close()
