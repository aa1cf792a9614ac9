"""The CPU a burst round cost each request, by who spent it: the pods, Locust, PostgreSQL, Redis (``/proc``).

A row's ``×floor`` compares two rounds on the same pods. On two cores shared by everything, a round
that keeps them busy is bound by CPU: its rate is the cores over what one request costs every
process that serves and drives it, so the ratio of two such rounds is the ratio of their costs. The
row reads that cost: the driver snapshots the CPU time (user + system, ``/proc/PID/stat``) of the
processes it knows at each round's opening (its countdown's last look) and end, and a round's cost
is the difference over its answered requests, in milliseconds. The pods and Locust are the row's
own process trees; the services are every process of their name on the machine (PostgreSQL's
backends, the Redis servers, etcd, ZooKeeper's JVMs, HAProxy), so a measurement means something
only on a machine where nothing else uses them. A process that ends between the two snapshots takes
its CPU with it (the pods and Locust live through the row). Where ``/proc`` is missing the row has
no CPU figures.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Iterable

PROC = Path("/proc")
#: The services' processes by name (``/proc/PID/comm``); ZooKeeper is a JVM.
SERVICES = {
    "postgres": "postgres",
    "redis-server": "redis",
    "etcd": "lock service",
    "java": "lock service",
    "haproxy": "balancer",
}
#: How a round's cost is printed and stored: the row's own processes first.
ORDER = ("pods", "postgres", "redis", "lock service", "balancer", "locust")


def _processes() -> dict[int, tuple[int, str, float]]:
    """Every process: pid → (parent pid, name, CPU seconds so far)."""
    tick = os.sysconf("SC_CLK_TCK")
    found = {}
    for entry in PROC.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:  # it ended meanwhile
            continue
        name, rest = stat[stat.index("(") + 1 : stat.rindex(")")], stat[stat.rindex(")") + 2 :].split()
        # After the name: state, ppid, ..., utime (14th field of the line) and stime (15th).
        found[int(entry.name)] = (int(rest[1]), name, (int(rest[11]) + int(rest[12])) / tick)
    return found


def snapshot(roots: dict[str, Iterable[int]]) -> dict[str, float] | None:
    """CPU seconds so far by group: each of ``roots``' groups is the process trees under its pids,
    the rest are the :data:`SERVICES` by name; None where there is no ``/proc``."""
    if not PROC.is_dir():
        return None
    processes = _processes()
    owners = {pid: group for group, pids in roots.items() for pid in pids}
    totals: dict[str, float] = {}
    for pid, (_, name, seconds) in processes.items():
        group = _owner(pid, processes, owners) or SERVICES.get(name)
        if group is not None:
            totals[group] = totals.get(group, 0.0) + seconds
    return totals


def _owner(pid: int, processes: dict[int, tuple[int, str, float]], owners: dict[int, str]) -> str | None:
    """The group of the nearest ancestor of ``pid`` (itself included) among ``owners``' pids."""
    for _ in range(32):  # deeper than any tree the row starts
        if pid in owners:
            return owners[pid]
        parent = processes.get(pid)
        if parent is None or parent[0] <= 1:
            return None
        pid = parent[0]
    return None


def per_request(before: dict[str, float] | None, after: dict[str, float] | None, requests: int) -> dict | None:
    """Milliseconds of CPU a request between two snapshots, by group (:data:`ORDER`) and in ``total``."""
    if before is None or after is None or requests <= 0:
        return None
    spent = {group: max(0.0, after.get(group, 0.0) - before.get(group, 0.0)) for group in after}
    cost = {group: round(spent[group] / requests * 1000, 3) for group in ORDER if spent.get(group)}
    cost["total"] = round(sum(spent.values()) / requests * 1000, 3)
    return cost
