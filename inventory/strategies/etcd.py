"""``etcd``: a 3-member etcd cluster; etcd's mutex recipe with the lock key's create revision as fence.

Each process keeps one session lease alive; a purchase puts a key bound to it under
``flashsale:lock:{<sku>}/``, owns the lock when its key has the lowest create revision, and
otherwise watches the key just before its own until it is deleted (no polling). Every grant
is a raft commit on a majority (fsync included), so the lock survives one member of three
down, and with two down the shopper is told busy within ``ACQUIRE_TIMEOUT_MS``.

What can still go wrong: a holder paused longer than the session lease (``LOCK_TTL_MS``)
loses its key, the next waiter is granted, and the paused holder still believes it holds the
lock. Its fence is the older create revision, so the storage check refuses the late write.
Revisions only grow while the cluster's data lives (``RUN_DIR/etcd``); a wiped cluster starts
again from revision 1, below the fences already on the rows, so purchases are refused (busy)
until the sale is reset. There is no ``advance_fence``: etcd has no counter to raise.
"""

from __future__ import annotations

from django.core import checks

from locks.etcd import EtcdLock
from locks.etcd_client import EtcdClient

from .contract import Needed
from .fenced import FencedLockStrategy


class EtcdLockStrategy(FencedLockStrategy):
    name = "etcd"
    guard_label = "etcd: session lease, lowest create revision, watch"
    check_label = "fence (create revision) + version"
    loop_refusal = "etcd3gw is a blocking client: its waits for the lock would stall the event loop"

    def __init__(self, *, config: dict) -> None:
        super().__init__(config=config)
        self.client = EtcdClient(config["ETCD_ENDPOINTS"])

    def make_lock(self, name: str) -> EtcdLock:
        return EtcdLock(
            self.client, name, ttl_ms=self.config["LOCK_TTL_MS"], timeout_ms=self.config["ACQUIRE_TIMEOUT_MS"]
        )

    @classmethod
    def needs(cls, config: dict) -> list[Needed]:
        return [Needed("etcd", tuple(config["ETCD_ENDPOINTS"]))]

    @classmethod
    def server_env(cls, config: dict) -> dict[str, str]:
        return {"ETCD_ENDPOINTS": ",".join(config["ETCD_ENDPOINTS"])}

    @classmethod
    def checks(cls, config: dict) -> list[checks.CheckMessage]:
        members = len(config["ETCD_ENDPOINTS"])
        if members < 3 or members % 2 == 0:
            return [
                checks.Warning(
                    f"ETCD_ENDPOINTS names {members} etcd members; a majority of them must answer for every grant",
                    hint="use 3 members (one may fail) or 5 (two may fail)",
                    id="inventory.W004",
                )
            ]
        return []

    def close(self) -> None:
        self.client.close()
