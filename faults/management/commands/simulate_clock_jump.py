"""K of five Redlock nodes' clocks jump forward: for which K a second holder gets in, and what the fence does then.

A Redis node expires keys by its own clock, so a node whose clock jumps forward drops a lock's key
before the holder's lease is over. The jump is emulated: ``PEXPIRE <lock key> 0`` on those K
nodes removes the key exactly as an expiry would (the nodes' real clocks are not touched).

Two grants are shown, each on its own product:

* full: A is granted by all five nodes; B can win only the K nodes that forgot A's key, so B is
  granted only when K >= 3.
* bare majority: two nodes are down when A locks (killed) and come back empty, so A holds just
  three; the jump hits A's three first (the worst case), and B already has the two empty nodes, so
  B is granted when K >= 1.

When B gets in there are two holders; B's fence is still newer than A's (B's majority includes a
node that counted A's grant), B writes, and A's late write is refused by the storage check.

Exits 0 only when every step held: B was granted exactly when the quorum arithmetic says, and
nothing was oversold. ``--nodes`` must be 0 to 5. The five nodes are private processes on
``--base-port`` .. +4 (7810 by default), started for the run and stopped after it.
"""

from __future__ import annotations

import contextlib
import uuid
from pathlib import Path

import redis
from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from faults.demos import Holder, Narrator, audit_line, demo_redlock, reset_product, why_refused, write_order
from inventory.errors import InventoryError
from inventory.models import Product
from inventory.strategies.section import read_shelf
from locks import Lease, NotAcquired, NotOwned
from processes.nodes import NodeError, RedisNodes
from processes.ports import SIMULATE_CLOCK_JUMP_BASE_PORT

NODES = 5
QUORUM = NODES // 2 + 1
STOCK = 10
TTL_MS = 10_000


