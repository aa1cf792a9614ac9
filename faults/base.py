"""What every fault shares: the base class, its error, the phases, which strategies each fault is for.

:mod:`faults.registry` builds the faults by name; :mod:`faults.crash` holds the two that crash
processes in sequence. No Django import.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time

from processes.pidfile import process_state

PHASES = ("before", "during", "after")

#: The strategies each fault means something for: the lock service it breaks, or (pause-worker) a
#: lease that runs out while its holder is frozen. ``flashsale --fault`` refuses other pairings.
FAULT_STRATEGIES = {
    "kill-minority": frozenset({"redlock"}),
    "kill-majority": frozenset({"redlock"}),
    "restart-redis": frozenset({"redis"}),
    "failover": frozenset({"redis"}),
    "pause-worker": frozenset({"redis", "redlock", "etcd", "zookeeper"}),
    "kill-etcd-member": frozenset({"etcd"}),
    "kill-zk-member": frozenset({"zookeeper"}),
    "kill-holder": frozenset({"db", "redis", "redlock", "etcd", "zookeeper"}),
    # Any strategy that is not a control: the pods are what dies.
    "kill-pod": frozenset({"db", "optimistic", "redis", "redlock", "etcd", "zookeeper", "redis-stock", "atomic"}),
}

#: Faults that make a second holder write from a stale read: without the storage check
#: (``INVENTORY_FENCED=0``) they are expected to oversell.
OVERSELL_UNFENCED = frozenset({"pause-worker", "failover"})


class FaultError(ValueError):
    """A fault was asked for something it cannot do: unknown name, missing part, wrong order of calls."""


class Fault:
    """Base class: subclasses provide ``_inject()`` and ``_recover()``."""

    name: str = ""
    description: str = ""
    #: Strategies the fault means something for (``flashsale`` refuses other pairings); None: any.
    strategies: frozenset[str] | None = None

    def __init__(self, *, hold_s: float) -> None:
        if hold_s < 0:
            raise FaultError(f"{self.name}: hold_s must be >= 0, got {hold_s}")
        self.hold_s = hold_s
        self.injected_at: float | None = None
        self.recovered_at: float | None = None

    def inject(self) -> None:
        if self.injected_at is not None:
            raise FaultError(f"{self.name} was already injected; make a new fault per run")
        self.injected_at = time.monotonic()
        self._inject()

    def recover(self) -> None:
        if self.injected_at is None:
            raise FaultError(f"{self.name}: recover() before inject()")
        if self.recovered_at is not None:
            raise FaultError(f"{self.name} was already recovered")
        self._recover()
        self.recovered_at = time.monotonic()

    def close(self) -> None:
        """Recover if injected and not yet recovered; otherwise nothing."""
        if self.injected_at is not None and self.recovered_at is None:
            self.recover()

    def phase(self, at: float) -> str:
        """The phase a ``time.monotonic()`` instant falls in: before inject, until recovered, after."""
        if self.injected_at is None or at < self.injected_at:
            return "before"
        if self.recovered_at is None or at < self.recovered_at:
            return "during"
        return "after"

    def window(self, origin: float) -> tuple[float | None, float | None]:
        """(injected, recovered) in seconds since ``origin`` (a ``time.monotonic()`` value); None if not yet."""
        return tuple(None if at is None else at - origin for at in (self.injected_at, self.recovered_at))

    def _inject(self) -> None:
        raise NotImplementedError("subclasses of Fault must provide _inject()")

    def _recover(self) -> None:
        raise NotImplementedError("subclasses of Fault must provide _recover()")

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name}: {self.description}>"


def freeze(*pids: int) -> None:
    """SIGSTOP every one of ``pids``, then return once each really is stopped (the signal is
    delivered asynchronously; all are sent before any is waited for)."""
    for pid in pids:
        os.kill(pid, signal.SIGSTOP)
    deadline = time.monotonic() + 1.0
    for pid in pids:
        while process_state(pid) not in ("T", "") and time.monotonic() < deadline:
            time.sleep(0.001)


def resume(*pids: int) -> None:
    """SIGCONT every one of ``pids`` still alive (one may have died while stopped)."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)
