"""Network faults in front of real servers (redis-server, ZooKeeper members), for the lock tests.

* :class:`Unreachable`: a listening socket whose accept queue is full and never drained, so
  the kernel drops further SYNs: a connect to it hangs until the caller's timeout, like a host
  behind a firewall that drops packets.

* :class:`Proxy`: a TCP proxy to one server that can drop every connection (``cut``) and can
  stall one connection for good from the first request that contains ``stall_on``, while new
  connections pass: a member that took a request and went silent on that connection only. With
  ``mute_on``, the first request that contains it does reach the server, but nothing the server
  answers on that connection reaches the client (once; later connections pass): a command that
  ran while its reply was lost or came too late. With ``split_on``, the reply to the first request
that contains it reaches the client in two parts, its first byte at once and the rest
``split_delay_s`` later: a reply whose segments arrive apart. With ``reply_delay_s`` (settable at any
time), every reply reaches the client that much later while requests pass at once: a slow link
on which the server has run a command whose answer is still on its way.

A node that stops answering at the first ``EVAL`` is :class:`processes.relay.Relay` with ``stall_on``.

:func:`sockets_to` counts this process's TCP sockets to given ports (connected, or still connecting).
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import time


def sockets_to(ports: set[int]) -> int:
    """This process's TCP sockets whose far end is one of ``ports``, whatever their state (a
    connect the kernel is still retrying among them): read from ``/proc``, so a descriptor another
    thread of the test process opened meanwhile (a listener reconnecting) is not counted."""
    mine = set()
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):  # closed since the listing
            target = os.readlink(f"/proc/self/fd/{fd}")
            if target.startswith("socket:["):
                mine.add(target[len("socket:[") : -1])
    count = 0
    with open("/proc/self/net/tcp") as table:
        for line in table.readlines()[1:]:
            fields = line.split()
            if int(fields[2].rsplit(":", 1)[1], 16) in ports and fields[9] in mine:
                count += 1
    return count


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


class Proxy:
    """A TCP proxy on 127.0.0.1 (a free port) to ``127.0.0.1:target_port``, run by daemon threads."""

    def __init__(
        self,
        target_port: int,
        *,
        stall_on: bytes | None = None,
        mute_on: bytes | None = None,
        split_on: bytes | None = None,
        split_delay_s: float = 2.0,
        reply_delay_s: float = 0.0,
    ) -> None:
        self.target_port = target_port
        self.reply_delay_s = reply_delay_s
        self.split_on, self.split_delay_s = split_on, split_delay_s
        self.split = threading.Event()
        self.stall_on = stall_on
        self.stalled = threading.Event()
        self.mute_on = mute_on
        self.muted = threading.Event()
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def host(self) -> str:
        return f"127.0.0.1:{self.port}"

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return  # the listener was closed
            try:
                upstream = socket.create_connection(("127.0.0.1", self.target_port), timeout=1.0)
            except OSError:
                client.close()  # the member is down: the client sees its connection closed
                continue
            upstream.settimeout(None)
            with self._lock:
                self._sockets += [client, upstream]
            mute = threading.Event()  # this connection's answers go nowhere once set
            split = threading.Event()  # this connection's next answer arrives in two parts
            args = (mute, split)
            threading.Thread(target=self._pump, args=(client, upstream, True, *args), daemon=True).start()
            threading.Thread(target=self._pump, args=(upstream, client, False, *args), daemon=True).start()

    def _pump(
        self,
        source: socket.socket,
        sink: socket.socket,
        from_client: bool,
        mute: threading.Event,
        split: threading.Event,
    ) -> None:
        stalled = False
        try:
            while data := source.recv(65536):
                if from_client and self.stall_on is not None and (stalled or self.stall_on in data):
                    stalled = True  # this connection's requests go nowhere from now on; it stays open
                    self.stalled.set()
                    continue
                if from_client and self.mute_on is not None and self.mute_on in data:
                    with self._lock:
                        if not self.muted.is_set():
                            self.muted.set()
                            mute.set()  # before forwarding: the answer must not slip through
                if from_client and self.split_on is not None and self.split_on in data:
                    with self._lock:
                        if not self.split.is_set():
                            self.split.set()
                            split.set()
                if not from_client and mute.is_set():
                    continue
                if not from_client and self.reply_delay_s:
                    time.sleep(self.reply_delay_s)
                if not from_client and split.is_set():
                    split.clear()
                    sink.sendall(data[:1])
                    time.sleep(self.split_delay_s)
                    data = data[1:]
                sink.sendall(data)
        except OSError:
            pass
        finally:
            self._close(source, sink)

    def _close(self, *socks: socket.socket) -> None:
        for sock in socks:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()

    def cut(self) -> None:
        """Close every connection now; new ones are accepted."""
        with self._lock:
            socks, self._sockets = self._sockets, []
        self._close(*socks)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)  # wakes the accept thread; close() alone would not
        self._listener.close()
        self.cut()
