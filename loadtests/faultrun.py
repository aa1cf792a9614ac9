"""A fault inside one row of the burst (``flashsale --fault NAME``): its parts, the pods' settings, its timing.

:class:`FaultRun` starts what the fault needs and the project does not already run (a private
``redis-server`` for ``restart-redis``, a master + replica for ``failover``; the Redlock nodes and
the etcd cluster are the strategies' own services, which ``flashsale`` has started), gives the pods
the settings that point them at it (:attr:`FaultRun.env`), and, once the pods run, a thread that
injects the fault when a third of the purchases have been answered, waits the fault's ``hold_s``
and recovers it. The instants are kept on the wall clock, the clock the Locust workers stamp
every purchase with, so :meth:`FaultRun.figures` can split the purchases into phases.

Every part it started is stopped on exit, and a fault still injected is recovered first, also
on error or Ctrl-C. The ``redis`` strategy's faults never touch the machine's Redis: the pods
get ``REDIS_URL`` of the private node (or of the pair's front relay, which runs in this process).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Self

import psycopg
from django.conf import settings

from faults.base import Fault, FaultError
from faults.crash import FREED_BY, KillFollowerThenLeader, KillHolder
from faults.registry import FAULT_NAMES, PauseWorker, make_fault
from processes.needs import project_cluster, project_ensemble, project_nodes
from processes.nodes import NodeError, RedisNode
from processes.pidfile import child_pids
from processes.protocol import Restartable
from processes.replication import ReplicatedPair

from .figures import fault_phases, first_after, longest_gap, resumed_after

#: Ports of the fault's private Redis, from ``REDLOCK_BASE_PORT``: +40 the restarted node, +41/+42
#: the failover's master and replica, +43 the relay the pods connect to.
PRIVATE_PORT_OFFSET = 40
#: The fault is injected once this share of the purchases has been answered.
INJECT_AFTER_FRACTION = 1 / 3
#: pause-worker's lease: short, so that the pause outlasts it within a few seconds. etcd grants a
#: session lease of at least 1.5 election timeouts (1.5 s here), so it gets 2 s.
PAUSE_LEASE_MS = {"etcd": 2000, "zookeeper": 2000}
PAUSE_LEASE_DEFAULT_MS = 1000
#: failover's lease. Releases of the lag are lost with the master, so the promoted replica still
#: holds the key of a holder that has finished, until its lease runs out: with the default 10 s
#: the sale resumed 8.8 s after the promotion (measured), with 2 s well within the 2 s target.
FAILOVER_LEASE_MS = 2000
#: kill-holder's lock TTL, lease or session timeout: what a dead holder's lock waits out (but db's).
KILL_HOLDER_TTL_MS = 3000
#: After the sale resumes later than this (seconds after the recovery), the row has a problem
#: (not with kill-holder, whose stalls are its measure).
RESUME_LIMIT_S = 2.0
#: ``longest_gap_s`` looks at the sale from this long after the recovery (the judge's limit: judge.GAP_LIMIT_S).
GAP_FROM_S = 1.0
#: How a row whose fault outlasted its sale begins its problem (flashsale tells it from a broken invariant).
NOT_OBSERVED = "recovery not observed"
#: How a pause-worker row whose pause froze a worker outside its section begins its problem: the
#: fault did not do what its name says, so nothing the row shows is a paused holder's.
NO_HOLDER_PAUSED = "no holder was paused"
POLL_S = 0.02
#: The burst's product's orders: another sale's, in the same database, are not the burst's.
OF_PRODUCT = "FROM inventory_order WHERE product_id = (SELECT id FROM inventory_product WHERE sku = %s)"
#: Every order's creation time (epoch seconds), the clock the pods stamp ``created_at`` with.
ORDERS_CREATED = f"SELECT extract(epoch FROM created_at)::float8 {OF_PRODUCT} ORDER BY created_at"


class FaultRun:
    """The fault ``name`` in one row of ``backend``, a sale of ``sku``; use as a context manager around the row."""

    def __init__(
        self,
        name: str,
        *,
        backend: str,
        fenced: bool,
        requests: int,
        database_url: str,
        sku: str,
        hold_s: float | None = None,
    ) -> None:
        if name not in FAULT_NAMES:
            raise FaultError(f"unknown fault {name!r}: choose one of {', '.join(FAULT_NAMES)}")
        self.name = name
        self.backend = backend
        self.requests = requests
        self.database_url = database_url
        self.sku = sku
        self.hold_s = hold_s
        self.run_dir = Path(settings.RUN_DIR) / "burst-faults"
        self.env: dict[str, str] = {} if fenced else {"INVENTORY_FENCED": "0"}
        self.node: RedisNode | None = None
        self.pair: ReplicatedPair | None = None
        self.pod_pid: Callable[[], int | None] = lambda: None
        self.pod: Restartable | None = None  # kill-pod's victim, once the pods run
        self.fault: Fault | None = None
        self.probe: SectionProbe | None = None
        self.timer: FaultTimer | None = None

    def __enter__(self) -> Self:
        try:
            self.fault = self._make()
        except BaseException:
            self._stop_parts()
            raise
        return self

    def _make(self) -> Fault:
        base = settings.REDLOCK_BASE_PORT + PRIVATE_PORT_OFFSET
        if self.name in ("kill-minority", "kill-majority"):
            nodes = project_nodes()
            if list(settings.INVENTORY["REDLOCK_URLS"]) != nodes.urls:
                raise FaultError(
                    f"{self.name} kills only the project's own Redlock nodes ({', '.join(nodes.urls)}); "
                    "REDLOCK_URLS names others"
                )
            return make_fault(self.name, redlock_nodes=nodes, hold_s=self.hold_s)
        if self.name == "restart-redis":
            self.node = RedisNode(port=base, run_dir=self.run_dir)
            own_node(self.node)
            self.node.start()
            self.env["REDIS_URL"] = self.node.url
            return make_fault(self.name, redis_node=self.node, hold_s=self.hold_s)
        if self.name == "failover":
            self.pair = ReplicatedPair(base_port=base + 1, front_port=base + 3, run_dir=self.run_dir)
            self.pair.start()
            self.env.update(REDIS_URL=self.pair.front.url, LOCK_TTL_MS=str(FAILOVER_LEASE_MS))
            return make_fault(self.name, pair=self.pair, hold_s=self.hold_s)
        if self.name == "pause-worker":
            lease_ms = PAUSE_LEASE_MS.get(self.backend, PAUSE_LEASE_DEFAULT_MS)
            self.env["LOCK_TTL_MS"] = str(lease_ms)
            self.probe = SectionProbe(self.database_url, sku=self.sku)
            return make_fault(
                self.name, workers=self.workers, lease_ttl_ms=lease_ms, holding=self.probe.inside, hold_s=self.hold_s
            )
        if self.name == "kill-holder":
            self.env["LOCK_TTL_MS"] = str(KILL_HOLDER_TTL_MS)
            self.probe = SectionProbe(self.database_url, sku=self.sku)
            return make_fault(self.name, workers=self.workers, holding=self.probe.inside, sold=self.probe.orders)
        if self.name == "kill-zk-member":
            return make_fault(self.name, zookeeper_ensemble=project_ensemble(), hold_s=self.hold_s)
        if self.name == "kill-pod":
            # A killed worker may hold the lock: a short lease, as for pause-worker, so the sale
            # resumes within the judge's limit once the lease runs out.
            self.env["LOCK_TTL_MS"] = str(PAUSE_LEASE_MS.get(self.backend, PAUSE_LEASE_DEFAULT_MS))
            return make_fault(self.name, pod=lambda: self.pod, hold_s=self.hold_s)
        return make_fault(self.name, etcd_cluster=project_cluster(), hold_s=self.hold_s)

    def workers(self) -> list[int]:
        """The first pod's gunicorn workers."""
        pid = self.pod_pid()
        return child_pids(pid) if pid else []

    def start(
        self, *, pod_pid: Callable[[], int | None], answered: Callable[[], int], pod: Restartable | None = None
    ) -> None:
        """The pods run: start the thread that injects the fault after a third of the answers."""
        self.pod_pid, self.pod = pod_pid, pod
        self.timer = FaultTimer(
            self.fault, answered=answered, trigger=max(1, round(self.requests * INJECT_AFTER_FRACTION))
        )
        self.timer.start()

    def finish(self) -> None:
        """The burst is over: let the timer recover the fault (now, if it never got to)."""
        if isinstance(self.fault, KillHolder):
            self.fault.cancel()
        if self.timer is not None:
            self.timer.finish()

    def __exit__(self, *exc) -> None:
        try:
            self.finish()
            if self.fault is not None:
                self.fault.close()
        finally:
            self._stop_parts()

    def _stop_parts(self) -> None:
        if self.probe is not None:
            self.probe.close()
        if self.pair is not None:
            self.pair.stop()
        if self.node is not None:
            self.node.stop()

    def figures(self, purchases: list[list], *, opened_at: float) -> dict:
        """``fault``, ``phases``, ``resumed_after_s``, ``longest_gap_s`` for the row, and ``fault_problems``:
        what went wrong with the fault itself (never injected, an error, no recovery, sales that did not
        resume in time)."""
        timer = self.timer
        injected = timer.injected_wall if timer else None
        recovered = timer.recovered_wall if timer else None
        resumed = resumed_after(purchases, recovered_at=recovered)
        last_answer = max((purchase[1] for purchase in purchases), default=None)
        problem = timing_problem(
            self.name,
            error=timer.error if timer else None,
            injected=injected,
            recovered=recovered,
            resumed=resumed,
            last_answer=last_answer,
        )
        problems = [problem] if problem else []
        detail = self.fault.description if self.fault else None
        paused = self.fault if isinstance(self.fault, PauseWorker) else None
        into_ms = paused.into_ms if paused else None
        if paused and paused.pid is not None:
            where = {True: "inside its section", False: "not inside its section", None: "unknown"}[paused.holder]
            detail += f"; worker {paused.pid}, {where}"
            if into_ms is not None:
                detail += f", {into_ms:.0f} ms into it (lease {self.env['LOCK_TTL_MS']} ms)"
            if paused.holder is False:
                problems.append(
                    f"{NO_HOLDER_PAUSED}: worker {paused.pid} was frozen outside its section "
                    "(none found inside in time), so this row shows nothing of a paused holder"
                )
        if detail is not None and self.probe is not None and self.probe.error:
            detail += f"; the section probe's last query failed: {self.probe.error}"
        to_wall = timer.to_wall if timer else lambda _: None
        created = self.probe.orders_created() if isinstance(self.fault, KillHolder) and self.probe else []
        extra, more_problems = crash_figures(
            self.fault, purchases, backend=self.backend, to_wall=to_wall, orders_created=created
        )
        return {
            "fault": self.name,
            "fault_description": detail,
            "fault_window": [injected, recovered],
            "paused_into_section_ms": None if into_ms is None else round(into_ms, 1),
            "phases": fault_phases(purchases, opened_at=opened_at, injected_at=injected, recovered_at=recovered),
            "resumed_after_s": resumed,
            "longest_gap_s": longest_gap(purchases, since=None if recovered is None else recovered + GAP_FROM_S),
            "fault_problems": problems + more_problems,
            **extra,
        }


