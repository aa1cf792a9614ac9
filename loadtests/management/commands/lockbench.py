"""Measure acquire+release per second of our locks against the floors and the peer libraries.

Every row runs on the same five private nodes (started here, stopped at the end), one lock name,
no contention, one client thread, for ``--seconds`` split into ``--rounds`` interleaved slices of about 0.2 s, so
that bursts of load from other processes on the machine fall on every row alike:

* ``floor-1node``: the raw commands of a correct lock on one held connection: a fresh random
  token, ``SET NX PX``, then the distlock page's ``EVALSHA`` compare-and-delete, packed by hiredis, no lock
  library at all; ``floor-5nodes``: the same written to five nodes before reading any reply.
  ``floor-1node-fenced``/``floor-5nodes-fenced``: the same round trips with the scripts our locks
  run instead (the acquire that also issues the fence and checks the hand-off window, the release
  that also wakes a registered waiter): what the server's side of our locks costs, so a gap
  between ``ours-*`` and its floor splits into the scripts' share and the library's.
* ``ours-redis``/``ours-redlock``: a new :class:`RedisLock`/:class:`Redlock` per acquisition, as
  the shop uses them (fencing counter included).
* ``redis-py-lock`` (``redis.lock.Lock``), ``python-redis-lock``, ``pottery-redlock``,
  ``redlock-py``: the peers from requirements-peers.txt, each used as its README shows.
* ``ours-redis-async``/``ours-redlock-async``: the asyncio twins on ``redis.asyncio`` clients,
  and their peers ``redis-py-lock-async`` (``redis.asyncio.lock.Lock``, one node) and
  ``aioredlock`` (the asyncio Redlock people install, on its own aioredis 1.x connections to the
  same five nodes); each slice runs its operations in batches of ten inside one event loop, so
  the loop's entry costs are not counted per operation. A peer that cannot be imported is left
  out with one line saying why.

Then contended handoff: 8 processes take one single-node lock in a loop, hold it 1 ms, release;
``contended-polling`` waits by random sleeps, ``contended-notified`` by ``BLPOP`` on the release
signal. Those rows add ``p99_wait_ms``, the 99th percentile of time from asking to holding.

Last, the consensus engines on private 3-member clusters, each with its raw floor:
:mod:`loadtests.etcd_bench` and :mod:`loadtests.zookeeper_bench`.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import math
import multiprocessing
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Callable

import redis
import redis.asyncio as aioredis
from django.conf import settings
from django.core.management.base import BaseCommand, CommandError
from hiredis import pack_command

from loadtests.bench import alternate
from loadtests.etcd_bench import etcd_rows
from loadtests.figures import percentile
from loadtests.options import check_output
from loadtests.targets import shown_against
from loadtests.wakeup import measured as wake_up_measured
from loadtests.zookeeper_bench import zookeeper_rows
from locks import AsyncRedisLock, AsyncRedlock, RedisLock, Redlock, aclose_connections
from locks.scripts import ACQUIRE, HANDOFF_WINDOW_MS, RELEASE, SIGNAL_LIFETIME_MS, acquire_keys, release_keys
from processes.children import sigterm_as_interrupt
from processes.nodes import NodeError, RedisNodes
from processes.ports import LOCKBENCH_BASE_PORT, LOCKBENCH_ZOOKEEPER_BASE_PORT

#: How far above --base-port the rows' ports reach: five nodes (+0..+4), etcd (+5..+10) and
#: ZooKeeper's three members (client ports from its base, quorum +10, election +20: up to +22).
PORTS_SPANNED = LOCKBENCH_ZOOKEEPER_BASE_PORT - LOCKBENCH_BASE_PORT + 22
LOCK_NAME = "lockbench:lock"
TTL_MS = 10_000
#: Our Redlock rows wait for a node as long as the clients' sockets do (1 s, as the floors'): the
#: default for a 10 s lease, 50 ms, ended a whole run in a traceback at load 10 ("only 1 of 5 nodes
#: answered") where a node answering late only slows one operation. No effect while nodes answer.
NODE_TIMEOUT_MS = 1_000
CONTENDERS = 8
CRITICAL_SECTION_S = 0.001

# The canonical compare-and-delete of the Redis distlock page, the floor's release.
# KEYS[1] lock key.  ARGV[1] token.
UNLOCK = """
if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) end
return 0
"""
UNLOCK_SHA = hashlib.sha1(UNLOCK.encode()).hexdigest()

# (numerator row, denominator row, minimum ratio): issue 28's "the locks themselves at their
# floors again": each lock against the floor of as many nodes as it uses, and the peers' ratios no
# lower than they were when that issue was filed.
# Issue 29's: the asyncio twins at least as fast as their asyncio peers.
TARGETS = [
    ("ours-redis", "floor-1node", 0.9),
    ("ours-redlock", "floor-5nodes", 0.9),
    ("ours-redis", "redis-py-lock", 1.28),
    ("ours-redlock", "redlock-py", 2.7),
    ("ours-redlock", "pottery-redlock", 7.3),
    ("ours-redis-async", "redis-py-lock-async", 1.0),
    ("ours-redlock-async", "aioredlock", 1.0),
]


def _clients(ports: list[int]) -> list[redis.Redis]:
    return [redis.Redis(host="127.0.0.1", port=port, socket_timeout=1.0) for port in ports]


def _floor(clients: list[redis.Redis], *, fenced: bool = False) -> Callable[[], None]:
    """The bare protocol cost of a correct lock: a fresh random token, SET NX PX, then the
    compare-and-delete EVALSHA, packed by hiredis and written on one held connection per node
    (to all nodes before reading any reply); no lock object, no fencing, no error handling.
    With ``fenced``, our locks' own acquire and release scripts in the same round trips."""
    conns = [client.connection_pool.get_connection() for client in clients]
    for client in clients:
        client.script_load(UNLOCK)
        client.script_load(ACQUIRE.text)
        client.script_load(RELEASE.text)
    name = LOCK_NAME + (":fenced" if fenced else "")
    on_acquire, on_release = acquire_keys(name), release_keys(name)

    def both(command: tuple) -> None:
        packed = [pack_command(command)]
        for conn in conns:
            conn.send_packed_command(packed, check_health=False)
        for conn in conns:
            conn.read_response()

    def op() -> None:
        token = os.urandom(16).hex()
        both(("SET", name, token, "NX", "PX", TTL_MS))
        both(("EVALSHA", UNLOCK_SHA, 1, name, token))

    def op_fenced() -> None:
        token = os.urandom(16).hex()
        both(("EVALSHA", ACQUIRE.sha, 4, *on_acquire, token, TTL_MS, "", "0"))
        both(("EVALSHA", RELEASE.sha, 4, *on_release, token, SIGNAL_LIFETIME_MS, HANDOFF_WINDOW_MS))

    return op_fenced if fenced else op


