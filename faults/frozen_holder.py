"""A ZooKeeper lock holder in a child process of its own, so that a demo can really freeze it.

A ZooKeeper session is kept alive by the client's own thread: a pause of one thread (a sleep)
freezes nothing the ensemble can see. ``simulate_pause --backend zookeeper`` needs what a
stop-the-world pause does to a process, so A holds its lock in a forked child that the demo
stops (``SIGSTOP``) and resumes (``SIGCONT``): its pings stop, its session times out and the
ensemble deletes its znode. The child touches no database; it only holds the lock and, when
asked, tries to release it. No Django import.
"""

from __future__ import annotations

import multiprocessing
import os
import signal

from locks import Lease, LockError, NotOwned
from locks.zookeeper import ZooKeeperClient, ZooKeeperLock

FORK = multiprocessing.get_context("fork")
ANSWER_S = 10.0


def _hold(hosts: list[str], name: str, session_ms: int, pipe) -> None:
    client = ZooKeeperClient(hosts, session_ms=session_ms)
    lock = ZooKeeperLock(client, name, timeout_ms=0)
    try:
        pipe.send(lock.acquire())
    except LockError as exc:
        pipe.send(exc)
        return
    pipe.recv()  # "release", once the parent has frozen and woken this process
    try:
        lock.release()
        pipe.send("released")
    except NotOwned:
        pipe.send("not owned")
    except LockError as exc:
        pipe.send(f"release failed: {exc}")
    client.close()


class ForkedHolder:
    """The lock ``name`` held by a forked child with its own session of ``session_ms``."""

    def __init__(self, hosts: list[str], name: str, *, session_ms: int) -> None:
        self.hosts, self.name, self.session_ms = list(hosts), name, session_ms
        self._pipe, child_end = FORK.Pipe()
        self._child = FORK.Process(target=_hold, args=(self.hosts, name, session_ms, child_end), daemon=True)

    def node_names(self) -> list[str]:
        return list(self.hosts)

    def acquire(self) -> Lease:
        self._child.start()
        if not self._pipe.poll(ANSWER_S):
            raise LockError("the holder process did not answer", name=self.name, nodes=self.hosts)
        answer = self._pipe.recv()
        if isinstance(answer, Exception):
            raise answer
        return answer

    def pause(self) -> None:
        os.kill(self._child.pid, signal.SIGSTOP)

    def release(self) -> None:
        """Wake the child and have it release; :class:`NotOwned` when its znode was gone."""
        os.kill(self._child.pid, signal.SIGCONT)
        self._pipe.send("release")
        answer = self._pipe.recv() if self._pipe.poll(ANSWER_S) else "no answer"
        self._child.join(ANSWER_S)
        if answer == "not owned":
            raise NotOwned("release refused: the session ended and its znode is gone", name=self.name, nodes=self.hosts)
        if answer != "released":
            raise LockError(f"the holder process: {answer}", name=self.name, nodes=self.hosts)

    def close(self) -> None:
        if self._child.is_alive():
            self._child.kill()
            self._child.join(ANSWER_S)
