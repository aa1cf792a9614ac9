"""The one protocol every process of this room follows, and starting what is down while needed.

A process (or a group of them, as :class:`~processes.nodes.RedisNodes` or
:class:`~processes.etcd_cluster.EtcdCluster`) says what it is (``description``), whether the
project starts it itself (``startable``), whether it runs, and starts and stops. A fault may
also kill one abruptly (:class:`Restartable`). No Django import.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterable, Iterator, Protocol, TypeVar


class Process(Protocol):
    description: str
    startable: bool  # False: someone else runs it (the machine's Redis); start() says what to do

    def running(self) -> bool: ...

    def start(self) -> None: ...

    def stop(self) -> None: ...


class Restartable(Process, Protocol):
    """A process the project started and can kill abruptly and start again (RedisNode, an etcd member)."""

    def kill(self) -> None: ...


P = TypeVar("P", bound=Process)


class ProcessUnavailable(RuntimeError):
    """A process a strategy needs is down and cannot be started; the message says what to do."""


@contextmanager
def started_while_needed(processes: Iterable[P]) -> Iterator[list[P]]:
    """Start the processes that do not run; at the end stop those, and only those.

    Processes someone else runs (``make nodes-start``, a test session) are used and left running.
    One whose start fails is stopped before the error goes on: a group may have started some of
    its members (two etcd members of three, the third one's port taken) and those would run on.
    """
    started: list[P] = []
    try:
        for process in processes:
            if not process.running():
                try:
                    process.start()
                except BaseException:
                    process.stop()  # only what it started itself (its pid files); the machine's Redis: nothing
                    raise
                started.append(process)
        yield started
    finally:
        for process in started:
            process.stop()