def _ours_redis(client: redis.Redis) -> Callable[[], None]:
    def op() -> None:
        lock = RedisLock(client, LOCK_NAME, ttl_ms=TTL_MS, timeout_ms=0)
        lock.acquire()
        lock.release()

    return op


def _ours_redlock(clients: list[redis.Redis]) -> Callable[[], None]:
    def op() -> None:
        lock = Redlock(clients, LOCK_NAME, ttl_ms=TTL_MS, timeout_ms=0, node_timeout_ms=NODE_TIMEOUT_MS)
        lock.acquire()
        lock.release()

    return op


def _library_rows(clients: list[redis.Redis]) -> dict[str, Callable[[], None]]:
    """The rows that read the library against its fenced floors (the first client for one node)."""
    return {
        "floor-1node-fenced": _floor(clients[:1], fenced=True),
        "floor-5nodes-fenced": _floor(clients, fenced=True),
        "ours-redis": _ours_redis(clients[0]),
        "ours-redlock": _ours_redlock(clients),
    }


def library_cases(ports: list[int]) -> dict[str, Callable[[], None]]:
    """:func:`_library_rows` on new clients of the nodes at ``ports``: what
    ``scripts/lock_instructions.py`` counts, built as the command builds them."""
    return _library_rows(_clients(ports))


def _async_batches(loop: asyncio.AbstractEventLoop, op_async) -> Callable[[], None]:
    """One call runs ten awaited operations on ``loop``: the slice loop counts ten per call."""

    async def ten() -> None:
        for _ in range(10):
            await op_async()

    def op() -> None:
        loop.run_until_complete(ten())

    op.batch = 10
    return op


def _ours_redis_async(loop, client: aioredis.Redis) -> Callable[[], None]:
    async def op() -> None:
        lock = AsyncRedisLock(client, LOCK_NAME, ttl_ms=TTL_MS, timeout_ms=0)
        await lock.acquire()
        await lock.release()

    return _async_batches(loop, op)


