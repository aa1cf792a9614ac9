"""Network faults in front of real redis-server processes, for the lock tests.

* :class:`Unreachable`: a listening socket whose accept queue is full and never drained, so
  the kernel drops further SYNs: a connect to it hangs until the caller's timeout, like a host
  behind a firewall that drops packets.

A node that stops answering at the first ``EVAL`` is :class:`processes.relay.Relay` with ``stall_on``.
"""

from __future__ import annotations

import socket
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
