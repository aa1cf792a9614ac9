"""Faults a burst injects into processes the project started itself: kills, restarts, a failover, a pause.

Every fault has a ``name`` (what ``flashsale --fault`` accepts), a one-line ``description``,
``inject()`` and ``recover()``, and ``hold_s``: how long the caller should leave it in between the
two. Both calls record ``time.monotonic()`` (``injected_at`` when ``inject`` is called,
``recovered_at`` once ``recover`` has returned, the service back), so a run can split its requests
into the phases ``before`` / ``during`` / ``after`` with :meth:`Fault.phase`. ``close()`` recovers
a fault that was injected and not recovered (use it in a ``finally``), so nothing stays killed or
stopped.

A fault acts only on what it is given: :class:`processes.nodes.RedisNode` processes, a
:class:`processes.replication.ReplicatedPair`, processes that answer ``kill()`` / ``start()``
(an etcd member, a gunicorn pod), or pids a caller's own ``workers()`` returns (use
:func:`processes.pidfile.child_pids` of the
gunicorn master it started). It never looks for processes by name.

>>> fault = make_fault("kill-minority", redlock_nodes=nodes)
>>> fault.inject(); time.sleep(fault.hold_s); fault.recover()
>>> fault.phase(t)     # 'before', 'during' or 'after' for a time.monotonic() t
"""

from __future__ import annotations

import time
from typing import Callable, Mapping, Sequence

from processes.nodes import RedisNode, RedisNodes
from processes.protocol import Restartable
from processes.replication import ReplicatedPair

from .base import FAULT_STRATEGIES, Fault, FaultError, freeze, resume
from .crash import build_kill_holder, build_kill_zk_member


class KillProcesses(Fault):
    """SIGKILL some processes (they lose everything they kept in memory); recover starts them again.

    ``members`` is called at inject time, so a caller can pick then (an etcd cluster's leader, say).
    """

    def __init__(
        self,
        *,
        name: str,
        description: str,
        members: Callable[[], Sequence[Restartable]],
        hold_s: float,
        strategies: frozenset[str] | None = None,
    ) -> None:
        self.name, self.description, self.strategies = name, description, strategies
        super().__init__(hold_s=hold_s)
        self._members = members
        self.killed: list[Restartable] = []

    def _inject(self) -> None:
        self.killed = list(self._members())
        for member in self.killed:
            member.kill()

    def _recover(self) -> None:
        for member in self.killed:
            member.start()


class Failover(Fault):
    """The ``redis`` strategy's master dies with writes its replica never got; the replica takes over.

    inject: hold the replication stream for ``lag_s`` (writes acknowledged then are on the master
    only; the call blocks that long), then SIGKILL the master: clients on ``pair.front`` are cut
    off. recover: promote the replica (``REPLICAOF NO ONE``) and point ``pair.front`` at it. Locks
    and fence increments of the lag are lost: the promoted counter is behind, so fences repeat
    until it passes the row's fence, and those writes are refused by the storage check.
    """

    name = "failover"
    description = "the Redis master dies before its last writes replicate; the replica is promoted"
    strategies = FAULT_STRATEGIES["failover"]

    def __init__(self, *, pair: ReplicatedPair, hold_s: float, lag_s: float) -> None:
        super().__init__(hold_s=hold_s)
        if lag_s < 0:
            raise FaultError(f"failover: lag_s must be >= 0, got {lag_s}")
        self.pair = pair
        self.lag_s = lag_s
        self.replication_lag: tuple[int, int] | None = None  # (master offset, replica offset) at the kill

    def _inject(self) -> None:
        self.pair.hold_replication()
        time.sleep(self.lag_s)
        self.replication_lag = self.pair.offsets()
        self.pair.kill_master()

    def _recover(self) -> None:
        self.pair.promote()
        front = self.pair.front
        if front is None:
            raise FaultError("failover: the pair is not started")
        front.retarget(self.pair.replica.port)


#: pause-worker stops a holder whose section has run at most this share of the lease, if it finds one.
FRESH_SHARE = 0.25
#: How long a search for a holder lets every worker run between two looks (each look stops them all).
SEARCH_PAUSE_S = 0.01


