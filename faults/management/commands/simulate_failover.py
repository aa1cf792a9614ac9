"""A single Redis fails over and grants one lock twice; the fence lets one write land; Redlock does not grant twice.

Narrated step by step against real processes: a private master and replica
(:class:`processes.replication.ReplicatedPair`, the replica following the master through a relay
that can hold the replication stream), then five private Redlock nodes of which the first is such
a pair.

Single Redis: an earlier holder takes and releases the lock (replicated: the replica's fence
counter is 1); the replication stream is held (Redis replicates asynchronously; here the link is
slow); A locks on the master (fence 2) and reads the shelf; the master is killed before the
stream reaches the replica; the replica is promoted with ``REPLICAOF NO ONE`` (by hand: what
Sentinel does after ``down-after-milliseconds``); B locks the same name on it and is granted while
A's lease is still valid: two holders. The promoted counter never saw A's increment, so B's fence
is 2 too, not newer than A's. A writes; B's write is refused by the storage check (the row is not
what B read, and B's token is not newer than the row's fence). With ``--unfenced`` both writes land
and the audit shows one unit oversold.

Redlock, same steps: node 0 fails over the same way and forgets A's key, but A's key is still on
the other four nodes, so B gets one vote of five and is refused.

Exit status: 0 when every step held. Without ``--unfenced`` that means one write landed and nothing
was oversold; with ``--unfenced`` it means the oversell was shown (both writes landed, the audit
counts 1 unit oversold), as the demo intends. Any other outcome exits 1 naming the steps.
"""

from __future__ import annotations

import uuid
from pathlib import Path

import redis
from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from faults.demos import Holder, Narrator, audit_line, demo_redlock, reset_product, why_refused, write_order
from inventory.errors import InventoryError
from inventory.models import Product
from inventory.strategies.section import read_shelf
from locks import NotAcquired, RedisLock
from processes.nodes import NodeError, RedisNodes
from processes.ports import SIMULATE_FAILOVER_BASE_PORT
from processes.protocol import started_while_needed
from processes.replication import ReplicatedPair

SKU = "simulate-failover"
REDLOCK_SKU = "simulate-failover-redlock"
STOCK = 10
TTL_MS = 10_000


