"""A purchase, floor or buy-form POST whose body comes without a Content-Length (``Transfer-Encoding:
chunked``) is refused with 411 Length Required on both servers, and buys nothing.

Seen with a real gunicorn pod (gthread, the default): Django's WSGI request reads no more of the
body than CONTENT_LENGTH says, and a chunked request has none, so ``{"quantity": 4}`` (or
``{"quantity": "lots", "evil": 1}``) went through as an empty body: 201 and an order of 1 unit.
Under uvicorn the same requests read their body, and a 50 KB one passed the 1,024-byte limit,
which read only Content-Length. Django's test client always sends a Content-Length, so these tests
drive real pods and send the body chunked with http.client.
"""

from __future__ import annotations

import http.client
import json
from urllib.parse import urlsplit

import pytest

from inventory.models import Order, Product
from loadtests.pods import collect_static
from tests.helpers import CSRF_HEADERS, pod

pytestmark = pytest.mark.slow

SKU = "chunked-phone"
PURCHASE, FLOOR, BUY = f"/api/products/{SKU}/purchase", f"/api/products/{SKU}/floor", f"/products/{SKU}/buy"
JSON, FORM = "application/json", "application/x-www-form-urlencoded"

CHUNKED = [
    (PURCHASE, JSON, b'{"quantity": 4}'),
    (PURCHASE, JSON, b'{"quantity": "lots", "evil": 1}'),
    (PURCHASE, JSON, b'{"quantity": 4' + b" " * 50_000 + b"}"),  # past MAX_BODY_BYTES, valid JSON
    (FLOOR, JSON, b'{"quantity": 4}'),
    (BUY, FORM, b"quantity=4"),
]


def send(base: str, path: str, content_type: str, body: bytes, *, chunked: bool) -> tuple[int, str, bytes]:
    """One POST on a connection of its own, its body chunked (in 1 KB pieces, no Content-Length) or
    sized: status, Content-Type, body."""
    url = urlsplit(base)
    connection = http.client.HTTPConnection(url.hostname, url.port, timeout=30)
    headers = {"Content-Type": content_type, **CSRF_HEADERS}
    try:
        if chunked:
            pieces = (body[i : i + 1024] for i in range(0, len(body), 1024))
            connection.request("POST", path, body=pieces, headers=headers, encode_chunked=True)
        else:
            connection.request("POST", path, body=body, headers=headers)
        response = connection.getresponse()
        return response.status, response.getheader("Content-Type", ""), response.read()
    finally:
        connection.close()


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("server", ["wsgi", "asgi"])
def test_a_chunked_body_is_411_and_buys_nothing_on_either_server(server, make_product, tmp_path):
    make_product(SKU, stock=10, limit=5)
    collect_static()  # the pod runs with DEBUG off: the buy form's pages need the manifest
    with pod(tmp_path, "db", sku=SKU, server=server) as base:
        answers = [send(base, path, content_type, body, chunked=True) for path, content_type, body in CHUNKED]
        assert Order.objects.count() == 0 and Product.objects.get(sku=SKU).stock == 10, answers
        sized = send(base, PURCHASE, JSON, b'{"quantity": 4}', chunked=False)
    assert [status for status, _, _ in answers] == [411] * len(CHUNKED), answers
    for (path, _, _), (_, content_type, body) in zip(CHUNKED, answers, strict=True):
        text = json.loads(body)["error"] if path != BUY else body.decode()
        assert "Content-Length" in text, (path, text)
        assert content_type.startswith("application/json" if path != BUY else "text/html")
    # The same purchase with its Content-Length buys what it names.
    assert sized[0] == 201, sized
    assert list(Order.objects.values_list("quantity", flat=True)) == [4]
    assert Product.objects.get(sku=SKU).stock == 6