class PauseWorker(Fault):
    """SIGSTOP one worker process past the lock's lease, then SIGCONT it.

    ``workers`` returns the pids the caller started (see :func:`child_pids`); the first is stopped.
    While stopped, the worker keeps whatever lease it held; after it, its late writes meet the
    storage check.

    A pause shows something only when it freezes a holder inside its section, with most of its
    lease left. ``holding`` (pids → those inside it now, each with how long its section has run,
    ms) makes inject aim: it stops the worker ``holding`` names whose section is youngest (else
    the first), asks again once it is stopped, and if it is not inside, or has run past
    ``fresh_ms`` (a quarter of ``lease_ttl_ms``), resumes it and tries again. After ``search_s``
    any holder will do, and after twice that the last one stays stopped, inside or not (a machine
    so starved that no section is seen young, or none at all). ``holder`` says whether it was inside, and
    ``into_ms`` how long its section had run when it was stopped. (A holder found by looking is
    more often one whose section runs long: on a starved machine one frozen past most of its lease
    let the others wait only the little left, 312 ms of a 1,000 ms lease in CI on 2026-12-04.)
    """

    name = "pause-worker"
    description = "a gunicorn worker is frozen (SIGSTOP) past the lock's lease, then resumed (SIGCONT)"
    strategies = FAULT_STRATEGIES["pause-worker"]

    def __init__(
        self,
        *,
        workers: Callable[[], Sequence[int]],
        hold_s: float,
        holding: Callable[[Sequence[int]], Mapping[int, float]] | None = None,
        lease_ttl_ms: float | None = None,
        search_s: float = 2.0,
    ) -> None:
        super().__init__(hold_s=hold_s)
        self._workers = workers
        self._holding = holding
        self.search_s = search_s
        self.fresh_ms = None if lease_ttl_ms is None else lease_ttl_ms * FRESH_SHARE
        self.pid: int | None = None
        self.holder: bool | None = None  # None: not asked (no ``holding``)
        self.into_ms: float | None = None

    def _inject(self) -> None:
        if self._holding is None:
            self.pid = self._pids()[0]
            freeze(self.pid)
            return
        deadline = time.monotonic() + self.search_s
        while True:
            pids = self._pids()
            # Every worker stopped before the probe asks: a BATCH 1 section lasts 1-3 ms, about a
            # probe's own time on a loaded machine, so one seen inside while its process ran had
            # often left by the time the freeze landed. Stopped, it is still inside when chosen.
            freeze(*pids)
            inside = self._holding(pids)
            fresh = {pid: ms for pid, ms in inside.items() if self.fresh_ms is None or ms <= self.fresh_ms}
            late = time.monotonic() - deadline
            # Past the search, any holder will do; past twice it, the last worker stays stopped.
            candidates = fresh or (inside if late > 0 else {})
            chosen = min(candidates, key=candidates.__getitem__) if candidates else None
            if chosen is None and late > self.search_s:
                chosen = pids[-1]
            resume(*[pid for pid in pids if pid != chosen])
            if chosen is not None:
                self.pid, self.into_ms = chosen, inside.get(chosen)
                self.holder = self.into_ms is not None
                return
            time.sleep(SEARCH_PAUSE_S)  # the sale runs on between two looks

    def _pids(self) -> list[int]:
        pids = list(self._workers())
        if not pids:
            raise FaultError("pause-worker: no worker process to pause")
        return pids

    def _recover(self) -> None:
        resume(self.pid)  # it may have died while stopped (its master killed it)


#: The default hold of the crash-and-restart faults (restart-redis, kill-majority): the node is back
#: about as soon as a supervisor would bring it back.
CRASH_RESTART_HOLD_S = 0.1


FAULT_NAMES = tuple(FAULT_STRATEGIES)


def make_fault(
    name: str,
    *,
    redlock_nodes: RedisNodes | None = None,
    redis_node: RedisNode | None = None,
    pair: ReplicatedPair | None = None,
    workers: Callable[[], Sequence[int]] | None = None,
    lease_ttl_ms: int | None = None,
    etcd_cluster=None,
    zookeeper_ensemble=None,
    hold_s: float | None = None,
    lag_s: float = 0.2,
    holding: Callable[[Sequence[int]], Mapping[int, float]] | None = None,
    sold: Callable[[], int] | None = None,
    pod: Callable[[], Restartable] | None = None,
) -> Fault:
    """The fault called ``name``, acting on the part it needs; :class:`FaultError` names a missing one.

    Each name has one builder below (``_FAULT_BUILDERS``; ``kill-zk-member`` and ``kill-holder``
    in :mod:`faults.crash`), which says which part it needs and how long it holds by default.
    """

    def need(part, what: str):
        if part is None:
            raise FaultError(f"{name} needs {what}")
        return part

    build = _FAULT_BUILDERS.get(name)
    if build is None:
        raise FaultError(f"unknown fault {name!r}: choose one of {', '.join(FAULT_NAMES)}")
    return build(
        name,
        need,
        redlock_nodes=redlock_nodes,
        redis_node=redis_node,
        pair=pair,
        workers=workers,
        lease_ttl_ms=lease_ttl_ms,
        etcd_cluster=etcd_cluster,
        zookeeper_ensemble=zookeeper_ensemble,
        hold_s=hold_s,
        lag_s=lag_s,
        holding=holding,
        sold=sold,
        pod=pod,
    )


# One builder per fault name, for make_fault: each takes the name, make_fault's ``need`` and all its parts.


