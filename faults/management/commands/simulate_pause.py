"""Kleppmann's pause scenario, run for real against Redis and the database, narrated step by step.

A takes the lock with a short TTL, gets fencing token fA and reads the shelf; A stops for longer
than the TTL (a stop-the-world pause, here a sleep: A does nothing while its lease runs out); B
takes the lock, gets fB > fA, reads the shelf and writes (accepted); A wakes, releases (refused:
B's lock is intact) and writes what it decided before the pause, with fA. The storage check
refuses it: the row is no longer what A read, and fA is not newer than the row's fence fB. B
releases; the audit finds nothing oversold.

``--unfenced`` turns the storage check off: A's late write lands on top of B's, both orders
stand on one unit of stock, and the audit shows one unit oversold (Kleppmann's point: the lock
alone did not protect the write).

Exits 0 only when every step held: without ``--unfenced`` that means the late write was refused
and nothing was oversold; with it, that the late write landed and the audit showed the damage.
``--strategy redis`` uses the shop's Redis (INVENTORY REDIS_URL); ``--strategy redlock`` starts five
private nodes (``--base-port``, 7789 by default) unless they already run, and stops the ones it
started; ``--strategy etcd`` uses the project's cluster (INVENTORY ETCD_ENDPOINTS), starting and
stopping it only if it was down. There A's pause stops its session's keepalive too, as a frozen
process would, and lasts 1.5 × the lease (etcd's shortest is 2 s); A and B each have their own
session, as two processes would. ``--strategy zookeeper`` uses the project's ensemble (INVENTORY
ZOOKEEPER_HOSTS) the same way; A holds its lock in a child process of its own, which is really
frozen (SIGSTOP) for 1.5 × its 1 s session timeout, since kazoo's thread would keep a session of
a merely sleeping A alive.
"""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import redis
from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from faults.demos import Holder, Narrator, audit_line, reset_product, why_refused, write_order
from faults.frozen_holder import ForkedHolder
from inventory.errors import InventoryError
from inventory.models import Product
from inventory.strategies import load_strategy
from inventory.strategies.contract import Shelf
from inventory.strategies.fenced import FencedLockStrategy
from inventory.strategies.section import read_shelf
from locks import Lease, NotOwned
from locks.etcd_client import EtcdClient
from locks.zookeeper import ZooKeeperClient
from processes.needs import project_cluster, project_ensemble
from processes.nodes import NodeError, RedisNodes
from processes.ports import SIMULATE_PAUSE_BASE_PORT
from processes.protocol import started_while_needed

SKU = "simulate-pause"
STOCK = 10
TTL_MS = 500
PAUSE_S = TTL_MS / 1000 * 1.5
ZOOKEEPER_SESSION_MS = 1000  # the ensemble's least is 400 ms; 1 s leaves room on a loaded machine


