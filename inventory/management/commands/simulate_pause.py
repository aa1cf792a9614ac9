"""Kleppmann's pause scenario, run for real against Redis and the database, narrated step by step.

A takes the lock with a short TTL and gets fencing token fA; A stops for longer than the TTL
(a stop-the-world pause, here a sleep: A does nothing while its lease runs out); B takes the
lock and gets fB > fA; B writes with fB (accepted); A wakes, releases (refused: B's lock is
intact) and writes with fA (rejected by the fence: the row has seen fB); B releases.

B writes before A's late write, as in Kleppmann's figure: with the shop's strict
``WHERE fence < :token``, storage can refuse fA only once it has seen a newer token. Had A's late
write landed before any write by B, it would have been accepted, and B's, with a larger token,
after it; each is one atomic conditional decrement, so stock is still never oversold.

Exits 0 only when every step held. ``--backend redis`` uses the shop's Redis (INVENTORY
REDIS_URL); ``--backend redlock`` starts five private nodes (``--base-port``, 7789 by default)
unless they already run, and stops the ones it started.
"""
from __future__ import annotations

import time
import uuid
from datetime import datetime
from decimal import Decimal
from pathlib import Path

import redis
from django.conf import settings
from django.core.management.base import BaseCommand, CommandError
from django.db import transaction

from inventory.backends.section import checked_write, read_shelf
from inventory.locks import NotOwned, RedisLock, Redlock
from inventory.models import Product
from inventory.nodes import NodeError, RedisNodes, started_while_needed

SKU = "simulate-pause"
STOCK = 10
TTL_MS = 500
PAUSE_S = TTL_MS / 1000 * 1.5


class Command(BaseCommand):
    help = "Narrate a lock holder pausing past its TTL: its release is ignored and its write fenced off."

    def add_arguments(self, parser):
        parser.add_argument("--backend", choices=["redis", "redlock"], default="redis")
        parser.add_argument("--base-port", type=int, default=7789, help="first of the five Redlock node ports")

    def handle(self, *args, backend: str, base_port: int, **options):
        self.started = time.monotonic()
        self.failures: list[str] = []
        nodes = RedisNodes(base_port=base_port, count=5, run_dir=Path(settings.RUN_DIR) / "simulate-pause")
        try:
            with started_while_needed(nodes if backend == "redlock" else []):
                if backend == "redis":
                    clients = [redis.Redis.from_url(settings.INVENTORY["REDIS_URL"], socket_timeout=2.0)]
                else:
                    clients = [node.client(socket_timeout=2.0) for node in nodes]
                try:
                    self.run_scenario(backend, clients)
                finally:
                    for client in clients:
                        client.close()
        except NodeError as exc:
            raise CommandError(str(exc)) from exc
        if self.failures:
            raise CommandError(f"{len(self.failures)} step(s) did not hold: " + "; ".join(self.failures))
        self.say(f"every step held ({backend})")

    def say(self, message: str) -> None:
        now = datetime.now().strftime("%H:%M:%S.%f")[:-3]
        self.stdout.write(f"{now} +{time.monotonic() - self.started:6.3f}s  {message}")

    def step(self, held: bool, message: str) -> None:
        self.say(f"{'ok  ' if held else 'FAIL'} {message}")
        if not held:
            self.failures.append(message)

    def make_lock(self, backend: str, clients: list[redis.Redis], name: str):
        if backend == "redis":
            return RedisLock(clients[0], name, ttl_ms=TTL_MS, timeout_ms=0)
        return Redlock(clients, name, ttl_ms=TTL_MS, timeout_ms=0)

    def holders(self, clients: list[redis.Redis], name: str, token: str) -> int:
        return sum(1 for client in clients if client.get(name) == token.encode())

    def write(self, *, who: str, product_id: int, fence: int) -> bool:
        """The shop's fenced write of one unit; True when storage accepted it."""
        with transaction.atomic():
            shelf = read_shelf(product_id)
            if checked_write(shelf, quantity=1, token=fence, fenced=True):
                return True
        self.say(f"     {who}'s write refused by storage: token {fence}, row fence {shelf.fence}")
        return False

    def run_scenario(self, backend: str, clients: list[redis.Redis]) -> None:
        name = f"flashsale:lock:{SKU}:{uuid.uuid4().hex[:8]}"
        majority = len(clients) // 2 + 1
        product, _ = Product.objects.update_or_create(
            sku=SKU,
            defaults={"name": "Pause demonstration", "price": Decimal("1.00"), "initial_stock": STOCK,
                      "stock": STOCK, "per_customer_limit": STOCK, "fence": 0},
        )
        self.say(f"backend {backend} on {', '.join(self.make_lock(backend, clients, name).node_names())}; "
                 f"product {SKU!r} reset to stock {STOCK}, fence 0; lock {name!r}, TTL {TTL_MS} ms")

        lock_a = self.make_lock(backend, clients, name)
        lease_a = lock_a.acquire()
        self.step(lease_a.fence > 0, f"A takes the lock: fence {lease_a.fence}, valid for {lease_a.remaining_ms():.0f} ms")

        self.say(f"     A pauses for {PAUSE_S * 1000:.0f} ms (a stop-the-world GC, say) while holding the lease")
        time.sleep(PAUSE_S)
        self.step(lease_a.remaining_ms() < 0 and self.holders(clients, name, lease_a.token) == 0,
                   f"A's lease ran out while paused ({lease_a.remaining_ms():.0f} ms), its keys expired")

        lock_b = self.make_lock(backend, clients, name)
        lease_b = lock_b.acquire()
        self.step(lease_b.fence > lease_a.fence,
                   f"B takes the lock: fence {lease_b.fence} > A's {lease_a.fence}")

        accepted = self.write(who="B", product_id=product.pk, fence=lease_b.fence)
        product.refresh_from_db()
        self.step(accepted and product.stock == STOCK - 1 and product.fence == lease_b.fence,
                   f"B writes with fence {lease_b.fence}: accepted (stock {product.stock}, row fence {product.fence})")

        self.say("     A wakes up, still believing it holds the lock")
        try:
            lock_a.release()
            refused = False
        except NotOwned:
            refused = True
        holding = self.holders(clients, name, lease_b.token)
        self.step(refused and holding >= majority,
                   f"A's release is ignored (NotOwned); B's lock intact on {holding} of {len(clients)} node(s)")

        accepted = self.write(who="A", product_id=product.pk, fence=lease_a.fence)
        product.refresh_from_db()
        self.step(not accepted and product.stock == STOCK - 1 and product.fence == lease_b.fence,
                   f"A writes with stale fence {lease_a.fence}: rejected (stock {product.stock}, row fence {product.fence})")

        lock_b.release()
        self.step(self.holders(clients, name, lease_b.token) == 0, "B releases; no node holds the lock")
