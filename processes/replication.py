"""A private Redis master and replica that a demo or a fault run can fail over, losing what had not replicated.

Redis replication is asynchronous: a master acknowledges a write before any replica has it. To
lose a write on purpose, and every time, the replica does not connect to the master directly but
through a :class:`Relay` (``link``) on 127.0.0.1. :meth:`ReplicatedPair.hold_replication` makes
the relay keep the master's replication stream instead of forwarding it (a slow or partitioned
link), and :meth:`ReplicatedPair.fail_over` kills the master, drops what the relay held, and
promotes the replica with ``REPLICAOF NO ONE`` (by hand: what Sentinel would do once the master
has been down for ``down-after-milliseconds``). Writes acknowledged while the stream was held are
gone; writes before it are on the replica (the pair waits for the initial sync at start).

Clients that should follow the failover connect to ``front``, a second relay that forwards new
connections to the current primary and, on failover, closes the old ones and points at the
replica, as a virtual IP or a Sentinel-aware client would.

Both nodes are :class:`processes.nodes.RedisNode` processes (no persistence, pid and log files in
``run_dir``); the replica is made one at runtime with ``REPLICAOF`` rather than a command-line
flag. No Django import.
"""

from __future__ import annotations

import time
from pathlib import Path

import redis

from .nodes import NodeError, RedisNode
from .relay import HOST, Relay


def replication_info(client: redis.Redis) -> dict:
    return client.info("replication")


class ReplicatedPair:
    """A master on ``base_port`` and its replica on ``base_port + 1``, linked through a holdable relay.

    Clients reach the current primary through ``front`` (on ``front_port``; 0 picks a free one).
    A :class:`~processes.protocol.Process` (``description``, ``running()``, ``start()``,
    ``stop()``, ``startable``); the relays run in the process that started the pair.

    >>> pair = ReplicatedPair(base_port=7800, run_dir=".run/pair")
    >>> pair.start()                  # both up, replica in sync, pair.front.url reaches the master
    >>> pair.hold_replication()       # writes from now on stay on the master
    >>> pair.fail_over()              # master killed, held stream dropped, replica promoted
    >>> pair.stop()
    """

    startable = True

    def __init__(
        self, *, base_port: int, run_dir: Path | str, front_port: int = 0, sync_timeout_s: float = 10.0
    ) -> None:
        run_dir = Path(run_dir)
        self.front_port = front_port
        self.master = RedisNode(port=base_port, run_dir=run_dir)
        self.replica = RedisNode(port=base_port + 1, run_dir=run_dir)
        self.sync_timeout_s = sync_timeout_s
        self.link: Relay | None = None
        self.front: Relay | None = None
        self.primary: RedisNode = self.master

    def start(self) -> None:
        """Start both nodes empty, make the replica follow the master and wait until it is in sync."""
        for node in (self.master, self.replica):
            node.stop()  # a node of ours left behind by an interrupted run: start it afresh
            if node.ping():
                raise NodeError(f"port {node.port} is taken by a redis-server this pair did not start")
        self.master.start()
        self.replica.start()
        with self.master.client() as master:
            # Send the initial snapshot at once rather than after the default 5 s batching delay.
            master.config_set("repl-diskless-sync-delay", 0)
        self.link = Relay(target_port=self.master.port)
        self.front = Relay(target_port=self.master.port, port=self.front_port)
        self.primary = self.master
        with self.replica.client() as replica:
            replica.replicaof(HOST, self.link.port)
        self.wait_in_sync()

    @property
    def description(self) -> str:
        return f"Redis master {HOST}:{self.master.port} + replica {HOST}:{self.replica.port}" + (
            f", clients through {HOST}:{self.front.port}" if self.front is not None else ""
        )

    def running(self) -> bool:
        """The relays are up and the current primary answers."""
        return self.front is not None and self.primary.ping()

    def wait_in_sync(self) -> None:
        """Wait until the replica has processed everything the master has written."""
        deadline = time.monotonic() + self.sync_timeout_s
        with self.master.client() as master, self.replica.client() as replica:
            while time.monotonic() < deadline:
                info = replication_info(replica)
                if (
                    info.get("master_link_status") == "up"
                    and not info.get("master_sync_in_progress")
                    and info.get("master_repl_offset", -1) >= replication_info(master)["master_repl_offset"]
                ):
                    return
                time.sleep(0.02)
        raise NodeError(
            f"replica {self.replica.port} did not sync with master {self.master.port} "
            f"within {self.sync_timeout_s}s; see {self.replica.logfile}"
        )

    def offsets(self) -> tuple[int, int]:
        """(bytes of replication stream the master has written, bytes the replica has processed)."""
        with self.master.client() as master, self.replica.client() as replica:
            return replication_info(master)["master_repl_offset"], replication_info(replica)["master_repl_offset"]

    def hold_replication(self) -> None:
        """From now on the master's writes reach the replica only after :meth:`release_replication`."""
        self._relays()[0].hold()

    def release_replication(self) -> None:
        self._relays()[0].release()

    def fail_over(self) -> None:
        """Kill the master (SIGKILL), drop the held stream, promote the replica, point ``front`` at it."""
        front = self._relays()[1]
        self.kill_master()
        self.promote()
        front.retarget(self.replica.port)

    def kill_master(self) -> None:
        self.master.kill()

    def promote(self) -> None:
        """``REPLICAOF NO ONE`` on the replica: it becomes a writable master with what it had."""
        self._relays()[0].cut()
        with self.replica.client() as replica:
            replica.replicaof("NO", "ONE")
        self.primary = self.replica

    def stop(self) -> None:
        for relay in (self.link, self.front):
            if relay is not None:
                relay.close()
        self.link = self.front = None
        for node in (self.master, self.replica):
            node.stop()

    def _relays(self) -> tuple[Relay, Relay]:
        if self.link is None or self.front is None:
            raise NodeError("the pair is not started")
        return self.link, self.front

    def __enter__(self) -> "ReplicatedPair":
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
