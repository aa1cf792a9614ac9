"""A private 3-member ZooKeeper ensemble on 127.0.0.1: the ``zookeeper`` strategy's lock service.

The project starts and stops it itself, from Debian's ``zookeeper`` package (the jar, not the
``zookeeperd`` service on 2181): member ``i`` serves clients on ``client_ports[i]``, its quorum
peers on ``+ peer_offset`` and leader election on ``+ 2 × peer_offset``; each has its own
``zoo.cfg``, ``myid``, data, pid and log under ``run_dir``. Every member's AdminServer (an HTTP
server that defaults to 8080 for all of them) is off; the four-letter words ``srvr`` and ``ruok``
are allowed, and :meth:`ZooKeeperEnsemble.leader` finds the leader with ``srvr``.

Sized for a small shared machine: each JVM's heap is bounded (``HEAP_MB``) with the serial
collector; ``tickTime`` is 200 ms so that elections and pings are quick, and ``minSessionTimeout``
/ ``maxSessionTimeout`` are set explicitly (the server otherwise clamps a session to 2-20 ×
tickTime, here 0.4-4 s) so a session may last from 0.4 s to 60 s. Transactions are fsynced
(ZooKeeper's default), as etcd's are: a grant is on disk on a majority.

The data outlives :meth:`ZooKeeperEnsemble.stop`: a lock's fence is its znode's sequence number,
which grows per lock path only while the data lives. :meth:`ZooKeeperEnsemble.wipe` starts over,
for test ensembles only.

No Django import: the lock library's tests and benchmarks use this module on its own.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
from pathlib import Path
from typing import Sequence

from .members import Member, MemberGroup
from .nodes import NodeError

INSTALL_HINT = "ZooKeeper not found (/usr/share/java/zookeeper.jar): install it (Debian: apt-get install zookeeper)"
ZOOKEEPER_JAR = Path("/usr/share/java/zookeeper.jar")
# slf4j's simple binding (Debian's libslf4j-java, which the package pulls in) logs to stderr.
SLF4J_SIMPLE_JAR = Path("/usr/share/java/slf4j-simple.jar")
HEAP_MB = 96
TICK_MS = 200
MIN_SESSION_MS = 2 * TICK_MS
MAX_SESSION_MS = 60_000


class ZooKeeperError(NodeError):
    """A member of the private ensemble could not be started or stopped (caught like a Redis node's)."""


def java_command() -> list[str]:
    java = shutil.which("java")
    if java is None or not ZOOKEEPER_JAR.exists():
        raise ZooKeeperError(INSTALL_HINT)
    return [
        java,
        f"-Xmx{HEAP_MB}m",
        "-Xms16m",
        "-XX:+UseSerialGC",
        "-Dorg.slf4j.simpleLogger.showDateTime=true",
        "-Dorg.slf4j.simpleLogger.defaultLogLevel=warn",
        "-cp",
        f"{ZOOKEEPER_JAR}:{SLF4J_SIMPLE_JAR}",
        "org.apache.zookeeper.server.quorum.QuorumPeerMain",
    ]


def four_letter(host: str, port: int, word: str, timeout_s: float = 0.5) -> str | None:
    """Send a four-letter word (``srvr``, ``ruok``) and return the reply; None when nothing answers."""
    try:
        with socket.create_connection((host, port), timeout=timeout_s) as sock:
            sock.sendall(word.encode())
            chunks = []
            while chunk := sock.recv(4096):
                chunks.append(chunk)
    except OSError:
        return None
    return b"".join(chunks).decode(errors="replace")


class ZooKeeperMember(Member):
    """One ZooKeeper server of an ensemble; ``servers`` holds every member's ``server.N=`` line.

    Killed, it keeps what it had fsynced for :meth:`start`.
    """

    product = "ZooKeeper"
    error = ZooKeeperError
    start_wait_s = 20.0

    def __init__(self, *, myid: int, client_port: int, run_dir: Path, servers: list[str], host: str = "127.0.0.1"):
        self.myid = myid
        self.host = host
        self.client_port = client_port
        self.run_dir = run_dir
        self.servers = servers
        self.name = f"zk-{client_port}"

    @property
    def address(self) -> str:
        return f"{self.host}:{self.client_port}"

    @property
    def where(self) -> str:
        return self.address

    @property
    def data_dir(self) -> Path:
        return self.run_dir / f"{self.name}.data"

    @property
    def config_file(self) -> Path:
        return self.run_dir / f"{self.name}.cfg"

    @property
    def stem(self) -> str:
        return self.name

    def mode(self, timeout_s: float = 0.5) -> str | None:
        """``leader`` or ``follower`` while the member serves (it has a quorum), else None."""
        reply = four_letter(self.host, self.client_port, "srvr", timeout_s)
        for line in (reply or "").splitlines():
            if line.startswith("Mode:"):
                return line.split(":", 1)[1].strip()
        return None

    def healthy(self, timeout_s: float = 0.5) -> bool:
        return self.mode(timeout_s) in ("leader", "follower", "standalone")

    def answers(self, timeout_s: float = 0.3) -> bool:
        """The process accepts connections; says nothing about quorum."""
        return four_letter(self.host, self.client_port, "ruok", timeout_s) == "imok"

    def write_config(self) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        (self.data_dir / "myid").write_text(f"{self.myid}\n")
        lines = [
            f"tickTime={TICK_MS}",
            "initLimit=50",  # 10 s for a follower to sync with the leader
            "syncLimit=10",  # 2 s behind the leader before it is dropped
            f"minSessionTimeout={MIN_SESSION_MS}",
            f"maxSessionTimeout={MAX_SESSION_MS}",
            f"dataDir={self.data_dir}",
            f"clientPort={self.client_port}",
            f"clientPortAddress={self.host}",
            "maxClientCnxns=0",  # every pod and shopper comes from 127.0.0.1: no per-address cap
            "admin.enableServer=false",
            "4lw.commands.whitelist=srvr,ruok",
            "preAllocSize=4096",  # KB per transaction log file, not the default 64 MB
            "autopurge.snapRetainCount=3",
            "autopurge.purgeInterval=1",
            *self.servers,
        ]
        self.config_file.write_text("\n".join(lines) + "\n")

    def spawn(self) -> subprocess.Popen | None:
        """Start the process without waiting for it; None when it already runs."""
        if self.pid() is not None:
            return None
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.write_config()
        with open(self.logfile, "ab") as log:
            # Its own session: a Ctrl-C in the terminal that started it does not reach the member.
            process = subprocess.Popen(
                [*java_command(), str(self.config_file)],
                stdout=log,
                stderr=log,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        self.pidfile.write_text(f"{process.pid}\n")
        return process


class ZooKeeperEnsemble(MemberGroup):
    """Members on ``client_ports`` (quorum ports + ``peer_offset``, election + 2 × ``peer_offset``).

    Also the process the ``zookeeper`` strategy declares it needs: ``description``, ``startable``,
    :meth:`running`, :meth:`start`, :meth:`stop`.
    """

    label = "ZooKeeper ensemble"
    error = ZooKeeperError
    ready_wait_s = 30.0

    def __init__(self, *, client_ports: Sequence[int], run_dir: Path | str, peer_offset: int = 10) -> None:
        self.distinct_ports(client_ports)
        run_dir = Path(run_dir)
        servers = [
            f"server.{i}=127.0.0.1:{port + peer_offset}:{port + 2 * peer_offset}"
            for i, port in enumerate(client_ports, start=1)
        ]
        self.members = [
            ZooKeeperMember(myid=i, client_port=port, run_dir=run_dir, servers=servers)
            for i, port in enumerate(client_ports, start=1)
        ]
        self.run_dir = run_dir

    @classmethod
    def from_hosts(cls, hosts: Sequence[str], *, run_dir: Path | str, **kwargs) -> "ZooKeeperEnsemble":
        """The ensemble serving ``127.0.0.1:<port>`` addresses (the ``ZOOKEEPER_HOSTS`` setting)."""
        ports = []
        for host in hosts:
            name, _, port = host.rpartition(":")
            if name != "127.0.0.1" or not port.isdigit():
                raise ValueError(f"{host!r}: the project's own ZooKeeper members are 127.0.0.1:<port>")
            ports.append(int(port))
        return cls(client_ports=ports, run_dir=run_dir, **kwargs)

    @property
    def hosts(self) -> list[str]:
        return [member.address for member in self.members]

    def leader(self) -> ZooKeeperMember | None:
        """The member that leads now, by ``srvr``."""
        return next((member for member in self.members if member.mode() == "leader"), None)

    def status(self) -> list[dict]:
        return [
            {"name": member.name, "address": member.address, "pid": member.pid(), "mode": member.mode()}
            for member in self.members
        ]
