"""Faults that crash processes in sequence: ``kill-holder`` and ``kill-zk-member``.

``kill-holder`` SIGKILLs a gunicorn worker found inside its purchase section (so it holds the
SKU's lock) three times in a run: the commonest lock failure in production (an OOM kill, a deploy,
a lost node). Each strategy frees the dead holder's lock its own way, and the run measures how
long the SKU stays blocked (:data:`FREED_BY`). The gunicorn master starts a new worker by itself,
so there is nothing to recover.

``kill-zk-member`` kills a ZooKeeper follower (grants go on with two of three), then, while it is
still down, the leader (no majority: purchases are told busy), and recovery starts both again.

Built by :func:`faults.registry.make_fault`, like every fault; they act only on the processes
they are given.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from typing import Callable, Collection, Sequence

from processes.protocol import Restartable

from .base import FAULT_STRATEGIES, Fault, FaultError, freeze, resume

#: What frees a dead holder's lock, per strategy (the stall is then at most the timeout named).
FREED_BY = {
    "db": "PostgreSQL aborts the dead connection's transaction, releasing its row lock at once",
    "redis": "the lock key's TTL (LOCK_TTL_MS) runs out",
    "redlock": "the keys' TTL (LOCK_TTL_MS) runs out on a majority of the nodes",
    "etcd": "the dead process's session lease (LOCK_TTL_MS, whole seconds) expires",
    "zookeeper": "the dead process's session times out (LOCK_TTL_MS) and its ephemeral znode is deleted",
}


class KillHolder(Fault):
    """SIGKILL a worker inside its purchase section ``count`` times, each once the sale has moved on.

    ``workers`` returns the pids it may kill; ``holding(pids)`` those inside their section now;
    ``sold()`` a number that grows with every confirmed purchase (orders in the database). Each
    kill freezes every worker (SIGSTOP), SIGKILLs one ``holding`` names and resumes the rest;
    after ``search_s`` without finding one it kills the first worker anyway (``holder`` False).
    The next kill waits until ``sold()`` has grown (the stall is over) and then ``spacing_s``, at
    most ``give_up_s`` in all; :meth:`cancel` ends the sequence early.

    ``kills`` records each: ``at`` (``time.monotonic()``), ``pid``, ``holder``.
    """

    name = "kill-holder"
    description = "a gunicorn worker inside its purchase section is killed (SIGKILL), three times"
    strategies = FAULT_STRATEGIES["kill-holder"]

    def __init__(
        self,
        *,
        workers: Callable[[], Sequence[int]],
        holding: Callable[[Sequence[int]], Collection[int]],
        sold: Callable[[], int],
        count: int = 3,
        spacing_s: float = 0.5,
        give_up_s: float = 30.0,
        search_s: float = 10.0,
    ) -> None:
        super().__init__(hold_s=0.0)
        if count < 1:
            raise FaultError(f"kill-holder: count must be >= 1, got {count}")
        self._workers, self._holding, self._sold = workers, holding, sold
        self.count, self.spacing_s, self.give_up_s, self.search_s = count, spacing_s, give_up_s, search_s
        self.kills: list[dict] = []
        self._cancelled = False

    def cancel(self) -> None:
        """The burst is over: make no further kill."""
        self._cancelled = True

    def _inject(self) -> None:
        for number in range(self.count):
            if number and not self._until_sold_again():
                return
            self.kills.append(self._kill_one())

    def _until_sold_again(self, *, spacing_s: float | None = None) -> bool:
        """Wait until ``sold()`` grows, then ``spacing_s`` (default: the kills' own); False when
        cancelled or past ``give_up_s``."""
        before = self._sold()
        deadline = time.monotonic() + self.give_up_s
        while self._sold() <= before:
            if self._cancelled or time.monotonic() > deadline:
                return False
            time.sleep(0.02)
        time.sleep(self.spacing_s if spacing_s is None else spacing_s)
        return not self._cancelled

    def _kill_one(self) -> dict:
        """Freeze every worker, ask which is inside its section, kill that one, resume the others.

        Frozen together, a worker inside its section stays inside while the probe looks (a holder
        of a lock with a slow hand-off spends little of its time inside one transaction).
        """
        deadline = time.monotonic() + self.search_s
        while True:
            pids = list(self._workers())
            if not pids:
                raise FaultError("kill-holder: no worker process to kill")
            freeze(*pids)
            inside = self._holding(pids)
            if inside or time.monotonic() > deadline:
                victim = min(inside) if inside else pids[0]
                at = time.monotonic()
                with contextlib.suppress(ProcessLookupError):
                    os.kill(victim, signal.SIGKILL)
                resume(*[pid for pid in pids if pid != victim])
                return {"at": at, "pid": victim, "holder": bool(inside)}
            resume(*pids)
            time.sleep(0.02)

    def _recover(self) -> None:
        """Wait for the sale to move on after the last kill (the gunicorn master has replaced each
        killed worker by itself), so the fault's window holds every stall; no spacing after it,
        which only keeps kills apart: on a fast sale (600/s) it left nothing to sell after the
        recovery, and the run could not show the sale resuming."""
        self._until_sold_again(spacing_s=0.0)


class KillFollowerThenLeader(Fault):
    """Kill a follower of a ZooKeeper ensemble, ``follower_s`` later the leader; recover starts both.

    ``ensemble`` has members with ``kill()`` / ``start()`` and ``leader()``; ``majority_lost_at``
    is when the leader died (``time.monotonic()``), the start of the window where purchases
    may be told busy.
    """

    name = "kill-zk-member"
    description = "a ZooKeeper follower is killed, then the leader while it is down; both restart with their data"
    strategies = FAULT_STRATEGIES["kill-zk-member"]

    def __init__(self, *, ensemble, hold_s: float, follower_s: float) -> None:
        super().__init__(hold_s=hold_s)
        self.ensemble = ensemble
        self.follower_s = follower_s
        self.killed: list[Restartable] = []
        self.majority_lost_at: float | None = None

    def _inject(self) -> None:
        leader = self.ensemble.leader()
        if leader is None:
            raise FaultError("kill-zk-member: the ensemble has no leader to kill")
        follower = next(member for member in self.ensemble if member is not leader)
        follower.kill()
        self.killed = [follower]
        time.sleep(self.follower_s)
        leader = self.ensemble.leader() or leader  # re-elected meanwhile? kill whoever leads now
        leader.kill()
        self.killed.append(leader)
        self.majority_lost_at = time.monotonic()

    def _recover(self) -> None:
        for member in self.killed:
            member.spawn()
        self.ensemble.reset()


def build_kill_holder(name: str, need, *, workers, holding, sold, **_) -> Fault:
    return KillHolder(
        workers=need(workers, "the worker pids it may kill (workers=callable returning pids)"),
        holding=need(holding, "which workers are inside their section (holding=callable)"),
        sold=need(sold, "a count of confirmed purchases (sold=callable)"),
    )


def build_kill_zk_member(name: str, need, *, zookeeper_ensemble, hold_s, **_) -> Fault:
    ensemble = need(zookeeper_ensemble, "the ZooKeeper ensemble (zookeeper_ensemble=ZooKeeperEnsemble)")
    return KillFollowerThenLeader(ensemble=ensemble, hold_s=2.0 if hold_s is None else hold_s, follower_s=2.0)
