"""Network faults in front of real redis-server processes, for the lock tests.

* :class:`Unreachable`: a listening socket whose accept queue is full and never drained, so
  the kernel drops further SYNs: a connect to it hangs until the caller's timeout, like a host
  behind a firewall that drops packets.
* :class:`StallOnEval`: a TCP relay to a real node that stops relaying commands at the first
  ``EVAL``: the node answers ``EVALSHA`` (``NOSCRIPT`` after a restart) but not the fallback.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time


class Unreachable:
    def __init__(self) -> None:
        self.server = socket.socket()
        self.server.bind(("127.0.0.1", 0))
        self.server.listen(0)
        self.port = self.server.getsockname()[1]
        self._fill = []
        for _ in range(4):
            sock = socket.socket()
            sock.setblocking(False)
            sock.connect_ex(("127.0.0.1", self.port))
            self._fill.append(sock)
        time.sleep(0.05)
        probe = socket.socket()
        probe.settimeout(0.2)
        try:
            probe.connect(("127.0.0.1", self.port))
        except TimeoutError:
            pass
        else:
            raise RuntimeError("the full accept queue still accepted a connection: SYNs are not dropped here")
        finally:
            probe.close()

    def close(self) -> None:
        for sock in self._fill:
            sock.close()
        self.server.close()


class StallOnEval:
    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.server = socket.socket()
        self.server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.server.bind(("127.0.0.1", 0))
        self.server.listen(16)
        self.port = self.server.getsockname()[1]
        self.stalled = threading.Event()
        self.closed = threading.Event()
        self._sockets: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self.closed.is_set():
            try:
                client, _ = self.server.accept()
            except OSError:
                return
            upstream = socket.create_connection(("127.0.0.1", self.target_port))
            self._sockets += [client, upstream]
            threading.Thread(target=self._pump, args=(client, upstream, True), daemon=True).start()
            threading.Thread(target=self._pump, args=(upstream, client, False), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket, commands: bool) -> None:
        while True:
            try:
                data = source.recv(65536)
            except OSError:
                return
            if not data:
                return
            if commands and b"$4\r\nEVAL\r\n" in data:
                self.stalled.set()
            while commands and self.stalled.is_set() and not self.closed.is_set():
                time.sleep(0.01)
            try:
                sink.sendall(data)
            except OSError:
                return

    def close(self) -> None:
        self.closed.set()
        self.server.close()
        for sock in self._sockets:
            with contextlib.suppress(OSError):
                sock.close()
