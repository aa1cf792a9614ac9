"""Private ``redis-server`` processes: the five independent Redlock masters, and test nodes.

The project starts and stops these itself, on 127.0.0.1 and its own ports, with no persistence
(``--save "" --appendonly no``) and their pid and log files under ``.run/``. Fault tests use
:meth:`RedisNode.kill`, :meth:`RedisNode.pause` (``SIGSTOP``) and :meth:`RedisNode.resume`.

No Django import: the lock library's tests and benchmarks use this module on its own.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from .pidfile import PidfileProcess

INSTALL_HINT = "redis-server not found on PATH: install it (Debian: apt-get install redis-server)"


class NodeError(RuntimeError):
    """A private Redis node could not be started or stopped."""


def ping_error(url: str, *, timeout_s: float = 1.0) -> redis.RedisError | None:
    """PING the Redis at ``url`` once, without retrying: None when it answered, else why it did not.

    The one "does this Redis answer?" check: the private nodes, the processes the strategies need and
    ``preflight`` all ask it.
    """
    try:
        with redis.Redis.from_url(
            url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s, retry=Retry(NoBackoff(), 0)
        ) as client:
            client.ping()
    except redis.RedisError as exc:
        return exc
    return None


def redis_server_binary() -> str:
    path = shutil.which("redis-server")
    if path is None:
        raise NodeError(INSTALL_HINT)
    return path


@dataclass(frozen=True)
class RedisNode(PidfileProcess):
    """One ``redis-server`` on 127.0.0.1:``port``; state lives in ``run_dir``. Killed, it forgets every key."""

    port: int
    run_dir: Path
    host: str = "127.0.0.1"
    startable = True

    @property
    def description(self) -> str:
        return f"redis-server {self.url} (private)"

    @property
    def url(self) -> str:
        return f"redis://{self.host}:{self.port}/0"

    @property
    def stem(self) -> str:
        return f"redis-{self.port}"

    def client(self, **kwargs) -> redis.Redis:
        kwargs.setdefault("socket_timeout", 0.5)
        kwargs.setdefault("socket_connect_timeout", 0.5)
        # redis-py retries with backoff by default; a probe of a dead node should fail at once.
        kwargs.setdefault("retry", Retry(NoBackoff(), 0))
        return redis.Redis(host=self.host, port=self.port, **kwargs)

    def ping(self) -> bool:
        return ping_error(self.url, timeout_s=0.2) is None

    def start(self, *, wait_s: float = 5.0) -> None:
        """Start the node, or leave it be if it already runs and answers. A server on its port that
        this run did not start (no live pid in this node's pidfile) is refused: a second
        daemonized redis-server on a busy port exits 0 and writes no pidfile, so two runs would
        share one node, each flushing, killing and restarting the other's."""
        if self.ping():
            if self.pid() is not None:
                return
            raise NodeError(
                f"port {self.port} is taken by a redis-server this run did not start (no live pid in "
                f"{self.pidfile}): stop it, or run on other ports (the suite: another FLASHSALE_TEST_SLOT)"
            )
        if self.taken_by_another():
            # redis-server would start only to fail to bind, daemonized, and be waited for in vain.
            raise NodeError(
                f"port {self.port} is in use by another program: stop it, or run on other ports "
                "(a command's --base-port; the suite: another FLASHSALE_TEST_SLOT)"
            )
        self.run_dir.mkdir(parents=True, exist_ok=True)
        binary = redis_server_binary()
        args = [
            binary,
            "--port",
            str(self.port),
            "--bind",
            self.host,
            "--save",
            "",
            "--appendonly",
            "no",
            "--daemonize",
            "yes",
            "--pidfile",
            str(self.pidfile),
            "--logfile",
            str(self.logfile),
            "--dir",
            str(self.run_dir),
        ]
        result = subprocess.run(args, capture_output=True, text=True)
        if result.returncode != 0:
            raise NodeError(
                f"redis-server on port {self.port} did not start: {result.stderr.strip() or result.stdout.strip()}"
            )
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            if self.ping():
                return
            time.sleep(0.02)
        raise NodeError(f"redis-server on port {self.port} did not answer within {wait_s}s; see {self.logfile}")

    def running(self) -> bool:
        return self.ping()

    def taken_by_another(self) -> bool:
        """Whether another program holds this node's port: anything but this node, started earlier
        and still answering. redis-server would start there only to fail to bind, daemonized, and
        :meth:`start` wait for it in vain."""
        if self.pid() is not None and self.ping():
            return False
        with socket.socket() as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as redis-server binds
            try:
                sock.bind((self.host, self.port))
            except OSError:
                return True
        return False

    def not_running(self) -> NodeError:
        return NodeError(f"redis-server on port {self.port} is not running")

    def restart(self) -> None:
        self.kill()
        self.start()


class RedisNodes:
    """A set of private nodes on consecutive ports starting at ``base_port``."""

    startable = True

    def __init__(self, *, base_port: int, count: int, run_dir: Path | str) -> None:
        if count < 1:
            raise ValueError("count must be at least 1")
        self.nodes = [RedisNode(port=base_port + i, run_dir=Path(run_dir)) for i in range(count)]

    def __iter__(self):
        return iter(self.nodes)

    def __len__(self) -> int:
        return len(self.nodes)

    def __getitem__(self, index: int) -> RedisNode:
        return self.nodes[index]

    @property
    def urls(self) -> list[str]:
        return [node.url for node in self.nodes]

    @property
    def description(self) -> str:
        return f"{len(self.nodes)} redis-server nodes from port {self.nodes[0].port} (private)"

    def running(self) -> bool:
        return all(node.running() for node in self.nodes)

    def start(self) -> None:
        """Start every node; if one cannot start (its port taken, the binary missing), the nodes this
        call started are stopped again before the error is raised: none is left running unowned."""
        started = []
        try:
            for node in self.nodes:
                if node.ping() and node.pid() is not None:
                    continue  # already running, started by this run: left as it is, whatever happens
                started.append(node)  # the one that fails too: it may have started and not answered
                node.start()
        except BaseException:
            # stop() acts through this run's pidfile only: a foreign server on a taken port is left alone.
            for node in started:
                node.stop()
            raise

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()

    def reset(self) -> None:
        """Every node running, answering and empty, whatever a test did to it (paused, killed)."""
        for node in self.nodes:
            node.resume()
            node.start()
            with node.client() as client:
                client.flushall()

    def status(self) -> list[dict]:
        return [
            {"port": node.port, "pid": node.pid(), "answers": node.ping(), "url": node.url, "pidfile": node.pidfile}
            for node in self.nodes
        ]