class FaultTimer(threading.Thread):
    """Inject ``fault`` once ``answered()`` reaches ``trigger``, hold it ``fault.hold_s``, recover it.

    ``injected_wall`` / ``recovered_wall`` are the fault's own instants on the wall clock (None until
    reached); ``error`` is what an inject or recover raised. :meth:`finish` cuts the wait short:
    a fault not yet injected never is, one injected is recovered at once.
    """

    def __init__(self, fault: Fault, *, answered: Callable[[], int], trigger: int) -> None:
        super().__init__(name=f"fault:{fault.name}", daemon=True)
        self.fault = fault
        self.answered = answered
        self.trigger = trigger
        self.injected_wall: float | None = None
        self.recovered_wall: float | None = None
        self.error: str | None = None
        self._done = threading.Event()
        self._wall_minus_monotonic = time.time() - time.monotonic()

    def to_wall(self, monotonic: float | None) -> float | None:
        """A ``time.monotonic()`` instant of the fault on the wall clock the purchases are stamped with."""
        return None if monotonic is None else monotonic + self._wall_minus_monotonic

    def run(self) -> None:
        try:
            while self.answered() < self.trigger:
                if self._done.wait(POLL_S):
                    return
            try:
                self.fault.inject()
            finally:
                self.injected_wall = self.to_wall(self.fault.injected_at)
            self._done.wait(self.fault.hold_s)
            self.fault.recover()
            self.recovered_wall = self.to_wall(self.fault.recovered_at)
        except Exception as exc:  # noqa: BLE001 - reported as the row's problem, the row still audited
            self.error = f"{type(exc).__name__}: {exc}"

    def finish(self) -> None:
        self._done.set()
        if self.is_alive():
            self.join()


