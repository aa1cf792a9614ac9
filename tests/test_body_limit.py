"""A request body past ``REQUEST_BODY_MAX_BYTES`` (1 MiB) is refused, 413, before it is read.

Seen with a real uvicorn pod: Django's ASGI handler reads a request's whole body, of any size, before
any middleware or view runs, so a POST to any URL that declared 8 MiB (or sent megabytes chunked) was
read to its end, spooled to a temporary file, before the view's own size check could turn it away; a
client that sent its headers and then stalled held a worker's task until it gave up. The ASGI
application is now wrapped (``shop/body_limit.py``): a Content-Length past the cap is answered at
once, a chunked body as soon as the bytes received pass it, and the connection closed unread.

Under gunicorn's gthread workers (WSGI) Django reads a body only when the view asks for it, and then
no more than CONTENT_LENGTH, and refuses a declared body past ``DATA_UPLOAD_MAX_MEMORY_SIZE`` (2.5
MB) unread: the same requests are answered without their bodies (413 or 411 from the purchase
view's own checks, the page's answer elsewhere). These tests send from a raw socket, as such a
client would, against real pods.
"""

from __future__ import annotations

import asyncio
import socket
import time
from urllib.parse import urlsplit

import pytest

from inventory.models import Order, Product
from loadtests.pods import collect_static
from shop.body_limit import BodyLimit
from tests.helpers import CSRF, pod, post_status

pytestmark = pytest.mark.slow

SKU = "big-body"
PURCHASE = f"/api/products/{SKU}/purchase"
PATHS = [PURCHASE, "/", "/admin/login/"]
CAP = 1 << 20  # the setting's default
PIECE = 64 * 1024


def buy(base: str) -> int:
    return post_status(base, PURCHASE, b'{"quantity": 2}', timeout=10)


def head(path: str, *, framing: str) -> bytes:
    return (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"X-CSRFToken: {CSRF}\r\nCookie: csrftoken={CSRF}\r\n{framing}\r\n\r\n"
    ).encode()


def answer_to(base: str, path: str, *, chunked: bool, wait_s: float = 5.0) -> tuple[int | None, bytes, bool]:
    """POST to ``path`` from a raw socket, then stop sending and wait for an answer: sized, the headers
    declare 8 MiB and one 64 KiB piece follows; chunked, 64 KiB chunks until past the cap, no last
    chunk. Returns (status or None if no answer came within ``wait_s``, the answer's body, whether
    the server then closed the connection)."""
    url = urlsplit(base)
    with socket.create_connection((url.hostname, url.port), timeout=wait_s) as sock:
        try:
            if chunked:
                sock.sendall(head(path, framing="Transfer-Encoding: chunked"))
                for _ in range(CAP // PIECE + 1):
                    sock.sendall(b"%x\r\n" % PIECE + b" " * PIECE + b"\r\n")
            else:
                sock.sendall(head(path, framing=f"Content-Length: {8 * CAP}") + b" " * PIECE)
        except OSError:
            pass  # the server answered and closed while this was still sending: read its answer
        received, deadline = b"", time.monotonic() + wait_s
        closed = False
        while time.monotonic() < deadline:
            try:
                data = sock.recv(65536)
            except TimeoutError:
                break
            except ConnectionResetError:
                closed = True
                break
            if not data:
                closed = True
                break
            received += data
    if not received:
        return None, b"", closed
    status = int(received.split(b" ", 2)[1])
    return status, received.partition(b"\r\n\r\n")[2], closed


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("chunked", [False, True], ids=["sized", "chunked"])
def test_a_body_past_the_cap_is_413_unread_under_uvicorn(chunked, make_product, tmp_path):
    make_product(SKU, stock=10, limit=5)
    collect_static()  # the pod runs with DEBUG off: the pages need the manifest
    with pod(tmp_path, "db", sku=SKU, server="asgi") as base:
        answers = {path: answer_to(base, path, chunked=chunked) for path in PATHS}
        bought = buy(base)  # a purchase of the usual size still goes through
    assert {path: status for path, (status, _, _) in answers.items()} == dict.fromkeys(PATHS, 413), answers
    for status, body, closed in answers.values():
        assert b"larger than 1048576 bytes" in body and closed, (status, body, closed)
    assert bought == 201
    assert list(Order.objects.values_list("quantity", flat=True)) == [2] and Product.objects.get(sku=SKU).stock == 8


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("chunked", [False, True], ids=["sized", "chunked"])
def test_gunicorn_answers_the_same_requests_without_reading_them(chunked, make_product, tmp_path):
    """WSGI needs no cap: each is answered at once (the purchase view's own 413 or 411, the home
    page's 405, the login page with no form read), the body never read, nothing bought."""
    make_product(SKU, stock=10, limit=5)
    collect_static()
    with pod(tmp_path, "db", sku=SKU, server="wsgi") as base:
        answers = {path: answer_to(base, path, chunked=chunked) for path in PATHS}
        bought = buy(base)
    statuses = {path: status for path, (status, _, _) in answers.items()}
    assert statuses == {PURCHASE: 411 if chunked else 413, "/": 405, "/admin/login/": 200}, answers
    assert bought == 201
    assert list(Order.objects.values_list("quantity", flat=True)) == [2] and Product.objects.get(sku=SKU).stock == 8


def test_a_chunked_body_under_the_cap_reaches_the_application_whole():
    """In process: the pieces the wrapper read to count are handed on in order, then the rest."""
    pieces = [{"type": "http.request", "body": b"x" * 600, "more_body": True} for _ in range(3)]
    pieces[-1]["more_body"] = False
    seen, sent = [], []

    async def application(scope, receive, send):
        while True:
            message = await receive()
            seen.append(message["body"])
            if not message["more_body"]:
                break
        await send({"type": "http.response.start", "status": 200, "headers": []})

    async def receive():
        return pieces.pop(0)

    async def send(message):
        sent.append(message)

    scope = {"type": "http", "path": "/", "headers": [(b"transfer-encoding", b"chunked")]}
    asyncio.run(BodyLimit(application, max_bytes=2048)(scope, receive, send))
    assert b"".join(seen) == b"x" * 1800 and sent[0]["status"] == 200
    pieces[:] = [{"type": "http.request", "body": b"x" * 600, "more_body": True} for _ in range(4)]
    seen.clear()
    sent.clear()
    asyncio.run(BodyLimit(application, max_bytes=2048)(scope, receive, send))
    assert not seen and sent[0]["status"] == 413 and len(pieces) == 0, "refused at the 4th piece, never handed on"
    assert sent[1]["body"] == b"Request body larger than 2048 bytes.\n"
