"""A private 3-member etcd cluster on 127.0.0.1: the ``etcd`` strategy's lock service, and test clusters.

The project starts and stops it itself: member ``i`` serves clients on ``client_ports[i]`` and
its peers on ``client_ports[i] + peer_offset``; data, pid and log files live under ``run_dir``.
etcd runs with its defaults otherwise, fsync included: every grant is a raft commit written to
disk on a majority, which is what bounds the lock's rate.

The data outlives :meth:`EtcdCluster.stop`: revisions (the lock's fences) must keep growing
across restarts, since storage already holds fences from earlier runs. :meth:`EtcdCluster.wipe`
starts over from revision 1, for test clusters only.

Fault tests use :meth:`EtcdMember.kill`, :meth:`EtcdMember.pause` (``SIGSTOP``) and
:meth:`EtcdMember.resume`; a killed member rejoins with its data on :meth:`EtcdMember.start`.

No Django import: the lock library's tests and benchmarks use this module on its own.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Sequence
from urllib.parse import urlsplit

import requests

from .members import Member, MemberGroup
from .nodes import NodeError

INSTALL_HINT = "etcd not found on PATH: install it (Debian: apt-get install etcd-server)"


class EtcdClusterError(NodeError):
    """A member of the private etcd cluster could not be started or stopped (caught like a Redis node's)."""


def etcd_binary() -> str:
    path = shutil.which("etcd")
    if path is None:
        raise EtcdClusterError(INSTALL_HINT)
    return path


def _get_ok(url: str, timeout_s: float) -> requests.Response | None:
    try:
        response = requests.get(url, timeout=timeout_s)
    except requests.RequestException:
        return None
    return response if response.status_code == 200 else None


class EtcdMember(Member):
    """One ``etcd`` process of a cluster; ``initial_cluster`` names every member's peer URL.

    Killed, it keeps what it had fsynced for :meth:`start`. A member answers only while it can
    reach a majority (itself included): restart one at a time, or start a whole cluster with
    :meth:`EtcdCluster.start`.
    """

    product = "etcd"
    error = EtcdClusterError

    def __init__(
        self,
        *,
        name: str,
        client_port: int,
        peer_port: int,
        run_dir: Path,
        initial_cluster: str,
        cluster_token: str,
        heartbeat_ms: int,
        election_ms: int,
        host: str = "127.0.0.1",
    ) -> None:
        self.name = name
        self.host = host
        self.client_port = client_port
        self.peer_port = peer_port
        self.run_dir = run_dir
        self.initial_cluster = initial_cluster
        self.cluster_token = cluster_token
        self.heartbeat_ms = heartbeat_ms
        self.election_ms = election_ms

    @property
    def endpoint(self) -> str:
        return f"http://{self.host}:{self.client_port}"

    @property
    def where(self) -> str:
        return self.endpoint

    @property
    def peer_url(self) -> str:
        return f"http://{self.host}:{self.peer_port}"

    @property
    def data_dir(self) -> Path:
        return self.run_dir / f"{self.name}.etcd"

    @property
    def stem(self) -> str:
        return self.name

    def answers(self, timeout_s: float = 0.3) -> bool:
        """The process serves HTTP (``/version``); says nothing about quorum."""
        return _get_ok(f"{self.endpoint}/version", timeout_s) is not None

    def healthy(self, timeout_s: float = 0.5) -> bool:
        """The member has a leader and serves a quorum read (etcd's ``/health``)."""
        response = _get_ok(f"{self.endpoint}/health", timeout_s)
        try:
            return response is not None and response.json().get("health") == "true"
        except ValueError:
            return False

    def spawn(self) -> subprocess.Popen | None:
        """Start the process without waiting for it; None when it already runs."""
        if self.pid() is not None:
            return None
        self.run_dir.mkdir(parents=True, exist_ok=True)
        args = [
            etcd_binary(),
            "--name",
            self.name,
            "--data-dir",
            str(self.data_dir),
            "--listen-client-urls",
            self.endpoint,
            "--advertise-client-urls",
            self.endpoint,
            "--listen-peer-urls",
            self.peer_url,
            "--initial-advertise-peer-urls",
            self.peer_url,
            "--initial-cluster",
            self.initial_cluster,
            "--initial-cluster-token",
            self.cluster_token,
            "--initial-cluster-state",
            "new",  # ignored when the data directory exists
            "--heartbeat-interval",
            str(self.heartbeat_ms),
            "--election-timeout",
            str(self.election_ms),
            "--logger",
            "zap",
        ]
        with open(self.logfile, "ab") as log:
            # Its own session: a Ctrl-C in the terminal that started it does not reach the member.
            process = subprocess.Popen(args, stdout=log, stderr=log, stdin=subprocess.DEVNULL, start_new_session=True)
        self.pidfile.write_text(f"{process.pid}\n")
        return process


class EtcdCluster(MemberGroup):
    """Members on ``client_ports`` (peers on each port + ``peer_offset``), state under ``run_dir``.

    A :class:`~processes.protocol.Process`: ``description``, ``startable``, :meth:`running`,
    :meth:`start`, :meth:`stop` (what an ``etcd`` need maps to, :mod:`processes.needs`).
    """

    label = "etcd cluster"
    error = EtcdClusterError

    def __init__(
        self,
        *,
        client_ports: Sequence[int],
        run_dir: Path | str,
        peer_offset: int = 10,
        heartbeat_ms: int = 100,
        election_ms: int = 1000,
    ) -> None:
        self.distinct_ports(client_ports)
        run_dir = Path(run_dir)
        names = [f"etcd-{port}" for port in client_ports]
        initial = ",".join(
            f"{name}=http://127.0.0.1:{port + peer_offset}" for name, port in zip(names, client_ports, strict=True)
        )
        self.members = [
            EtcdMember(
                name=name,
                client_port=port,
                peer_port=port + peer_offset,
                run_dir=run_dir,
                initial_cluster=initial,
                cluster_token=f"flashsale-{client_ports[0]}",
                heartbeat_ms=heartbeat_ms,
                election_ms=election_ms,
            )
            for name, port in zip(names, client_ports, strict=True)
        ]
        self.run_dir = run_dir

    @classmethod
    def from_endpoints(cls, endpoints: Sequence[str], *, run_dir: Path | str, **kwargs) -> "EtcdCluster":
        """The cluster serving ``http://127.0.0.1:<port>`` endpoints (the ``ETCD_ENDPOINTS`` setting)."""
        ports = []
        for endpoint in endpoints:
            parts = urlsplit(endpoint)
            if parts.scheme != "http" or parts.hostname != "127.0.0.1" or parts.port is None:
                raise ValueError(f"{endpoint!r}: the project's own etcd members are http://127.0.0.1:<port>")
            ports.append(parts.port)
        return cls(client_ports=ports, run_dir=run_dir, **kwargs)

    @property
    def endpoints(self) -> list[str]:
        return [member.endpoint for member in self.members]

    def start(self, *, wait_s: float | None = None) -> None:
        """Start the members that are not running and wait until every one is healthy; refuses a
        cluster where only some members have data."""
        with_data = [member.name for member in self.members if member.data_dir.exists()]
        if with_data and len(with_data) != len(self.members):
            raise EtcdClusterError(
                f"only {', '.join(with_data)} of the etcd members have data under {self.run_dir}: "
                "restore the others or remove that directory to start a new cluster"
            )
        self.reset(wait_s=wait_s)

    def leader(self) -> EtcdMember | None:
        """The member that is raft leader now, by asking each member's status."""
        ids = {}
        leader_id = None
        for member in self.members:
            try:
                status = requests.post(f"{member.endpoint}/v3/maintenance/status", json={}, timeout=0.5).json()
            except (requests.RequestException, ValueError):
                continue
            ids[status.get("header", {}).get("member_id")] = member
            leader_id = status.get("leader", leader_id)
        return ids.get(leader_id)

    def status(self) -> list[dict]:
        return [
            {"name": member.name, "endpoint": member.endpoint, "pid": member.pid(), "healthy": member.healthy()}
            for member in self.members
        ]
