"""A plain spike client, to measure the load generator against: no Locust, no gevent, no Django.

``python -m loadtests.yardstick --host http://127.0.0.1:8000 --requests 5000`` opens one
keep-alive connection per shopper, prepares each (``GET /api/session``: its session and CSRF
cookies), builds its purchase request, then writes every request at once and reads every answer
on one asyncio event loop. It prints the arrival window (first to last request written), the
drain (first written to last answer read), the rate and the status codes. Run it against any
pod: ``make serve``'s shop, or the pods ``flashsale --yardstick`` starts, where it runs on the
floor endpoint of every row's own pods right after Locust, so the Locust path's overhead is a
figure in the same run (docs/burst.md).

A pod must accept the connections: ``flashsale`` sizes its pods for that; ``make serve``'s
gunicorn keeps at most ``GUNICORN_WORKER_CONNECTIONS`` per worker (1000 by default).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from urllib.parse import urlsplit

CONNECT_TIMEOUT_S = 10.0
ANSWER_TIMEOUT_S = 120.0


@dataclass
class Spike:
    """What one spike measured: wall-clock times and the final status of every request."""

    requests: int
    statuses: Counter = field(default_factory=Counter)
    first_sent: float | None = None
    last_sent: float | None = None
    last_answer: float | None = None
    failed_preparations: int = 0

    @property
    def arrival_window_s(self) -> float | None:
        return None if self.first_sent is None else round(self.last_sent - self.first_sent, 3)

    @property
    def drain_s(self) -> float | None:
        return None if self.last_answer is None else round(self.last_answer - self.first_sent, 3)

    def figures(self) -> dict:
        drain = self.drain_s
        answered = sum(n for status, n in self.statuses.items() if status)
        return {
            "requests": self.requests,
            "arrival_window_s": self.arrival_window_s,
            "drain_s": drain,
            "rps": round(answered / drain, 1) if drain else 0.0,
            "status_counts": {str(status): n for status, n in sorted(self.statuses.items())},
            "failed_preparations": self.failed_preparations,
        }


async def read_answer(reader: asyncio.StreamReader) -> tuple[int, dict[str, list[str]]]:
    """One HTTP/1.1 answer: (status, headers by lower-case name); its body is read and dropped."""
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ", 2)[1])
    headers: dict[str, list[str]] = {}
    for line in lines[1:]:
        if ":" in line:
            name, value = line.split(":", 1)
            headers.setdefault(name.strip().lower(), []).append(value.strip())
    length = int(headers.get("content-length", ["0"])[0])
    if length:
        await reader.readexactly(length)
    return status, headers


def request(method: str, path: str, host: str, headers: dict[str, str], body: bytes = b"") -> bytes:
    lines = [f"{method} {path} HTTP/1.1", f"Host: {host}", *(f"{k}: {v}" for k, v in headers.items())]
    if method == "POST":
        lines.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


class Shopper:
    """One connection: prepared (cookies, its request built), then one request at the opening."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None
        self.purchase = b""

    async def prepare(self, path: str, key: int) -> bool:
        try:
            connect = asyncio.open_connection(self.host, self.port)
            self.reader, self.writer = await asyncio.wait_for(connect, CONNECT_TIMEOUT_S)
            self.writer.write(request("GET", "/api/session", f"{self.host}:{self.port}", {}))
            status, headers = await read_answer(self.reader)
        except (OSError, asyncio.TimeoutError, asyncio.IncompleteReadError, ValueError):
            return False
        cookies = dict(c.split(";", 1)[0].split("=", 1) for c in headers.get("set-cookie", []) if "=" in c)
        if status != 200 or "csrftoken" not in cookies:
            return False
        self.purchase = request(
            "POST",
            path,
            f"{self.host}:{self.port}",
            {
                "Content-Type": "application/json",
                "X-CSRFToken": cookies["csrftoken"],
                "Cookie": "; ".join(f"{k}={v}" for k, v in cookies.items()),
                "Idempotency-Key": f"yardstick-{time.time_ns()}-{key}",
            },
            json.dumps({"quantity": 1}).encode(),
        )
        return True

    async def answer(self, spike: Spike) -> None:
        try:
            status, _ = await asyncio.wait_for(read_answer(self.reader), ANSWER_TIMEOUT_S)
        except (OSError, asyncio.TimeoutError, asyncio.IncompleteReadError, ValueError):
            status = 0
        spike.statuses[status] += 1
        spike.last_answer = time.time()
        self.writer.close()


