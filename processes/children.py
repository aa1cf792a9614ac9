"""Child processes of the burst: gunicorn "pods", HAProxy and Locust, each in its own process group.

Every child logs to a file, gets SIGTERM if the runner dies (Linux, even on SIGKILL), and is
stopped group-wide (so gunicorn's workers go with their arbiter). A :class:`Child` follows the
room's one protocol (:class:`processes.protocol.Process`). No Django import.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

from processes.ports import RUN_TIME_PORTS

READY_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 10.0


class ChildError(RuntimeError):
    """A child process did not start or did not answer."""


def ephemeral_ports() -> range:
    """The ports this machine gives client connections as their source ports (Linux's
    ``ip_local_port_range``; its default where that cannot be read)."""
    try:
        low, high = map(int, Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    except (OSError, ValueError):
        low, high = 32768, 60999
    return range(low, high + 1)


def run_time_ports() -> list[int]:
    """The ports a server started at run time may be given: :data:`processes.ports.RUN_TIME_PORTS`
    less the machine's ephemeral range, in an order of this process's own (so processes choosing at
    once seldom try the same port first). A killed server's port outside that range stays free for
    it while it is down: no client connection takes it as its source port."""
    taken = ephemeral_ports()
    ports = [port for port in RUN_TIME_PORTS if port not in taken]
    if not ports:
        raise ChildError(
            f"no port of {RUN_TIME_PORTS.start}-{RUN_TIME_PORTS.stop - 1} lies outside this machine's ephemeral range "
            f"({taken.start}-{taken.stop - 1}): narrow net.ipv4.ip_local_port_range"
        )
    start = random.randrange(len(ports))
    return ports[start:] + ports[:start]


def listening_socket(port: int = 0, *, backlog: int) -> socket.socket:
    """A TCP socket listening on 127.0.0.1:``port`` (0: a free one of :func:`run_time_ports`),
    inheritable, for a child server to take over (gunicorn's ``--bind fd://N``): the port is held
    from the moment it is chosen, with no window in which another process can take it. ``listen``
    here, with the server's backlog: gunicorn does not listen again on a socket that already
    listens. OSError if ``port`` is taken; ChildError if every run-time port is.

    SO_REUSEADDR from the start, before ``listen``: a connection made while the server boots (a
    readiness poll) is made from the socket as it is then, and its side, in TIME_WAIT once the
    server hangs up first, would keep the port from a bind after the server's death for a minute
    (kill-pod's) unless it has the option too; the server setting it later (gunicorn does) is too
    late for that connection."""
    if port:
        return _listen(port, backlog=backlog)  # a port a killed server left: its connections in TIME_WAIT
    for candidate in run_time_ports():
        with contextlib.suppress(OSError):
            return _listen(candidate, backlog=backlog)
    raise ChildError(f"every port of {RUN_TIME_PORTS.start}-{RUN_TIME_PORTS.stop - 1} is taken")


def _listen(port: int, *, backlog: int) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", port))
        sock.listen(backlog)
    except OSError:
        sock.close()
        raise
    sock.set_inheritable(True)
    return sock


def _die_with_parent() -> None:
    """In the child before exec: get SIGTERM if the runner dies, even by SIGKILL (Linux only)."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _before_exec(nice: int, fds: dict[int, int]):
    def prepare() -> None:
        for number, fd in fds.items():
            os.dup2(fd, number)  # before close_fds, which keeps ``number`` (it is among pass_fds)
        if nice:
            os.nice(nice)
        if sys.platform == "linux":
            _die_with_parent()

    return prepare


class Child:
    """A subprocess in its own process group, logging to a file; stopped group-wide. Started by
    :meth:`start`, once."""

    startable = True

    def __init__(
        self,
        name: str,
        args: list[str],
        *,
        cwd: Path,
        env: dict[str, str],
        log_path: Path,
        nice: int = 0,
        append: bool = False,
        pass_fds: tuple[int, ...] = (),
        fds: dict[int, int] | None = None,
    ) -> None:
        """``nice`` > 0 lowers the child's CPU priority (any user may); ``append`` keeps the log's
        earlier lines (a process started again); ``pass_fds`` stay open in the child, under the
        same numbers (a listening socket it takes over); ``fds`` maps a number in the child to a
        descriptor of this process, open there under that number (a low one: a process that sizes
        its tables by its connections, as HAProxy does, refuses a descriptor past them)."""
        self.name, self.args, self.cwd, self.env, self.nice = name, args, cwd, env, nice
        self.append = append
        self.fds = dict(fds or {})
        self.pass_fds = (*pass_fds, *self.fds, *self.fds.values())
        self.log_path = log_path
        self.process: subprocess.Popen | None = None

    @property
    def description(self) -> str:
        return self.name

    def start(self) -> None:
        if self.process is not None:
            raise ChildError(f"{self.name} was started already")
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = open(self.log_path, "ab" if self.append else "wb")  # noqa: SIM115 (the child writes to it until stop() closes it)
        self.process = subprocess.Popen(
            self.args,
            cwd=self.cwd,
            env=self.env,
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=_before_exec(self.nice, self.fds),
            pass_fds=self.pass_fds,
        )

    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def log_tail(self, lines: int = 5) -> str:
        try:
            text = self.log_path.read_text(errors="replace").strip().splitlines()
        except OSError:
            return ""
        return " | ".join(line.strip() for line in text[-lines:])

    def stop(self, sig: int = signal.SIGTERM) -> None:
        """Signal the whole group, wait, then SIGKILL what is left. Safe to call twice."""
        if self.process is None:
            return
        try:
            if self.running():
                self._signal_group(sig)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    self.process.wait(STOP_TIMEOUT_S)
            # Leftovers in the group (gunicorn workers of a killed arbiter) die too.
            self._signal_group(signal.SIGKILL)
            self.process.wait(STOP_TIMEOUT_S)
        finally:
            self._log.close()

    def _signal_group(self, sig: int) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.process.pid, sig)


def wait_until_answers(server: Child, url: str) -> None:
    """Return once ``url`` answers 200; raise ChildError if the server exits or takes too long."""
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        if not server.running():
            raise ChildError(f"{server.name} exited with code {server.process.returncode}: {server.log_tail()}")
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                if response.status == 200:
                    return
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass
        time.sleep(0.1)
    raise ChildError(f"{server.name} did not answer {url} within {READY_TIMEOUT_S:.0f}s; see {server.log_path}")


def stop_all(children: list[Child | None], sig: int = signal.SIGTERM) -> None:
    """Stop every child with ``sig``, all of them even if one fails to stop: all are signalled
    first, so they wind down together rather than one after the other."""
    live = [child for child in children if child is not None and child.process is not None]
    for child in live:
        if child.running():
            child._signal_group(sig)
    errors = []
    for child in live:
        try:
            child.stop(sig)
        except (OSError, subprocess.TimeoutExpired) as exc:
            errors.append(f"{child.name}: {exc}")
    if errors:
        raise ChildError("could not stop " + "; ".join(errors))


@contextlib.contextmanager
def sigterm_as_interrupt():
    """Treat SIGTERM like Ctrl-C while the block runs, so the ``finally`` blocks that stop a run's
    private processes run: ``timeout``, a cancelled CI job or ``kill`` send SIGTERM, on which Python
    ends at once. Only in the main thread (elsewhere a signal handler cannot be set); the previous
    handler comes back after the block.

    An interrupt raised while a finaliser runs (a ``__del__``, a weakref callback) is only printed
    by Python, and the run would go on: such a swallowed interrupt is delivered again, as SIGTERM,
    once the finaliser has returned."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum, frame):
        raise KeyboardInterrupt

    def deliver_again(unraisable):
        previous_hook(unraisable)
        if unraisable.exc_type is not None and issubclass(unraisable.exc_type, KeyboardInterrupt):
            # Sent from another thread a moment later: the handler then runs in the main thread
            # outside this hook and the finaliser (raised here, it would be swallowed again).
            timer = threading.Timer(0.02, os.kill, (os.getpid(), signal.SIGTERM))
            timer.daemon = True  # never keeps the process alive, or signals it after the block
            again.append(timer)
            timer.start()

    again: list[threading.Timer] = []
    previous = signal.signal(signal.SIGTERM, interrupt)
    previous_hook, sys.unraisablehook = sys.unraisablehook, deliver_again
    try:
        yield
    finally:
        sys.unraisablehook = previous_hook
        signal.signal(signal.SIGTERM, previous)
        if any(timer.is_alive() for timer in again):  # the block ended before the signal came again
            for timer in again:
                timer.cancel()
            raise KeyboardInterrupt