class Command(BaseCommand):
    help = "Narrate a lock holder pausing past its TTL: its release is ignored and its late write refused by storage."

    def add_arguments(self, parser):
        parser.add_argument(
            "--strategy",
            "--backend",  # the older name, still accepted
            dest="strategy",
            choices=["redis", "redlock", "etcd", "zookeeper"],
            default="redis",
            help="the lock to pause under (older name: --backend)",
        )
        parser.add_argument(
            "--base-port", type=int, default=SIMULATE_PAUSE_BASE_PORT, help="first of the five Redlock node ports"
        )
        parser.add_argument(
            "--unfenced",
            action="store_true",
            help="turn the storage check off: the late write lands (shows the damage)",
        )

    def handle(self, *args, strategy: str, base_port: int, unfenced: bool, **options):
        if not 1024 <= base_port <= 65535 - 4:  # five nodes, whatever the strategy: bad input is refused
            raise CommandError(f"--base-port {base_port}: use a port from 1024 to {65535 - 4}")
        self.narrator = Narrator(self.stdout)
        self.fenced = not unfenced
        self.strategies: list[FencedLockStrategy] = []
        self.nodes = nodes = RedisNodes(base_port=base_port, count=5, run_dir=Path(settings.RUN_DIR) / "simulate-pause")
        taken = next((node.port for node in nodes if node.taken_by_another()), None) if strategy == "redlock" else None
        if taken is not None:  # checked before any node starts: redis-server would wait 5 s to say "did not answer"
            raise CommandError(
                f"--base-port {base_port}: port {taken} is in use by another program; "
                f"run with another --base-port (it takes {base_port} to {base_port + 4})"
            )
        cluster = {"etcd": project_cluster, "zookeeper": project_ensemble}.get(strategy, lambda: None)()
        try:
            needed = [*nodes] if strategy == "redlock" else [cluster] if cluster is not None else []
            with started_while_needed(needed):
                if strategy == "etcd":
                    clients = [EtcdClient(cluster.endpoints)]
                elif strategy == "zookeeper":
                    clients = [ZooKeeperClient(cluster.hosts, session_ms=ZOOKEEPER_SESSION_MS)]
                elif strategy == "redis":
                    clients = [redis.Redis.from_url(settings.INVENTORY["REDIS_URL"], socket_timeout=2.0)]
                else:
                    clients = [node.client(socket_timeout=2.0) for node in nodes]
                try:
                    self.run_scenario(strategy, clients)
                finally:
                    for client in clients:
                        client.close()
                    for built in self.strategies:
                        built.close()
        except (NodeError, InventoryError) as exc:  # a node, or the shop's Redis the reset needs, down
            raise CommandError(str(exc)) from exc
        self.narrator.check()
        if self.fenced:
            self.narrator.say(f"every step held ({strategy})")
        else:
            self.narrator.say(
                f"every step held ({strategy}, unfenced): the late write landed and the audit shows "
                f"the oversell the storage check prevents (exit 0: the damage was shown)"
            )

    def a_takes_and_pauses(self, strategy: str, clients: list, name: str, product: Product) -> Holder:
        """A takes the lock, reads, and pauses past its lease."""
        step, note = self.narrator.step, self.narrator.note
        lock_a = self.make_lock(strategy, clients, name, forked=True)
        lease_a = lock_a.acquire()
        shelf_a = read_shelf(product.pk)
        step(
            lease_a.fence > 0,
            f"A takes the lock: fence {lease_a.fence}, valid for {lease_a.remaining_ms():.0f} ms; "
            f"A reads stock {shelf_a.stock} and decides to sell 1",
        )
        pause_s = PAUSE_S
        if strategy == "etcd":
            lock_a.client.freeze_sessions()  # the whole process stops: its keepalive thread too
            pause_s = lease_a.remaining_ms() / 1000 * 1.5
        if strategy == "zookeeper":
            lock_a.pause()  # SIGSTOP: A's process, kazoo's thread and its pings stop
            pause_s = ZOOKEEPER_SESSION_MS / 1000 * 1.5
        note(f"A pauses for {pause_s * 1000:.0f} ms (a stop-the-world GC, say) while holding the lease")
        time.sleep(pause_s)
        step(
            lease_a.remaining_ms() < 0 and self.holders(clients, name, lease_a.token) == 0,
            f"A's lease ran out while paused ({lease_a.remaining_ms():.0f} ms), its keys expired",
        )
        return Holder(lock_a, lease_a, shelf_a)

    def a_writes_late(self, strategy: str, product: Product, lease_a: Lease, shelf_a: Shelf, after_b: Shelf) -> None:
        """A writes what it decided before its pause, with its stale fence, after B's write."""
        landed = write_order(
            shelf_a, customer="A", quantity=1, token=lease_a.fence, fenced=self.fenced, strategy=strategy
        )
        after_a = read_shelf(product.pk)
        stale = f"A writes with stale fence {lease_a.fence} (stock {shelf_a.stock} -> {shelf_a.stock - 1})"
        if self.fenced:
            self.narrator.step(
                not landed and after_a == after_b,
                f"{stale}: REFUSED by the storage check: {why_refused(shelf_a, lease_a.fence)} "
                f"(stock {after_a.stock}, row fence {after_a.fence})",
            )
        else:
            self.narrator.step(
                landed and after_a.stock == STOCK - 1,
                f"{stale}: LANDS, nothing checks it (storage check off): B's sale is overwritten, A's order written",
            )

    def make_lock(self, strategy: str, clients: list, name: str, *, forked: bool = False):
        """A lock as the strategy itself makes it (``make_lock``), with the demo's lifetime and no wait."""
        if strategy == "zookeeper" and forked:
            # A in a child process of its own (see the module's docstring); B on a session here.
            return ForkedHolder(clients[0].hosts, name, session_ms=ZOOKEEPER_SESSION_MS)
        # A new strategy per lock: A and B each get their own client, so etcd gives each its own
        # session, as two processes would (etcd's shortest lease is 2 s).
        built = load_strategy(strategy, config=self.lock_config(strategy, clients))
        self.strategies.append(built)
        return built.make_lock(name)

    def lock_config(self, strategy: str, clients: list) -> dict:
        """The strategy's settings, pointed at this demo's Redis, nodes, cluster or ensemble."""
        config = {"LOCK_TTL_MS": ZOOKEEPER_SESSION_MS if strategy == "zookeeper" else TTL_MS, "ACQUIRE_TIMEOUT_MS": 0}
        if strategy == "redis":
            config["REDIS_URL"] = settings.INVENTORY["REDIS_URL"]
        elif strategy == "redlock":
            config["REDLOCK_URLS"] = self.nodes.urls
        elif strategy == "etcd":
            config["ETCD_ENDPOINTS"] = clients[0].endpoints
        else:
            config["ZOOKEEPER_HOSTS"] = clients[0].hosts
        return config

    def holders(self, clients: list, name: str, token: str) -> int:
        if isinstance(clients[0], EtcdClient):  # the lock is the key ``token``, on the cluster
            return int(bool(clients[0].call(lambda gw: gw.get(token))))
        if isinstance(clients[0], ZooKeeperClient):  # the lock is the znode ``token``, on the ensemble
            return int(clients[0].kazoo(time.monotonic() + 5).exists(token) is not None)
        return sum(1 for client in clients if client.get(name) == token.encode())

    def released(self, strategy: str, clients: list, name: str, token: str) -> bool:
        """Whether no node holds ``token`` after B's release. A ZooKeeper release whose delete went
        unanswered (B's connection dropped on a loaded machine: seen in make test) retires B's
        session, and the server removes the ephemeral znode when that session expires: waited for
        here, up to three session timeouts, as a shopper's next acquisition would wait for it."""
        patience_s = 3 * ZOOKEEPER_SESSION_MS / 1000 if strategy == "zookeeper" else 0.0
        deadline = time.monotonic() + patience_s
        while self.holders(clients, name, token):
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.05)
        return True

    def run_scenario(self, strategy: str, clients: list[redis.Redis]) -> None:
        say, step, note = self.narrator.say, self.narrator.step, self.narrator.note
        name = f"flashsale:lock:{SKU}:{uuid.uuid4().hex[:8]}"
        majority = 1 if strategy in ("etcd", "zookeeper") else len(clients) // 2 + 1
        product = reset_product(sku=SKU, name="Pause demonstration", stock=STOCK)
        check = "storage check ON (fence)" if self.fenced else "storage check OFF (--unfenced)"
        lifetime = f"session {ZOOKEEPER_SESSION_MS} ms" if strategy == "zookeeper" else f"TTL {TTL_MS} ms"
        say(
            f"strategy {strategy} on {', '.join(self.make_lock(strategy, clients, name).node_names())}; "
            f"product {SKU!r} reset to stock {STOCK}, fence 0; lock {name!r}, {lifetime}; {check}"
        )

        lock_a, lease_a, shelf_a = self.a_takes_and_pauses(strategy, clients, name, product)

        lock_b = self.make_lock(strategy, clients, name)
        lease_b = lock_b.acquire()
        shelf_b = read_shelf(product.pk)
        step(
            lease_b.fence > lease_a.fence,
            f"B takes the lock: fence {lease_b.fence} > A's {lease_a.fence}; B reads stock {shelf_b.stock}",
        )

        accepted = write_order(
            shelf_b, customer="B", quantity=1, token=lease_b.fence, fenced=self.fenced, strategy=strategy
        )
        after_b = read_shelf(product.pk)
        recorded = f"row fence {after_b.fence}" if self.fenced else "unchecked: the row records no fence"
        step(
            accepted and after_b.stock == STOCK - 1,
            f"B writes with fence {lease_b.fence}: accepted (stock {after_b.stock}, {recorded})",
        )

        note("A wakes up, still believing it holds the lock")
        try:
            lock_a.release()
            refused = False
        except NotOwned:
            refused = True
        holding = self.holders(clients, name, lease_b.token)
        step(
            refused and holding >= majority,
            f"A's release is ignored (NotOwned); B's lock intact on {holding} of {len(clients)} node(s)",
        )

        self.a_writes_late(strategy, product, lease_a, shelf_a, after_b)

        lock_b.release()
        step(self.released(strategy, clients, name, lease_b.token), "B releases; no node holds the lock")
        oversold, line = audit_line(SKU)
        expected = 0 if self.fenced else 1
        step(
            oversold == expected,
            line + ("" if self.fenced else " -- Kleppmann's point: the lock alone did not protect the write"),
        )