def _ours_redlock_async(loop, clients: list[aioredis.Redis]) -> Callable[[], None]:
    async def op() -> None:
        lock = AsyncRedlock(clients, LOCK_NAME, ttl_ms=TTL_MS, timeout_ms=0, node_timeout_ms=NODE_TIMEOUT_MS)
        await lock.acquire()
        await lock.release()

    return _async_batches(loop, op)


def _redis_py_lock_async(loop, client: aioredis.Redis) -> Callable[[], None]:
    async def op() -> None:
        lock = client.lock(LOCK_NAME, timeout=TTL_MS / 1000)
        if not await lock.acquire(blocking=False):
            raise RuntimeError("redis-py's asyncio Lock refused an uncontended lock")
        await lock.release()

    return _async_batches(loop, op)


def _aioredlock(loop, ports: list[int]):
    """aioredlock's lock manager as its README shows it, over its own connections to ``ports``,
    and the case that takes and releases its lock; ``(None, why)`` when it cannot be imported (it
    needs aioredis 1.x, which a future Python may refuse)."""
    try:
        from aioredlock import Aioredlock
    except Exception as error:  # noqa: BLE001 - any import failure only leaves the row out
        return None, f"{type(error).__name__}: {error}"
    # One attempt, as for redlock-py: an uncontended lock never needs a retry.
    manager = Aioredlock([{"host": "127.0.0.1", "port": port} for port in ports], retry_count=1)

    async def op() -> None:
        # With a lock_timeout aioredlock starts no renewal task, like our locks without a watchdog.
        lock = await manager.lock(LOCK_NAME, lock_timeout=TTL_MS / 1000)
        await manager.unlock(lock)

    return manager, _async_batches(loop, op)


def _redis_py_lock(client: redis.Redis) -> Callable[[], None]:
    def op() -> None:
        lock = client.lock(LOCK_NAME, timeout=TTL_MS / 1000)
        if not lock.acquire(blocking=False):
            raise RuntimeError("redis-py Lock refused an uncontended lock")
        lock.release()

    return op


