"""The shop's handlers free a request when its response closes: no reference cycle is left for
the garbage collector (shop/handlers.py). Each test also runs Django's own handler on the same
requests and finds its requests in cycles, so it would fail if the release stopped working."""

from __future__ import annotations

import asyncio
import gc
import io
import sys
from collections import Counter
from http.cookies import SimpleCookie

import pytest
from django.contrib import messages
from django.core.handlers.asgi import ASGIHandler
from django.core.handlers.wsgi import WSGIHandler
from django.test import Client

from shop.handlers import ShopASGIHandler, ShopWSGIHandler

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("private_static_root")]


@pytest.fixture
def shopper(make_product) -> dict[str, str]:
    """A shopper's cookies (session and CSRF) for phone-x, as the product page leaves them."""
    make_product(stock=100, limit=100)
    client = Client()
    client.get("/products/phone-x/")
    return {name: morsel.value for name, morsel in client.cookies.items()}


BODY = b'{"quantity": 1}'
#: (method, path, body): the floor and two purchases. (No page: Django's template context is a cycle
#: of its own, ``Context.push`` keeps the context in what it pushes, and it holds its request until
#: the collector frees both.)
FLOOR_AND_PURCHASES = [
    ("POST", "/api/products/phone-x/floor", BODY),
    ("POST", "/api/products/phone-x/purchase", BODY),
    ("POST", "/api/products/phone-x/purchase", BODY),
]
#: Under ASGI, the floor alone: a purchase here would run the sync view on asgiref's thread, whose
#: database connections outlive the test (the ASGI pods' purchases run on the loop, tests/test_asgi.py).
FLOORS = [("POST", "/api/products/phone-x/floor", BODY)] * 3


def headers_of(cookies: dict[str, str], number: int) -> dict[str, str]:
    return {
        "HOST": "127.0.0.1",
        "COOKIE": "; ".join(f"{name}={value}" for name, value in cookies.items()),
        "X_CSRFTOKEN": cookies["csrftoken"],
        "IDEMPOTENCY_KEY": f"cycles-{number}",
        "CONTENT_TYPE": "application/json",
    }


def serve_wsgi(handler, cookies: dict[str, str]) -> list[int]:
    statuses = []
    for number, (method, path, body) in enumerate(FLOOR_AND_PURCHASES):
        environ = {
            "REQUEST_METHOD": method,
            "PATH_INFO": path,
            "SCRIPT_NAME": "",
            "SERVER_NAME": "127.0.0.1",
            "SERVER_PORT": "8000",
            "wsgi.url_scheme": "http",
            "wsgi.input": io.BytesIO(body),
            "wsgi.errors": sys.stderr,
            "CONTENT_LENGTH": str(len(body)),
            **{f"HTTP_{name}": value for name, value in headers_of(cookies, number).items()},
        }
        environ["CONTENT_TYPE"] = environ.pop("HTTP_CONTENT_TYPE")
        response = handler(environ, lambda status, headers, exc_info=None: statuses.append(int(status.split()[0])))
        b"".join(response)
        response.close()  # as the server does once the body is sent
    return statuses


def serve_asgi(handler, cookies: dict[str, str]) -> list[int]:
    async def one(method: str, path: str, body: bytes, number: int) -> int:
        headers = [
            (name.lower().replace("_", "-").encode(), value.encode())
            for name, value in headers_of(cookies, number).items()
        ]
        scope = {"type": "http", "method": method, "path": path, "query_string": b"", "headers": headers,
                 "server": ("127.0.0.1", 8000), "scheme": "http", "root_path": ""}  # fmt: skip
        sent, asked = [], []

        async def receive():
            if asked:
                await asyncio.Event().wait()  # no disconnect before the answer
            asked.append(True)
            return {"type": "http.request", "body": body, "more_body": False}

        async def send(message):
            sent.append(message)

        await handler(scope, receive, send)
        return next(message["status"] for message in sent if message["type"] == "http.response.start")

    async def all_of() -> list[int]:
        return [await one(method, path, body, n) for n, (method, path, body) in enumerate(FLOORS)]

    return asyncio.run(all_of())


#: What a request held in a cycle keeps with it (seen left by Django's handlers). Only these are
#: counted: a background thread (the sold-out listener's Redis connection) may leave garbage of its
#: own during the test, which says nothing about the requests (seen once: a redis-py parser).
REQUEST_GRAPH = {"WSGIRequest", "ASGIRequest", "SessionStore", "FallbackStorage", "CookieStorage", "SessionStorage",
                 "SimpleLazyObject", "QueryDict", "ResolverMatch", "MultiValueDict", "TimestampSigner"}  # fmt: skip


def cycles_left(serve, handler, cookies: dict[str, str]) -> tuple[list[int], Counter]:
    """The statuses of the requests ``serve`` sends to ``handler``, and the request objects left in cycles, by type."""
    serve(handler, cookies)  # warm: first-use caches are not garbage
    gc.collect()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        statuses = serve(handler, cookies)
        gc.collect()
        names = (type(thing).__name__ for thing in gc.garbage)
        return statuses, Counter(name for name in names if name in REQUEST_GRAPH)
    finally:
        gc.set_debug(0)
        gc.garbage.clear()


def test_the_wsgi_handler_leaves_no_request_in_a_cycle(shopper):
    statuses, left = cycles_left(serve_wsgi, ShopWSGIHandler(), shopper)
    assert statuses == [200, 201, 201]
    assert left == Counter()
    statuses, django_left = cycles_left(serve_wsgi, WSGIHandler(), shopper)
    assert statuses == [200, 201, 201]
    assert django_left["WSGIRequest"] == 3


def test_the_asgi_handler_leaves_no_request_in_a_cycle(shopper):
    statuses, left = cycles_left(serve_asgi, ShopASGIHandler(), shopper)
    assert statuses == [200, 200, 200]
    assert left == Counter(), left
    _, django_left = cycles_left(serve_asgi, ASGIHandler(), shopper)
    assert django_left["ASGIRequest"] == 3


def test_a_message_is_still_saved_in_the_response(shopper, settings):
    """The message storage is dropped only once the response is closed: a message a view adds is
    saved in the response's cookie before that, where the next request reads it."""
    from django.contrib.messages.storage.cookie import CookieStorage
    from django.http import HttpResponse
    from django.test import RequestFactory
    from django.urls import path

    def add_message(request):
        messages.success(request, "kept past the close")
        return HttpResponse("ok")

    settings.ROOT_URLCONF = type("urls", (), {"urlpatterns": [path("add/", add_message)]})
    environ = {
        "REQUEST_METHOD": "GET", "PATH_INFO": "/add/", "SCRIPT_NAME": "", "SERVER_NAME": "127.0.0.1",
        "SERVER_PORT": "8000", "wsgi.url_scheme": "http", "wsgi.input": io.BytesIO(), "wsgi.errors": sys.stderr,
        "HTTP_HOST": "127.0.0.1",
    }  # fmt: skip
    headers = []
    response = ShopWSGIHandler()(environ, lambda status, sent, exc_info=None: headers.extend(sent))
    b"".join(response)
    response.close()
    cookie = next(value.strip() for name, value in headers if name == "Set-Cookie" and "messages=" in value)
    later = RequestFactory().get("/")
    later.COOKIES.update({name: morsel.value for name, morsel in SimpleCookie(cookie).items()})
    assert [str(message) for message in CookieStorage(later)] == ["kept past the close"]