class Command(BaseCommand):
    help = "Narrate a Redis master failing over before the lock replicated: two holders, and what the fence does."

    def add_arguments(self, parser):
        parser.add_argument(
            "--unfenced",
            action="store_true",
            help="turn the storage check off: both holders' writes land (shows the oversell)",
        )
        parser.add_argument(
            "--base-port",
            type=int,
            default=SIMULATE_FAILOVER_BASE_PORT,
            help="first of 8 private ports: the pair, then node 0's pair and four Redlock nodes",
        )

    def handle(self, *args, unfenced: bool, base_port: int, **options):
        if not 1024 <= base_port <= 65535 - 7:
            raise CommandError(f"--base-port {base_port}: use a port from 1024 to {65535 - 7}")
        self.narrator = Narrator(self.stdout)
        self.fenced = not unfenced
        run_dir = Path(settings.RUN_DIR) / "simulate-failover"
        try:
            with ReplicatedPair(base_port=base_port, run_dir=run_dir) as pair:
                self.single_redis(pair)
            others = RedisNodes(base_port=base_port + 4, count=4, run_dir=run_dir)
            with ReplicatedPair(base_port=base_port + 2, run_dir=run_dir) as pair, started_while_needed(others):
                self.redlock(pair, others)
        except (NodeError, InventoryError) as exc:  # a node, or the shop's Redis the reset needs, down
            raise CommandError(str(exc)) from exc
        self.narrator.check()
        if self.fenced:
            self.narrator.say(
                "every step held: the single Redis granted the lock twice, the fence let one write "
                "land, nothing was oversold; Redlock did not grant twice"
            )
        else:
            self.narrator.say(
                "every step held (unfenced): the single Redis granted the lock twice and both writes "
                "landed; the audit shows the oversell the fence prevents (exit 0: the damage was shown)"
            )

    def single_redis(self, pair: ReplicatedPair) -> None:
        say, step, note = self.narrator.say, self.narrator.step, self.narrator.note
        name = f"flashsale:lock:{SKU}:{uuid.uuid4().hex[:8]}"
        product = reset_product(sku=SKU, name="Failover demonstration", stock=STOCK)
        check = "storage check ON (fence)" if self.fenced else "storage check OFF (--unfenced)"
        say(
            f"one Redis: master {pair.master.port}, replica {pair.replica.port} following it through a relay; "
            f"product {SKU!r} stock {STOCK}, fence 0; lock {name!r}, TTL {TTL_MS} ms; {check}"
        )
        master = pair.master.client(socket_timeout=2.0)
        replica = pair.replica.client(socket_timeout=2.0)
        front = redis.Redis.from_url(pair.front.url, socket_timeout=2.0)
        try:
            earlier = RedisLock(master, name, ttl_ms=TTL_MS, timeout_ms=0)
            earlier.acquire()
            earlier.release()
            pair.wait_in_sync()
            step(
                int(replica.get(f"{name}:fence") or 0) == 1,
                "an earlier holder took and released the lock (fence 1); the replica has it: its counter is 1",
            )

            lock_a, lease_a, shelf_a = self.a_locks_unreplicated(pair, master, replica, name, product)

            pair.kill_master()
            note("the master is killed (SIGKILL) before the held stream reached the replica; that stream is lost")
            pair.promote()
            pair.front.retarget(pair.replica.port)
            role = replica.info("replication")["role"]
            step(
                role == "master" and replica.get(name) is None,
                "the replica is promoted (REPLICAOF NO ONE, by hand: what Sentinel does after "
                "down-after-milliseconds); clients' address now leads to it; it has no lock key",
            )

            lock_b = RedisLock(front, name, ttl_ms=TTL_MS, timeout_ms=0)
            lease_b = lock_b.acquire()
            shelf_b = read_shelf(product.pk)
            step(
                lease_a.remaining_ms() > 0,
                f"B locks the same name on the promoted replica: granted, fence {lease_b.fence}, while A's lease is "
                f"still valid for {lease_a.remaining_ms():.0f} ms: TWO HOLDERS, as the Redis docs warn",
            )
            if lease_b.fence <= lease_a.fence:
                note(
                    f"B's fence {lease_b.fence} is not newer than A's {lease_a.fence}: the promoted replica's "
                    f"counter never saw A's increment; the storage check refuses a token not newer than the row's"
                )
            note(f"B reads stock {shelf_b.stock}: the same stock A read")

            self.both_write(product, Holder(lock_a, lease_a, shelf_a), Holder(lock_b, lease_b, shelf_b))
            lock_b.release()
        finally:
            for client in (master, replica, front):
                client.close()

    def a_locks_unreplicated(
        self, pair: ReplicatedPair, master: redis.Redis, replica: redis.Redis, name: str, product: Product
    ) -> Holder:
        """With replication held, A takes the lock on the master; the replica never sees it."""
        step, note = self.narrator.step, self.narrator.note
        pair.hold_replication()
        note(
            "the replication stream is now held in the link: Redis acknowledges writes before any replica has "
            "them (replication is asynchronous); here the link is slow"
        )
        lock_a = RedisLock(master, name, ttl_ms=TTL_MS, timeout_ms=0)
        lease_a = lock_a.acquire()
        shelf_a = read_shelf(product.pk)
        step(
            lease_a.fence == 2,
            f"A locks on the master: granted, fence {lease_a.fence}; A reads stock {shelf_a.stock}",
        )
        master_offset, replica_offset = pair.offsets()
        on_replica = replica.get(name)
        step(
            on_replica is None and master_offset > replica_offset,
            f"the replica has not seen A's lock: key absent there, replication offset {replica_offset} "
            f"behind the master's {master_offset}",
        )
        return Holder(lock_a, lease_a, shelf_a)

    def both_write(self, product: Product, a: Holder, b: Holder) -> None:
        """A, then B, writes what it decided under its lease; then the audit."""
        step, note = self.narrator.step, self.narrator.note
        shelf_a, lease_a, shelf_b, lease_b = a.shelf, a.lease, b.shelf, b.lease
        a_landed = write_order(
            shelf_a, customer="A", quantity=1, token=lease_a.fence, fenced=self.fenced, strategy="redis"
        )
        step(
            a_landed,
            f"A writes stock {shelf_a.stock} -> {shelf_a.stock - 1} with token {lease_a.fence}: "
            f"accepted, A's order written",
        )
        b_landed = write_order(
            shelf_b, customer="B", quantity=1, token=lease_b.fence, fenced=self.fenced, strategy="redis"
        )
        if self.fenced:
            refusal = why_refused(shelf_b, lease_b.fence)
            step(
                not b_landed,
                f"B writes stock {shelf_b.stock} -> {shelf_b.stock - 1} with token "
                f"{lease_b.fence}: REFUSED by the storage check: {refusal}; "
                f"B's transaction rolls back",
            )
            note(
                "in a purchase the strategy then tries to recover (FencedLockStrategy.recover): it asks the lock "
                "to raise its counter past the row's fence while B still holds the lock, and runs B's section "
                "again from a fresh read; without that, B's shopper is told busy. B's stale write never lands"
            )
        else:
            step(
                b_landed,
                f"B writes stock {shelf_b.stock} -> {shelf_b.stock - 1} with token {lease_b.fence}: "
                f"LANDS, nothing checks it (storage check off); B's order written",
            )
        oversold, line = audit_line(SKU)
        expected = 0 if self.fenced else 1
        stock = read_shelf(product.pk).stock
        step(
            oversold == expected and stock == STOCK - 1,
            f"{line}; stock {stock}" + ("" if self.fenced else " -- the oversell the fence prevents"),
        )

    def redlock(self, pair: ReplicatedPair, others: RedisNodes) -> None:
        say, step = self.narrator.say, self.narrator.step
        name = f"flashsale:lock:{SKU}:{uuid.uuid4().hex[:8]}"
        product = reset_product(sku=REDLOCK_SKU, name="Failover demonstration (Redlock)", stock=STOCK)
        say(
            f"Redlock, the same steps: node 0 is master {pair.master.port} with replica {pair.replica.port}, "
            f"nodes 1-4 on {others[0].port}-{others[-1].port}; product {REDLOCK_SKU!r} stock {STOCK}; lock {name!r}"
        )
        before = [pair.master.client(socket_timeout=2.0)] + [node.client(socket_timeout=2.0) for node in others]
        after = [pair.replica.client(socket_timeout=2.0)] + before[1:]
        try:
            earlier = demo_redlock(before, name, ttl_ms=TTL_MS)
            earlier.acquire()
            earlier.release()
            pair.wait_in_sync()
            pair.hold_replication()
            lock_a = demo_redlock(before, name, ttl_ms=TTL_MS)
            lease_a = lock_a.acquire()
            shelf_a = read_shelf(product.pk)
            holding = sum(1 for client in before if client.get(name) == lease_a.token.encode())
            step(
                holding == 5,
                f"A locks: granted by {holding} of 5 nodes, fence {lease_a.fence}; node 0's replication stream is held",
            )
            pair.kill_master()
            pair.promote()
            step(
                after[0].get(name) is None,
                "node 0's master dies before replicating; its replica is promoted (REPLICAOF NO ONE) without A's key",
            )
            lock_b = demo_redlock(after, name, ttl_ms=TTL_MS)
            try:
                lock_b.acquire()
                refused = ""
            except NotAcquired as exc:
                refused = str(exc)
            holding = sum(1 for client in after if client.get(name) == lease_a.token.encode())
            step(
                bool(refused) and holding == 4,
                f"B tries the same name: {'refused' if refused else 'GRANTED'}; only node 0 could say yes, A's key "
                f"is still on {holding} of the other 4 nodes and a grant needs 3 of 5",
            )
            landed = write_order(
                shelf_a, customer="A", quantity=1, token=lease_a.fence, fenced=self.fenced, strategy="redlock"
            )
            oversold, line = audit_line(REDLOCK_SKU)
            step(landed and oversold == 0, f"A, the only holder, writes with token {lease_a.fence}: accepted; {line}")
            lock_a.release()
        finally:
            for client in before + after[:1]:
                client.close()
