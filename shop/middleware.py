"""A request that could not get a database connection in time is told "busy, retry", not a 500.

With the bounded pool (``DATABASE_POOL_MAX_SIZE``), a request that waits ``DATABASE_POOL_TIMEOUT``
seconds without a connection raises ``psycopg_pool.PoolTimeout`` (wrapped by Django in its own
``OperationalError``). That happens when every connection is held, e.g. by ``db``-strategy
buyers waiting on the row lock, and it happened before the request changed anything: the
connection it would have written with never existed. So it is answered like the shop's other
"busy": 503 with ``Retry-After``.
"""

from __future__ import annotations

import logging

from asgiref.sync import iscoroutinefunction, markcoroutinefunction
from django.http import HttpRequest, HttpResponse, JsonResponse
from psycopg_pool import PoolTimeout

logger = logging.getLogger(__name__)

RETRY_AFTER_SECONDS = "1"
MESSAGE = "The shop is busy: please try again in a moment."


def pool_timeout(exception: BaseException | None) -> PoolTimeout | None:
    """The PoolTimeout behind ``exception`` (itself, its cause or its context), or None."""
    seen = set()
    while exception is not None and id(exception) not in seen:
        if isinstance(exception, PoolTimeout):
            return exception
        seen.add(id(exception))
        exception = exception.__cause__ or exception.__context__
    return None


class PoolExhaustedMiddleware:
    sync_capable = True
    async_capable = True

    def __init__(self, get_response):
        self.get_response = get_response
        if iscoroutinefunction(get_response):
            markcoroutinefunction(self)  # then __call__ returns get_response's coroutine, awaited above

    def __call__(self, request: HttpRequest):
        return self.get_response(request)

    def process_exception(self, request: HttpRequest, exception: Exception) -> HttpResponse | None:
        timeout = pool_timeout(exception)
        if timeout is None:
            return None
        logger.warning("no database connection for %s %s: %s", request.method, request.path, timeout)
        if request.path.startswith("/api/"):
            response = JsonResponse({"outcome": "busy", "message": MESSAGE}, status=503)
        else:
            response = HttpResponse(MESSAGE, status=503, content_type="text/plain; charset=utf-8")
        response["Retry-After"] = RETRY_AFTER_SECONDS
        return response