def own_node(node: RedisNode) -> None:
    """Stop a node of ours left by an interrupted run; refuse a port some other redis-server holds."""
    node.stop()
    if node.ping():
        raise NodeError(f"port {node.port} is taken by a redis-server this run did not start")


def timing_problem(
    name: str,
    *,
    error: str | None,
    injected: float | None,
    recovered: float | None,
    resumed: float | None,
    last_answer: float | None,
) -> str | None:
    """What went wrong with the fault's own timing, in one sentence, or None: an error, never
    injected, never recovered, a fault that outlasted the sale (recovery not observed: no
    invariant is broken, the run just could not show one), or sales that did not resume in time."""
    if error:
        return f"{name} failed: {error}"
    if injected is None:
        return f"the burst ended before {name} was injected: use more --requests"
    if recovered is None:
        return f"{name} was not recovered"
    if resumed is None and (last_answer is None or last_answer < recovered):
        return (
            f"{NOT_OBSERVED}: every purchase was answered before {name} recovered; "
            "use more --requests or a shorter --fault-hold"
        )
    if resumed is None:
        return f"no order was confirmed after {name} recovered"
    if resumed > RESUME_LIMIT_S and name != "kill-holder":
        return f"sales resumed {resumed:.2f}s after {name} recovered (limit {RESUME_LIMIT_S:g}s)"
    return None


