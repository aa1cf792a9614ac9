"""A TCP relay between a client and a private process, with the faults it can put in between.

:class:`Relay` holds or drops what the target sends (the replication link of
:class:`~processes.replication.ReplicatedPair`), follows a failover (``retarget``), or stops
forwarding a client's commands from one command on (``stall_on``, the lock tests' stalled node).
No Django import.
"""

from __future__ import annotations

import contextlib
import socket
import threading

HOST = "127.0.0.1"


class Relay:
    """A TCP relay on ``HOST:port`` (0 picks a free port) to ``HOST:target_port``, run by daemon threads.

    Bytes from the target to the client pass through ``hold()``: while held, they are kept and not
    forwarded; ``release()`` forwards them; ``cut()`` drops them and closes every connection.
    With ``stall_on``, the first client bytes that contain it set ``stalled``, and from then on
    nothing more from any client reaches the target until ``close()`` (a node that stops
    answering one command, e.g. ``EVAL``, while it still answered the ones before).
    """

    def __init__(self, *, target_port: int, port: int = 0, stall_on: bytes | None = None) -> None:
        self.target_port = target_port
        self.stall_on = stall_on
        self.stalled = threading.Event()
        self._shut = threading.Event()
        self._listener = socket.create_server((HOST, port))
        self.port = self._listener.getsockname()[1]
        self._open = threading.Event()
        self._open.set()
        self._cut = False
        self._closed = False
        self._lock = threading.Lock()
        self._sockets: list[socket.socket] = []
        threading.Thread(target=self._accept, name=f"relay:{self.port}", daemon=True).start()

    @property
    def url(self) -> str:
        return f"redis://{HOST}:{self.port}/0"

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return  # the listener was closed
            try:
                upstream = socket.create_connection((HOST, self.target_port), timeout=1.0)
                upstream.settimeout(None)
            except OSError:
                client.close()  # the target is down: the client sees its connection closed at once
                continue
            for sock in (client, upstream):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            with self._lock:
                if self._closed:
                    client.close()
                    upstream.close()
                    return
                self._sockets += [client, upstream]
            threading.Thread(target=self._pump, args=(client, upstream, False), daemon=True).start()
            threading.Thread(target=self._pump, args=(upstream, client, True), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket, from_target: bool) -> None:
        try:
            while True:
                data = source.recv(65536)
                if not data:
                    break
                if from_target:
                    self._open.wait()
                    if self._cut:
                        break
                elif self.stall_on is not None and (self.stalled.is_set() or self.stall_on in data):
                    self.stalled.set()
                    self._shut.wait()
                    break
                sink.sendall(data)
        except OSError:
            pass
        finally:
            self._drop(source, sink)

    def _drop(self, *socks: socket.socket) -> None:
        with self._lock:
            for sock in socks:
                if sock in self._sockets:
                    self._sockets.remove(sock)
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)  # wakes the other pump, blocked in recv
                sock.close()

    def hold(self) -> None:
        self._cut = False
        self._open.clear()

    def release(self) -> None:
        self._open.set()

    def cut(self) -> None:
        """Drop whatever is held and close every connection; new connections are accepted again."""
        self._cut = True
        self._open.set()
        with self._lock:
            socks = list(self._sockets)
        self._drop(*socks)
        self._cut = False

    def retarget(self, target_port: int) -> None:
        """New connections go to ``target_port``; the current ones are closed, so clients reconnect there."""
        self.target_port = target_port
        self.cut()

    def close(self) -> None:
        self._shut.set()
        with self._lock:
            self._closed = True
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)  # wakes the accept thread; close() alone would not
        self._listener.close()
        self.cut()
