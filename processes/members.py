"""What a group of private members started and stopped together shares: the etcd cluster and the
ZooKeeper ensemble each hold a list of members with a client port and a health check.

:class:`Member` starts one process and waits until it answers; :class:`MemberGroup` starts every
member, waits until the group is healthy, stops it, and wipes its data. A subclass supplies only
what differs: how a member is spawned, how it answers, where it listens, and its error class.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path
from typing import Sequence

from .nodes import NodeError
from .pidfile import PidfileProcess


class Member(PidfileProcess):
    """One process of a group; a subclass provides :meth:`spawn`, :meth:`answers`, :meth:`healthy`."""

    #: The product's name in messages, e.g. "etcd"; and the error its failures raise.
    product = "member"
    error: type[NodeError] = NodeError
    #: How long :meth:`start` waits for the process to answer by default.
    start_wait_s = 10.0
    stop_wait_s = 10.0
    name: str
    data_dir: Path

    @property
    def where(self) -> str:
        """Where clients reach it, for messages."""
        raise NotImplementedError("subclasses of Member must provide where")

    def spawn(self) -> subprocess.Popen | None:
        raise NotImplementedError("subclasses of Member must provide spawn()")

    def answers(self, timeout_s: float = 0.3) -> bool:
        raise NotImplementedError("subclasses of Member must provide answers()")

    def healthy(self, timeout_s: float = 0.5) -> bool:
        raise NotImplementedError("subclasses of Member must provide healthy()")

    def start(self, *, wait_s: float | None = None) -> None:
        """Start the member with its data and wait until it answers; a no-op when it runs.

        It serves clients only once a majority runs: start a whole group with
        :meth:`MemberGroup.start`.
        """
        wait_s = self.start_wait_s if wait_s is None else wait_s
        process = self.spawn()
        if process is None:
            return
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            if self.answers():
                return
            if process.poll() is not None:
                raise self.error(f"{self.product} {self.name} exited with {process.returncode}; see {self.logfile}")
            time.sleep(0.05)
        raise self.error(
            f"{self.product} {self.name} did not answer on {self.where} within {wait_s}s; see {self.logfile}"
        )

    def not_running(self) -> NodeError:
        return self.error(f"{self.product} {self.name} is not running")


class MemberGroup:
    """Members reached by iterating, ``len()`` and ``[index]``, described, checked and stopped together."""

    #: What the group is called in its description, e.g. "etcd cluster".
    label = "group"
    error: type[NodeError] = NodeError
    #: How long :meth:`start` and :meth:`reset` wait for the whole group by default.
    ready_wait_s = 20.0
    startable = True
    members: list
    run_dir: Path

    @staticmethod
    def distinct_ports(client_ports: Sequence[int]) -> None:
        if len(client_ports) < 1 or len(set(client_ports)) != len(client_ports):
            raise ValueError(f"client_ports must be distinct and non-empty, got {list(client_ports)}")

    def __iter__(self):
        return iter(self.members)

    def __len__(self) -> int:
        return len(self.members)

    def __getitem__(self, index: int):
        return self.members[index]

    @property
    def description(self) -> str:
        ports = ", ".join(str(member.client_port) for member in self.members)
        return f"{self.label} of {len(self.members)} members on 127.0.0.1 ports {ports}"

    def running(self) -> bool:
        """Every member runs and is healthy (its own check: an etcd leader, a ZooKeeper that serves)."""
        return all(member.healthy() for member in self.members)

    def start(self, *, wait_s: float | None = None) -> None:
        """Start the members that are not running and wait until every one is healthy."""
        self.reset(wait_s=wait_s)

    def reset(self, *, wait_s: float | None = None) -> None:
        """Every member running and the group healthy, whatever a test did to it (paused, killed)."""
        wait_s = self.ready_wait_s if wait_s is None else wait_s
        started = []
        for member in self.members:
            member.resume()
            process = member.spawn()
            if process is not None:
                started.append((member, process))
        deadline = time.monotonic() + wait_s
        while not self.running():
            for member, process in started:
                if process.poll() is not None:  # e.g. its port taken: no wait can make it healthy
                    raise self.error(
                        f"{self.label} not healthy: {member.product} {member.name} exited with "
                        f"{process.returncode} as it started; see {member.logfile}"
                    )
            if time.monotonic() > deadline:
                raise self.error(f"{self.label} not healthy within {wait_s}s; see {self.run_dir}/*.log")
            time.sleep(0.1)

    def stop(self) -> None:
        for member in self.members:
            member.stop()

    def wipe(self) -> None:
        """Stop every member and delete their data: the next start is a new group (revisions and
        sequences from the beginning), for test groups only."""
        self.stop()
        for member in self.members:
            shutil.rmtree(member.data_dir, ignore_errors=True)