async def run_spike(urls: list[str], *, requests: int, path: str, prepare_concurrency: int = 200) -> Spike:
    """Prepare ``requests`` shoppers on their own connections to ``urls`` (round robin), then
    release them all at once."""
    parts = [urlsplit(url) for url in urls]
    shoppers = [Shopper(parts[i % len(parts)].hostname, parts[i % len(parts)].port or 80) for i in range(requests)]
    spike = Spike(requests=requests)
    gate = asyncio.Semaphore(prepare_concurrency)

    async def prepare(index: int, shopper: Shopper) -> bool:
        async with gate:
            return await shopper.prepare(path, index)

    prepared = await asyncio.gather(*(prepare(i, s) for i, s in enumerate(shoppers)))
    ready = [shopper for shopper, ok in zip(shoppers, prepared, strict=True) if ok]
    spike.failed_preparations = len(shoppers) - len(ready)
    spike.first_sent = time.time()
    for shopper in ready:  # every request written before any answer is read
        shopper.writer.write(shopper.purchase)
    spike.last_sent = time.time()
    await asyncio.gather(*(shopper.answer(spike) for shopper in ready))
    return spike


def raise_descriptor_limit(needed: int) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < needed:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, max(needed, soft)), hard))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m loadtests.yardstick", description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", default="http://127.0.0.1:8000", help="the pod's base URL (several: comma-separated)")
    parser.add_argument("--requests", type=int, default=5000, help="shoppers, one request each")
    parser.add_argument("--path", default="/api/products/phone-x/floor", help="where each request is posted")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    options = parser.parse_args(argv)
    if options.requests < 1:
        parser.error("--requests must be 1 or more")
    hosts = [host.strip() for host in options.host.split(",") if host.strip()]
    if not hosts or not all(map(base_url, hosts)):
        parser.error(f"--host {options.host!r}: give a base URL such as http://127.0.0.1:8000")
    raise_descriptor_limit(options.requests + 64)
    spike = asyncio.run(run_spike(hosts, requests=options.requests, path=options.path))
    figures = spike.figures()
    if options.json:
        print(json.dumps(figures))
    else:
        print(
            f"{options.requests} requests to {options.host}{options.path}: written within "
            f"{figures['arrival_window_s']} s, drained in {figures['drain_s']} s ({figures['rps']}/s); "
            f"statuses {figures['status_counts']}; {figures['failed_preparations']} not prepared"
        )
    failed, unanswered = figures["failed_preparations"], figures["status_counts"].get("0", 0)
    if failed == options.requests:
        print(f"no shopper could be prepared at {options.host}: is the shop running there?", file=sys.stderr)
        return 1
    if failed or unanswered:
        # Its drain and rate would be of fewer requests than asked: not the figure to read Locust against.
        said = "; ".join(
            text
            for text, count in (
                (f"{failed} of {options.requests} shoppers could not be prepared", failed),
                (f"{unanswered} requests got no answer", unanswered),
            )
            if count
        )
        print(f"{said} at {options.host}: the figures are not of a {options.requests}-request spike", file=sys.stderr)
        return 1
    return 0


def base_url(host: str) -> bool:
    """``host`` is an http:// URL with a host name and, if any, a port number in range."""
    try:
        parts = urlsplit(host)
        parts.port  # noqa: B018 (raises ValueError on a port out of range or not a number)
    except ValueError:
        return False
    return parts.scheme == "http" and bool(parts.hostname)


if __name__ == "__main__":
    sys.exit(main())