class SectionProbe:
    """Which gunicorn workers are inside the purchase section now, from PostgreSQL and /proc.

    The section (read, decide, write, order) is one transaction of several statements, run under
    the lock, so a worker inside it holds the lock. ``db``'s lock is the row lock itself: its
    waiters are inside a transaction too (psycopg 3 sends BEGIN alone, then ``SELECT ... FOR
    UPDATE`` blocks), so a backend waiting on a lock is never the holder, and while any backend
    waits, only those ``pg_blocking_pids()`` names hold what the others wait on. A backend's
    ``client_port`` is the local port of the worker's socket: /proc/net/tcp gives its inode, one
    of the worker's file descriptors. One connection, opened on first use. Its counts of orders
    are of ``sku``'s alone: another sale in the same database must not pass for the burst's.
    """

    QUERY = (
        "WITH open AS (SELECT pid, client_port, xact_start, pg_blocking_pids(pid) AS blockers FROM pg_stat_activity "
        "WHERE datname = current_database() AND pid <> pg_backend_pid() "
        "AND client_port IS NOT NULL AND xact_start IS NOT NULL "
        # More than one statement: a lone autocommit statement starts its transaction as it starts.
        "AND (state LIKE 'idle in transaction%' OR xact_start < query_start)), "
        "blocking AS (SELECT DISTINCT unnest(pg_blocking_pids(pid)) AS pid FROM pg_stat_activity "
        "WHERE datname = current_database()) "
        "SELECT client_port, extract(epoch FROM clock_timestamp() - xact_start) * 1000 FROM open "
        "WHERE cardinality(blockers) = 0 "
        "AND (pid IN (SELECT pid FROM blocking) OR NOT EXISTS (SELECT FROM blocking))"
    )

    def __init__(self, database_url: str, *, sku: str) -> None:
        self.database_url = database_url
        self.sku = sku
        self._conn: psycopg.Connection | None = None
        #: Why the last :meth:`inside` could not ask PostgreSQL (its answer was then "nobody"), or None.
        self.error: str | None = None

    def inside(self, pids) -> dict[int, float]:
        """Those of ``pids`` inside their section now, each with how long its transaction has been
        open (ms): a lease taken just before it has about that much less left."""
        try:
            if self._conn is None:
                self._conn = psycopg.connect(self.database_url, autocommit=True, connect_timeout=2)
            ages = {port: float(age) for port, age in self._conn.execute(self.QUERY)}
        except psycopg.Error as exc:
            # A fault must not end the run for it, but its row says so; the next call reconnects.
            self.error = (str(exc).strip() or type(exc).__name__).splitlines()[0]
            self.close()
            return {}
        self.error = None
        sockets: dict[str, float] = {}
        for table in ("/proc/net/tcp", "/proc/net/tcp6"):
            try:
                with open(table) as lines:
                    next(lines)
                    for line in lines:
                        fields = line.split()
                        port = int(fields[1].rsplit(":", 1)[1], 16)
                        if port in ages:
                            sockets[f"socket:[{fields[9]}]"] = ages[port]
            except OSError:
                continue
        found: dict[int, float] = {}
        for pid in pids:
            try:
                held = [
                    sockets[link] for fd in Path(f"/proc/{pid}/fd").iterdir() if (link := str(fd.readlink())) in sockets
                ]
            except OSError:
                continue
            if held:
                found[pid] = max(held)
        return found

    def orders(self) -> int:
        """How many orders of the burst's product the database holds (grows with every confirmed
        purchase); -1 if it cannot say."""
        try:
            if self._conn is None:
                self._conn = psycopg.connect(self.database_url, autocommit=True, connect_timeout=2)
            return self._conn.execute(f"SELECT count(*) {OF_PRODUCT}", [self.sku]).fetchone()[0]
        except psycopg.Error:
            return -1

    def orders_created(self) -> list[float]:
        """When each order of the burst's product was created (wall clock, in its section just before
        its commit); [] if it cannot say."""
        try:
            if self._conn is None:
                self._conn = psycopg.connect(self.database_url, autocommit=True, connect_timeout=2)
            return [row[0] for row in self._conn.execute(ORDERS_CREATED, [self.sku])]
        except psycopg.Error:
            return []

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None