class Command(BaseCommand):
    help = "Narrate K of five Redlock nodes' clocks jumping forward (emulated): when a second holder gets in."

    def add_arguments(self, parser):
        parser.add_argument("--nodes", type=int, default=3, help="how many of the 5 nodes' clocks jump (0 to 5)")
        parser.add_argument(
            "--base-port", type=int, default=SIMULATE_CLOCK_JUMP_BASE_PORT, help="first of the five private node ports"
        )

    def handle(self, *args, nodes: int, base_port: int, **options):
        if not 0 <= nodes <= NODES:
            raise CommandError(
                f"--nodes {nodes}: give how many of the {NODES} Redlock nodes' clocks jump, 0 to {NODES}"
            )
        if not 1024 <= base_port <= 65535 - NODES + 1:
            raise CommandError(f"--base-port {base_port}: use a port from 1024 to {65535 - NODES + 1}")
        self.narrator = Narrator(self.stdout)
        self.jumped = nodes
        run_dir = Path(settings.RUN_DIR) / "simulate-clock-jump"
        redis_nodes = RedisNodes(base_port=base_port, count=NODES, run_dir=run_dir)
        for node in redis_nodes:
            if node.pid() is None and node.ping():
                raise CommandError(
                    f"port {node.port} has a redis-server this command did not start: pick another --base-port"
                )
        self.clients: list[redis.Redis] = []
        try:
            redis_nodes.reset()
            try:
                self.narrator.say(
                    f"five Redlock nodes on {base_port}-{base_port + NODES - 1}; the clocks of {nodes} of them jump "
                    f"forward, EMULATED by PEXPIRE <lock key> 0 on those nodes (the key vanishes as if their clock "
                    f"had passed its deadline; no real clock is changed); lock TTL {TTL_MS} ms"
                )
                second_full = self.scenario(redis_nodes, bare=False)
                second_bare = self.scenario(redis_nodes, bare=True)
            finally:
                for client in self.clients:
                    client.close()
        except (NodeError, InventoryError) as exc:  # a node, or the shop's Redis the reset needs, down
            raise CommandError(str(exc)) from exc
        finally:
            redis_nodes.stop()
        self.narrator.check()
        self.narrator.say(
            f"every step held (K={nodes}): full grant: second holder {'YES' if second_full else 'no'} (needs K >= 3); "
            f"bare-majority grant: second holder {'YES' if second_bare else 'no'} (needs K >= 1); nothing oversold"
        )

    def connect(self, redis_nodes: RedisNodes) -> list[redis.Redis]:
        """Clients of one holder: A and B are separate processes in life, with connections of their own."""
        clients = [node.client(socket_timeout=2.0) for node in redis_nodes]
        self.clients += clients
        return clients

    def scenario(self, redis_nodes: RedisNodes, *, bare: bool) -> bool:
        """One grant and one jump; returns whether B got in."""
        say, step, note = self.narrator.say, self.narrator.step, self.narrator.note
        kind = "bare-majority" if bare else "full"
        sku = f"simulate-clock-jump-{'bare' if bare else 'full'}"
        name = f"flashsale:lock:{sku}:{uuid.uuid4().hex[:8]}"
        product = reset_product(sku=sku, name=f"Clock jump demonstration ({kind} grant)", stock=STOCK)
        say(f"{kind} grant: product {sku!r} stock {STOCK}; lock {name!r}")

        down = list(range(QUORUM, NODES)) if bare else []
        for index in down:
            redis_nodes[index].kill()
        if down:
            note(f"nodes {', '.join(map(str, down))} are down (killed) while A locks")
        clients = self.connect(redis_nodes)
        lock_a = demo_redlock(clients, name, ttl_ms=TTL_MS)
        lease_a = lock_a.acquire()
        shelf_a = read_shelf(product.pk)
        for index in down:
            redis_nodes[index].start()
        holding = self.holding(clients, name, lease_a.token)
        step(
            len(holding) == NODES - len(down),
            f"A locks: granted by {len(holding)} of {NODES} nodes ({self.names(holding)}), fence {lease_a.fence}, "
            f"valid for {lease_a.remaining_ms():.0f} ms; A reads stock {shelf_a.stock}"
            + (f"; nodes {', '.join(map(str, down))} are back, empty" if down else ""),
        )

        left = self.jump(clients, name, lease_a, holding, bare=bare)

        free = NODES - len(left)
        expected = free >= QUORUM
        lock_b = demo_redlock(self.connect(redis_nodes), name, ttl_ms=TTL_MS)
        try:
            lease_b = lock_b.acquire()
        except NotAcquired:
            lease_b = None
        granted = lease_b is not None
        verdict = f"GRANTED, fence {lease_b.fence}: TWO HOLDERS while A's lease is valid" if granted else "refused"
        step(
            granted == expected,
            f"B tries the same name: {verdict}; B can win at most the {free} node(s) without A's key, "
            f"a grant needs {QUORUM}",
        )

        self.writes(product, Holder(lock_a, lease_a, shelf_a), lease_b)
        oversold, line = audit_line(sku)
        step(oversold == 0 and read_shelf(product.pk).stock == STOCK - 1, line)
        for lock in (lock_b, lock_a):
            if lock.lease is not None:
                # NotOwned: A's key is gone from a majority: B took them, or the jump expired them.
                with contextlib.suppress(NotOwned):
                    lock.release()
        return granted

    def jump(self, clients: list, name: str, lease_a: Lease, holding: list[int], *, bare: bool) -> list[int]:
        """Jump the clocks of ``self.jumped`` nodes, A's first (its key expires there); the nodes A still holds."""
        jumped = (holding + [i for i in range(NODES) if i not in holding])[: self.jumped]
        for index in jumped:
            clients[index].pexpire(name, 0)
        left = self.holding(clients, name, lease_a.token)
        self.narrator.note(
            f"clock jump on {len(jumped)} node(s) ({self.names(jumped) or 'none'}"
            + (", A's nodes first: the worst case" if bare and jumped else "")
            + f"): A's key now on {len(left)} node(s) ({self.names(left) or 'none'}), "
            f"its lease still valid for {lease_a.remaining_ms():.0f} ms"
        )
        return left

    def writes(self, product: Product, a: Holder, lease_b: Lease | None) -> None:
        """A writes if it is the only holder; else B writes, and A's late write is refused by its fence."""
        step = self.narrator.step
        shelf_a, lease_a = a.shelf, a.lease
        if lease_b is None:
            landed = write_order(
                shelf_a, customer="A", quantity=1, token=lease_a.fence, fenced=True, strategy="redlock"
            )
            step(landed, f"A, the only holder, writes with token {lease_a.fence}: accepted")
        else:
            step(
                lease_b.fence > lease_a.fence,
                f"B's fence {lease_b.fence} > A's {lease_a.fence}: B's majority includes a node that counted A's "
                f"grant, so the counters still order the two holders",
            )
            shelf_b = read_shelf(product.pk)
            landed = write_order(
                shelf_b, customer="B", quantity=1, token=lease_b.fence, fenced=True, strategy="redlock"
            )
            step(landed, f"B reads stock {shelf_b.stock} and writes with token {lease_b.fence}: accepted")
            late = write_order(shelf_a, customer="A", quantity=1, token=lease_a.fence, fenced=True, strategy="redlock")
            step(
                not late,
                f"A's late write (stock {shelf_a.stock} -> {shelf_a.stock - 1}, token {lease_a.fence}): "
                f"REFUSED by the storage check: {why_refused(shelf_a, lease_a.fence)}",
            )

    @staticmethod
    def holding(clients: list[redis.Redis], name: str, token: str) -> list[int]:
        return [i for i, client in enumerate(clients) if client.get(name) == token.encode()]

    @staticmethod
    def names(indexes: list[int]) -> str:
        return ", ".join(f"node {i}" for i in indexes)