def _kill_redlock_nodes(name: str, need, *, redlock_nodes, hold_s, **_) -> Fault:
    """``kill-minority`` / ``kill-majority``: ``redlock_nodes``; kills the first (N-1)//2 or N//2+1
    nodes, restarts them empty. Default hold 2 s for a minority; 0.1 s for a majority, a crash
    and restart (a hold of 1 s let most of the clients' stale connections fail and be dropped
    before a release could pick one: issue 16). The distlock page delays a restart by one TTL;
    restarted sooner, a majority of forgetful nodes can grant a lock that is still held, and only
    the storage check keeps the second holder's write out."""
    nodes = need(redlock_nodes, "the Redlock nodes (redlock_nodes=RedisNodes)")
    count = (len(nodes) - 1) // 2 if name == "kill-minority" else len(nodes) // 2 + 1
    if count < 1:
        raise FaultError(f"{name} needs at least 3 Redlock nodes, got {len(nodes)}")
    which = "a minority" if name == "kill-minority" else "a majority"
    return KillProcesses(
        name=name,
        strategies=FAULT_STRATEGIES[name],
        hold_s=(2.0 if name == "kill-minority" else CRASH_RESTART_HOLD_S) if hold_s is None else hold_s,
        description=f"{count} of {len(nodes)} Redlock nodes ({which}) are killed, then restarted empty",
        members=lambda: list(nodes)[:count],
    )


def _restart_redis(name: str, need, *, redis_node, hold_s, **_) -> Fault:
    """``restart-redis``: ``redis_node`` (a private node, never the machine's 6379); SIGKILL, then
    start empty. Default hold 0.1 s, a crash and restart (as for ``kill-majority``)."""
    node = need(redis_node, "a private Redis node (redis_node=RedisNode)")
    return KillProcesses(
        name=name,
        strategies=FAULT_STRATEGIES[name],
        hold_s=CRASH_RESTART_HOLD_S if hold_s is None else hold_s,
        description=f"the lock's Redis (port {node.port}) is killed and restarted empty",
        members=lambda: [node],
    )


def _failover(name: str, need, *, pair, hold_s, lag_s, **_) -> Fault:
    """``failover``: ``pair`` (started); see :class:`Failover`. Default hold 1 s, ``lag_s`` 0.2 s."""
    return Failover(
        pair=need(pair, "a started master + replica (pair=ReplicatedPair)"),
        hold_s=1.0 if hold_s is None else hold_s,
        lag_s=lag_s,
    )


def _pause_worker(name: str, need, *, workers, lease_ttl_ms, hold_s, holding, **_) -> Fault:
    """``pause-worker``: ``workers`` and ``lease_ttl_ms``; default hold 1.5 × the lease. With
    ``holding``, it aims at a worker early in its section (see :class:`PauseWorker`)."""
    workers = need(workers, "the worker pids it may pause (workers=callable returning pids)")
    ttl_ms = need(lease_ttl_ms, "the lock's lease (lease_ttl_ms)")
    hold_s = ttl_ms * 1.5 / 1000.0 if hold_s is None else hold_s
    if hold_s * 1000.0 <= ttl_ms:
        raise FaultError(f"pause-worker: hold_s {hold_s} s does not outlast the {ttl_ms} ms lease")
    return PauseWorker(workers=workers, hold_s=hold_s, holding=holding, lease_ttl_ms=ttl_ms)


def _kill_etcd_member(name: str, need, *, etcd_cluster, hold_s, **_) -> Fault:
    """``kill-etcd-member``: ``etcd_cluster`` (indexable members with ``kill()`` / ``start()``, and
    ``leader()`` if it has one): kills the leader (else member 0), restarts it. Default hold 2 s."""
    cluster = need(etcd_cluster, "the etcd cluster (etcd_cluster=EtcdCluster)")

    def victim() -> list[Restartable]:
        leader = cluster.leader() if hasattr(cluster, "leader") else None
        return [leader if leader is not None else cluster[0]]

    return KillProcesses(
        name=name,
        strategies=FAULT_STRATEGIES[name],
        hold_s=2.0 if hold_s is None else hold_s,
        description="the etcd leader (else member 0) is killed, then restarted with its data",
        members=victim,
    )


def _kill_pod(name: str, need, *, pod, hold_s, **_) -> Fault:
    """``kill-pod``: ``pod`` (returns the pod at inject time): SIGKILL to its gunicorn master and
    workers, then started again on its port. Default hold 1 s."""
    pod = need(pod, "the pod to kill (pod=callable returning it)")
    return KillProcesses(
        name=name,
        strategies=FAULT_STRATEGIES[name],
        hold_s=1.0 if hold_s is None else hold_s,
        description="a whole pod (its gunicorn master and workers) is killed, then started again",
        members=lambda: [pod()],
    )


_FAULT_BUILDERS: dict[str, Callable[..., Fault]] = {
    "kill-minority": _kill_redlock_nodes,
    "kill-majority": _kill_redlock_nodes,
    "restart-redis": _restart_redis,
    "failover": _failover,
    "pause-worker": _pause_worker,
    "kill-etcd-member": _kill_etcd_member,
    "kill-zk-member": build_kill_zk_member,
    "kill-holder": build_kill_holder,
    "kill-pod": _kill_pod,
}
