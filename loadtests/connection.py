"""One shopper's keep-alive HTTP/1.1 connection, writing requests built beforehand (no Django)."""

from __future__ import annotations

from urllib.parse import urlsplit

import gevent.socket
from geventhttpclient.header import Headers
from geventhttpclient.response import HTTPSocketResponse

CONNECT_TIMEOUT_S = 10.0
#: How long one answer may take: a spike queues thousands of requests behind a few threads. More
#: than HAProxy holds a request (``loadtests.balancer.HOLDS_AT_MOST_S``), so that the balancer
#: answers first and a resend never races its original in a pod.
NETWORK_TIMEOUT_S = 60.0


class Connection:
    """One keep-alive HTTP/1.1 connection to a pod (or the balancer) that writes prebuilt requests.

    Locust's FastHttpSession spends about 0.3 ms of client CPU building each request; at the
    opening that is 0.8–2.4 s for 5,000 shoppers on two shared cores (measured), longer than the
    spike itself. A prepared shopper's purchase is built during preparation instead, so the
    opening only writes bytes. Answers are parsed by geventhttpclient's HTTP parser.

    ``hosts`` are base URLs; the connection goes to ``hosts[first]`` and, after :meth:`fail_over`,
    to the next one (a client that spreads itself over pods moves off a dead one).
    """

    def __init__(self, hosts: list[str], first: int = 0) -> None:
        self.hosts = hosts
        self.current = first % len(hosts)
        self.sock = None

    @property
    def host_header(self) -> str:
        return urlsplit(self.hosts[self.current]).netloc

    def request(self, method: str, path: str, headers: dict[str, str], body: bytes = b"") -> bytes:
        lines = [f"{method} {path} HTTP/1.1", f"Host: {self.host_header}"]
        lines += [f"{name}: {value}" for name, value in headers.items()]
        if method == "POST":
            lines.append(f"Content-Length: {len(body)}")
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body

    def send(self, request: bytes) -> None:
        """Write ``request`` (connecting first if needed); returns once the kernel has all of it."""
        if self.sock is None:
            url = urlsplit(self.hosts[self.current])
            self.sock = gevent.socket.create_connection((url.hostname, url.port or 80), timeout=CONNECT_TIMEOUT_S)
            self.sock.settimeout(NETWORK_TIMEOUT_S)
        self.sock.sendall(request)

    def receive(self, method: str) -> tuple[int, Headers, bytes]:
        """The answer to the request just sent: (status, headers, body)."""
        response = HTTPSocketResponse(self.sock, method=method)
        body = response.read()
        if response.should_close():
            self.close()
        return response.status_code, response.info(), body

    def fail_over(self) -> None:
        """Close, and connect to the next host on the next send."""
        self.close()
        self.current = (self.current + 1) % len(self.hosts)

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None


def retry_after_s(header: str | None) -> float | None:
    """Seconds from a ``Retry-After: <seconds>`` header, or None when absent or not a number."""
    try:
        return max(0.0, float(header)) if header else None
    except ValueError:
        return None