def crash_figures(
    fault: Fault | None, purchases: list[list], *, backend: str, to_wall, orders_created: list[float]
) -> tuple[dict, list[str]]:
    """kill-holder's kills and kill-zk-member's busy answers outside the time its majority was down,
    with what went wrong; nothing for the other faults."""
    if isinstance(fault, KillHolder):
        return holder_kills(fault, backend=backend, to_wall=to_wall, orders_created=orders_created)
    if isinstance(fault, KillFollowerThenLeader) and fault.majority_lost_at is not None:
        lost, back = to_wall(fault.majority_lost_at), to_wall(fault.recovered_at)
        busy = [at for p in purchases for at in p[4] if at < lost or (back is not None and at > back + RESUME_LIMIT_S)]
        if busy:
            return {}, [f"{len(busy)} purchases were told busy while a majority of ZooKeeper members ran"]
    return {}, []


def holder_kills(fault: KillHolder, *, backend: str, to_wall, orders_created: list[float]) -> tuple[dict, list[str]]:
    """Per kill: when (wall clock), which worker, whether it was inside its section, ``stalled_s``
    and what freed the dead holder's lock.

    ``stalled_s`` runs from the kill to the first order created after it (``orders_created``, wall
    clock): the next holder got the lock. Not to the next 201: a keyed resend can be answered 201
    from its order by the plain read, without the lock, while the lock may still be blocked."""
    kills, problems = [], []
    for number, kill in enumerate(fault.kills, start=1):
        at = to_wall(kill["at"])
        stalled = first_after(orders_created, since=at)
        kills.append({**kill, "at": at, "stalled_s": stalled, "freed_by": FREED_BY.get(backend)})
        if stalled is None:
            problems.append(f"no order was committed after kill {number} (worker {kill['pid']})")
        if not kill["holder"]:
            problems.append(f"kill {number}: worker {kill['pid']} was not inside its section (none found in time)")
    if len(kills) < fault.count:
        problems.append(f"the burst ended after {len(kills)} of {fault.count} kills: use more --requests")
    return {"kills": kills, "lock_timeout_ms": None if backend == "db" else KILL_HOLDER_TTL_MS}, problems
