"""Django's WSGI and ASGI handlers, with requests that leave no reference cycle behind.

Two of the middleware leave the request in cycles with what they attach to it: the message
storage (``MessageMiddleware``) keeps the request it was made for, and ``request.user`` and
``request.auser`` (``AuthenticationMiddleware``) are a lazy object and a partial that call back
with the request. So when a response is done, nothing frees its request: it waits, with its
session, cookies, headers and message storages (about 40 objects), for the garbage collector. A
worker serving a thousand requests a second ran a collection every ten or so, and each one also
walked the objects of every request still in flight on its threads: 60–120 µs of CPU a request
under the burst, the purchases' more than the floor's (docs/operations.md, "Garbage collection").

Here the request drops those three attributes when it is closed. Django closes it from the
response's ``close()``, which the server calls once the response has been sent (or abandoned), so
nothing of the request is read after it: not by a view, a middleware, a template or a streamed
body. Its last reference then frees it at once, and the collector seldom runs.
"""

from __future__ import annotations

from django.core.handlers.asgi import ASGIHandler, ASGIRequest
from django.core.handlers.wsgi import WSGIHandler, WSGIRequest

#: What the middleware attach to a request that refers back to it.
CYCLIC = ("_messages", "user", "auser")


def release(request) -> None:
    """Drop what holds ``request`` in a cycle (a request closed twice is released twice: no harm)."""
    for name in CYCLIC:
        request.__dict__.pop(name, None)


class ReleasedOnClose:
    """A request (mixed in before Django's class) released when Django closes it."""

    def close(self) -> None:
        try:
            super().close()
        finally:
            release(self)


class ReleasingWSGIRequest(ReleasedOnClose, WSGIRequest):
    pass


class ReleasingASGIRequest(ReleasedOnClose, ASGIRequest):
    pass


class ShopWSGIHandler(WSGIHandler):
    request_class = ReleasingWSGIRequest


class ShopASGIHandler(ASGIHandler):
    request_class = ReleasingASGIRequest
