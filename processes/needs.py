"""The processes behind what the strategies need: the project's own Redlock nodes, etcd cluster, ZooKeeper ensemble.

A strategy declares what it needs as values, a kind and the URLs it will talk to
(``inventory.strategies.contract.Needed``: ``kind="redis"`` with one URL, ``kind="etcd"`` with the
member endpoints); it starts nothing itself. :func:`processes_for` maps each need to a
:class:`~processes.protocol.Process`: a Redis URL served by one of the project's private nodes
(``REDLOCK_BASE_PORT``) to that node, any other Redis URL to :class:`MachineRedis` (used, never
started), etcd endpoints to the project's cluster on them, ZooKeeper hosts to its ensemble.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterable, Iterator, Protocol, Sequence

from django.conf import settings

from .etcd_cluster import EtcdCluster
from .nodes import RedisNodes, ping_error
from .protocol import Process, ProcessUnavailable, started_while_needed
from .zookeeper_ensemble import ZooKeeperEnsemble


class Need(Protocol):
    """What a strategy declares it needs (``inventory.strategies.contract.Needed`` has this shape)."""

    kind: str
    urls: tuple[str, ...]


@dataclass(frozen=True)
class MachineRedis:
    """A Redis the project only uses (the machine's, ``REDIS_URL``): never started nor stopped here."""

    url: str
    startable = False

    @property
    def description(self) -> str:
        return f"redis-server {self.url}"

    def running(self) -> bool:
        return ping_error(self.url, timeout_s=1) is None

    def start(self) -> None:
        raise ProcessUnavailable(
            f"Redis at {self.url} does not answer: start it (Debian: apt-get install redis-server)"
        )

    def stop(self) -> None:
        """Not the project's to stop."""


def project_nodes() -> RedisNodes:
    """The project's private Redlock nodes (``REDLOCK_BASE_PORT``, five by default)."""
    return RedisNodes(
        base_port=settings.REDLOCK_BASE_PORT, count=settings.REDLOCK_NODE_COUNT, run_dir=settings.RUN_DIR / "redlock"
    )


def project_cluster(endpoints: Sequence[str] | None = None) -> EtcdCluster:
    """The project's cluster serving ``endpoints`` (default: ``settings.INVENTORY["ETCD_ENDPOINTS"]``),
    its data under ``RUN_DIR/etcd``."""
    endpoints = settings.INVENTORY["ETCD_ENDPOINTS"] if endpoints is None else endpoints
    return EtcdCluster.from_endpoints(endpoints, run_dir=settings.RUN_DIR / "etcd")


def project_ensemble(hosts: Sequence[str] | None = None) -> ZooKeeperEnsemble:
    """The project's ZooKeeper ensemble serving ``hosts`` (default: ``settings.INVENTORY["ZOOKEEPER_HOSTS"]``),
    its data under ``RUN_DIR/zookeeper``."""
    hosts = settings.INVENTORY["ZOOKEEPER_HOSTS"] if hosts is None else hosts
    return ZooKeeperEnsemble.from_hosts(hosts, run_dir=settings.RUN_DIR / "zookeeper")


def processes_for(needs: Iterable[Need]) -> list[Process]:
    """One process per distinct need, in the order needed."""
    ours = {node.url: node for node in project_nodes()}
    found: dict[str, Process] = {}
    for need in needs:
        if need.kind == "redis":
            processes = [ours.get(url) or MachineRedis(url) for url in need.urls]
        elif need.kind == "etcd":
            processes = [project_cluster(need.urls)]
        elif need.kind == "zookeeper":
            processes = [project_ensemble(need.urls)]
        else:
            raise ProcessUnavailable(f"no process serves a need of kind {need.kind!r}: use redis, etcd or zookeeper")
        for process in processes:
            found.setdefault(process.description, process)
    return list(found.values())


@contextmanager
def processes_running(needs: Iterable[Need]) -> Iterator[list[Process]]:
    """Start what ``needs`` names and is down; at the end stop those, only those.

    Processes someone else runs are used and left running; one that is down and not the
    project's to start raises :class:`ProcessUnavailable` saying what to do.
    """
    with started_while_needed(processes_for(needs)) as started:
        yield started