def _python_redis_lock(client: redis.Redis) -> Callable[[], None]:
    import redis_lock

    def op() -> None:
        lock = redis_lock.Lock(client, LOCK_NAME, expire=TTL_MS // 1000)
        if not lock.acquire(blocking=False):
            raise RuntimeError("python-redis-lock refused an uncontended lock")
        lock.release()

    return op


def _pottery(clients: list[redis.Redis]) -> Callable[[], None]:
    from pottery import Redlock as PotteryRedlock

    def op() -> None:
        lock = PotteryRedlock(key=LOCK_NAME, masters=clients, auto_release_time=TTL_MS / 1000)
        if not lock.acquire(blocking=False):
            raise RuntimeError("pottery Redlock refused an uncontended lock")
        lock.release()

    return op


def _redlock_py(ports: list[int]) -> Callable[[], None]:
    import redlock

    manager = redlock.Redlock([{"host": "127.0.0.1", "port": port} for port in ports], retry_count=1)

    def op() -> None:
        grant = manager.lock(LOCK_NAME, TTL_MS)
        if not grant:
            raise RuntimeError("redlock-py refused an uncontended lock")
        manager.unlock(grant)

    return op


def _contender(port: int, wait: str, start_at: float, stop_at: float, results) -> None:
    client = redis.Redis(host="127.0.0.1", port=port, socket_timeout=5.0)
    waits: list[float] = []
    while time.monotonic() < start_at:
        time.sleep(0.001)
    while time.monotonic() < stop_at:
        asked = time.monotonic()
        lock = RedisLock(client, LOCK_NAME, ttl_ms=TTL_MS, timeout_ms=10_000, wait=wait, retry_delay_ms=10)
        lock.acquire()
        waits.append(time.monotonic() - asked)
        time.sleep(CRITICAL_SECTION_S)
        lock.release()
    results.put(waits)


class Command(BaseCommand):
    requires_system_checks: list[str] = []
    help = "Benchmark lock acquire+release/s: floors, our locks, peer libraries, contended handoff."

    def add_arguments(self, parser):
        parser.add_argument("--json", required=True, help='where to write {"rows": [...]}')
        parser.add_argument("--seconds", type=float, default=5.0, help="measuring time per row (default 5)")
        parser.add_argument(
            "--rounds",
            type=int,
            default=0,
            help="interleaved slices per uncontended row (default: one per 0.2 s of --seconds)",
        )
        parser.add_argument(
            "--base-port", type=int, default=LOCKBENCH_BASE_PORT, help="first of five private node ports"
        )

    def handle(self, *args, seconds: float, rounds: int, base_port: int, **options):
        if not 0 < seconds < math.inf:  # nan compares false
            raise CommandError(f"--seconds {seconds:g}: give a positive number of seconds")
        if rounds < 0:
            raise CommandError(f"--rounds {rounds}: give 1 or more, or 0 for one slice per 0.2 s")
        last = base_port + PORTS_SPANNED
        if base_port < 1 or last > 65535:
            raise CommandError(
                f"--base-port {base_port}: its rows use ports {base_port} to {last}: "
                f"give a base from 1 to {65535 - PORTS_SPANNED}"
            )
        check_output("--json", options["json"])
        rounds = rounds or max(1, round(seconds / 0.2))
        self.unmeasured: dict[str, str] = {}  # peer row → why it could not be measured here
        # Every row is round trips one after another: what one wake-up costs here sets the floors.
        probe, line = wake_up_measured()
        machine = {"wake_up": probe} if probe else {}
        self.stdout.write(line)
        nodes = RedisNodes(base_port=base_port, count=5, run_dir=Path(settings.BASE_DIR) / ".run" / "lockbench")
        try:
            with sigterm_as_interrupt():  # a SIGTERM (timeout, a cancelled job) still stops the nodes
                rows = self._measure(nodes, seconds, rounds, base_port)
        except KeyboardInterrupt:
            raise CommandError("interrupted: its Redis nodes, etcd and ZooKeeper were stopped") from None
        path = Path(options["json"])
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"rows": rows, "unmeasured": self.unmeasured, "machine": machine}, indent=2) + "\n")
        self._report(rows, path)

    def _measure(self, nodes: RedisNodes, seconds: float, rounds: int, base_port: int) -> list[dict]:
        """Every row, on the five nodes (started here and stopped at the end however it ends)."""
        try:
            nodes.start()
        except NodeError as exc:
            raise CommandError(str(exc)) from exc
        try:
            for node in nodes:
                with node.client() as client:
                    client.flushall()
            rows = self._uncontended(nodes, seconds, rounds) + self._contended(nodes, seconds)
            # Its own 3-member cluster on base_port+5..+10; its own ensemble as far from --base-port
            # as the default ports are from each other.
            rows += self._consensus("etcd", etcd_rows, seconds, base_port + 5)
            zookeeper_port = base_port + LOCKBENCH_ZOOKEEPER_BASE_PORT - LOCKBENCH_BASE_PORT
            rows += self._consensus("zookeeper", zookeeper_rows, seconds, zookeeper_port)
        finally:
            nodes.stop()
        return rows

    def _consensus(self, service: str, measure: Callable[[float, int], list[dict]], seconds: float, port: int):
        """A consensus service's two rows; if the service fails them (a member that did not start,
        a call it did not answer in time), both are not measured, with the reason, and the rows
        measured before are kept: they were lost with a traceback after minutes of measuring."""
        try:
            return measure(seconds, port)
        except Exception as exc:  # noqa: BLE001 - said beside the rows, and the suite's run asserts none
            why = f"{service} failed the run: {type(exc).__name__}: {exc}"
            self.unmeasured.update({f"floor-{service}": why, f"ours-{service}": why})
            return []

    def _progress(self, message: str) -> None:
        self.stderr.write(f"\r\033[K{message}", ending="")
        self.stderr.flush()

    def _uncontended(self, nodes: RedisNodes, seconds: float, rounds: int) -> list[dict]:
        ports = [node.port for node in nodes]
        clients = _clients(ports)
        loop = asyncio.new_event_loop()
        async_clients = [aioredis.Redis(host="127.0.0.1", port=port, socket_timeout=1.0) for port in ports]
        manager, aioredlock_case = _aioredlock(loop, ports)
        cases = self._cases(ports, clients, loop, async_clients)
        if manager is None:
            self.unmeasured["aioredlock"] = f"it cannot be imported here ({aioredlock_case})"
        else:
            cases["aioredlock"] = aioredlock_case
        try:
            rows = alternate(
                cases,
                seconds,
                rounds=rounds,
                warmup=20,
                calls_per_check=10,
                progress=lambda done, of, name, rate: self._progress(
                    f"round {done}/{of}  {name:<18} {rate:>9.0f} ops/s"
                ),
            )
            self._progress("")
            return rows
        finally:
            if manager is not None:
                loop.run_until_complete(manager.destroy())
            loop.run_until_complete(aclose_connections())  # the twins' own connections, on their loop
            for client in async_clients:
                loop.run_until_complete(client.aclose())
            loop.close()

    def _cases(self, ports, clients, loop, async_clients) -> dict[str, Callable[[], None]]:
        single = clients[0]
        return {
            "floor-1node": _floor([single]),
            "floor-5nodes": _floor(clients),
            **_library_rows(clients),
            "redis-py-lock": _redis_py_lock(single),
            "python-redis-lock": _python_redis_lock(single),
            "pottery-redlock": _pottery(clients),
            "redlock-py": _redlock_py(ports),
            "ours-redis-async": _ours_redis_async(loop, async_clients[0]),
            "ours-redlock-async": _ours_redlock_async(loop, async_clients),
            "redis-py-lock-async": _redis_py_lock_async(loop, async_clients[0]),
        }

    def _contended(self, nodes: RedisNodes, seconds: float) -> list[dict]:
        ctx = multiprocessing.get_context("fork")
        rows = []
        for wait in ("polling", "notified"):
            mode = "poll" if wait == "polling" else "notify"
            results = ctx.Queue()
            start_at = time.monotonic() + 0.5
            stop_at = start_at + seconds
            workers = [
                ctx.Process(target=_contender, args=(nodes[0].port, mode, start_at, stop_at, results))
                for _ in range(CONTENDERS)
            ]
            for worker in workers:
                worker.start()
            while time.monotonic() < stop_at:
                self._progress(
                    f"contended-{wait:<9} {CONTENDERS} processes, {max(stop_at - time.monotonic(), 0):4.1f}s left"
                )
                time.sleep(0.25)
            waits: list[float] = []
            for _ in workers:
                waits.extend(results.get(timeout=60))
            for worker in workers:
                worker.join(30)
            ops = len(waits) / seconds
            rows.append(
                {
                    "name": f"contended-{wait}",
                    "ops_per_s": round(ops, 1),
                    "us_per_op": round(1e6 / ops, 1),
                    "p99_wait_ms": round(percentile(sorted(waits), 0.99) * 1000, 2),
                    "median_wait_ms": round(statistics.median(waits) * 1000, 2),
                }
            )
        self._progress("")
        return rows

    def _report(self, rows: list[dict], path: Path) -> None:
        out = self.stdout
        out.write(f"{'row':<20}{'ops/s':>10}{'us/op':>10}{'p99 wait ms':>13}")
        for row in rows:
            p99_text = f"{row['p99_wait_ms']:.2f}" if "p99_wait_ms" in row else ""
            out.write(f"{row['name']:<20}{row['ops_per_s']:>10.0f}{row['us_per_op']:>10.1f}{p99_text:>13}")
        by_name = {row["name"]: row["ops_per_s"] for row in rows}
        for name, why in self.unmeasured.items():
            out.write(f"{name}: not measured, {why}")
        out.write("\nratios against the issues' targets:")
        for numerator, denominator, target in TARGETS:
            if denominator in self.unmeasured:
                out.write(f"  {numerator} / {denominator}: not measured  (target >= {target}x)")
                continue
            ratio = by_name[numerator] / by_name[denominator]
            verdict = "met" if ratio >= target else "NOT met"
            shown = shown_against(ratio, target)
            line = f"  {numerator} / {denominator} = {shown:>5}x  (target >= {target}x)  {verdict}"
            fenced = by_name.get(f"{denominator}-fenced")
            if fenced:  # a lock against its floor: what our scripts alone reach there, with no library
                reach = fenced / by_name[denominator]
                line += f"  (the fenced floor, our scripts with no library, reaches {reach:.2f}x)"
            out.write(line)
        out.write("where the gap to the floor goes (the scripts' share, then the library's):")
        for ours, floor in (("ours-redis", "floor-1node"), ("ours-redlock", "floor-5nodes")):
            fenced = f"{floor}-fenced"
            if {ours, floor, fenced} <= by_name.keys():
                out.write(
                    f"  {fenced} / {floor} = {by_name[fenced] / by_name[floor]:5.2f}x,  "
                    f"{ours} / {fenced} = {by_name[ours] / by_name[fenced]:5.2f}x"
                )
        contended = {row["name"]: row for row in rows if "p99_wait_ms" in row}
        if len(contended) == 2:
            poll, notify = contended["contended-polling"], contended["contended-notified"]
            out.write(
                f"  contended: notified/polling throughput {notify['ops_per_s'] / poll['ops_per_s']:.2f}x, "
                f"p99 wait {notify['p99_wait_ms']:.1f} ms vs {poll['p99_wait_ms']:.1f} ms"
            )
        out.write(f"\nwrote {path}")
        sys.stdout.flush()
