"""A process the project started and tracks by its pid file: signal it, stop it, kill it, pause it.

The private ``redis-server`` nodes (:mod:`processes.nodes`) and the etcd members
(:mod:`processes.etcd_cluster`) are such processes. No Django import.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path


def alive(pid: int) -> bool:
    """Whether ``pid`` runs; a zombie (exited, not yet reaped) does not."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie child still answers kill(0); treat it as gone.
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def wait_gone(pid: int, wait_s: float) -> bool:
    """Wait up to ``wait_s`` for ``pid`` to exit (reaping it if this process started it)."""
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)
        if not alive(pid):
            return True
        time.sleep(0.01)
    return False


class PidfileProcess:
    """Signals for a process whose pid is in ``pidfile``; subclasses start it and name the file."""

    #: How long a graceful stop, and then a kill, may take.
    stop_wait_s = 5.0

    #: Where its files live; a subclass sets it, and :attr:`stem` names them.
    run_dir: Path

    @property
    def stem(self) -> str:
        raise NotImplementedError("subclasses of PidfileProcess must provide stem")

    @property
    def pidfile(self) -> Path:
        return self.run_dir / f"{self.stem}.pid"

    @property
    def logfile(self) -> Path:
        return self.run_dir / f"{self.stem}.log"

    def not_running(self) -> Exception:
        """The error :meth:`pause` raises when there is no process to pause."""
        raise NotImplementedError("subclasses of PidfileProcess must provide not_running()")

    def pid(self) -> int | None:
        """The process's pid while it runs, else None."""
        try:
            pid = int(self.pidfile.read_text().strip())
        except (OSError, ValueError):
            return None
        return pid if alive(pid) else None

    def _signal(self, signum: int) -> int | None:
        pid = self.pid()
        if pid is not None:
            os.kill(pid, signum)
        return pid

    def stop(self, *, wait_s: float | None = None) -> None:
        """Stop gracefully (SIGTERM), escalating to SIGKILL; a no-op if not running."""
        wait_s = self.stop_wait_s if wait_s is None else wait_s
        pid = self._signal(signal.SIGCONT)  # a paused process cannot act on SIGTERM
        if pid is None:
            return
        os.kill(pid, signal.SIGTERM)
        if not wait_gone(pid, wait_s):
            os.kill(pid, signal.SIGKILL)
            wait_gone(pid, wait_s)
        self.pidfile.unlink(missing_ok=True)

    def kill(self) -> None:
        """Kill abruptly (SIGKILL), as in a crash."""
        pid = self._signal(signal.SIGCONT)
        if pid is not None:
            os.kill(pid, signal.SIGKILL)
            wait_gone(pid, self.stop_wait_s)
        self.pidfile.unlink(missing_ok=True)

    def pause(self) -> None:
        """Freeze the process (SIGSTOP): it keeps its sockets but answers nothing."""
        if self._signal(signal.SIGSTOP) is None:
            raise self.not_running()

    def resume(self) -> None:
        self._signal(signal.SIGCONT)


def process_state(pid: int) -> str:
    """The state letter /proc gives a process (R running, S sleeping, T stopped, ...); "" once it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return ""


def child_pids(parent: int) -> list[int]:
    """Pids whose parent is ``parent`` (from /proc), in ascending order: a gunicorn master's workers."""
    children = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
        except OSError:
            continue  # gone meanwhile
        if int(fields[1]) == parent:
            children.append(int(entry))
    return sorted(children)
