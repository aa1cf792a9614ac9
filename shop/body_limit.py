"""A cap on a request's body under ASGI: past ``REQUEST_BODY_MAX_BYTES``, 413, the rest never read.

Django's ASGI handler reads the whole body of every request, of any size, into a spooled file before
any middleware or view runs, so the views' own size checks (1 KB for a purchase) came after a POST
of megabytes, declared or chunked, had been read to its end. :class:`BodyLimit` wraps the ASGI
application: a Content-Length past the cap is answered at once; a body without one (chunked) is read
here only until the bytes received pass the cap, then answered, and handed on whole otherwise. The
answer closes the connection (``Connection: close``), so the server reads no more of it.

Under WSGI (gunicorn's gthread workers) Django reads a body only when a view asks for it, never past
CONTENT_LENGTH, and refuses one past ``DATA_UPLOAD_MAX_MEMORY_SIZE`` unread: no wrapper is needed.
"""

from __future__ import annotations

import json
from typing import Any, Awaitable, Callable

Scope = dict[str, Any]
Message = dict[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
App = Callable[[Scope, Receive, Send], Awaitable[None]]


def declared_length(scope: Scope) -> int | None:
    """The request's Content-Length, or None when it has none or it is no size (the server's parser
    or the view answers that)."""
    for name, value in scope.get("headers", ()):
        if name.lower() == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


class BodyLimit:
    """The ASGI ``app``, refusing a body past ``max_bytes`` with 413 before reading the rest."""

    def __init__(self, app: App, *, max_bytes: int) -> None:
        self.app, self.max_bytes = app, max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        length = declared_length(scope)
        if length is not None:
            if length > self.max_bytes:
                return await self.refuse(scope, send)
            return await self.app(scope, receive, send)  # the server reads no more than it declares
        received: list[Message] = []
        size = 0
        while True:  # no Content-Length (chunked): read it here, up to the cap
            message = await receive()
            received.append(message)
            if message["type"] != "http.request":
                break  # the client went away: the application hears it too
            size += len(message.get("body", b""))
            if size > self.max_bytes:
                return await self.refuse(scope, send)
            if not message.get("more_body", False):
                break

        async def replay() -> Message:
            return received.pop(0) if received else await receive()

        return await self.app(scope, replay, send)

    async def refuse(self, scope: Scope, send: Send) -> None:
        message = f"request body larger than {self.max_bytes} bytes"
        if scope.get("path", "").startswith("/api/"):
            body, content_type = json.dumps({"error": message}).encode(), b"application/json"
        else:
            body, content_type = f"{message[0].upper()}{message[1:]}.\n".encode(), b"text/plain; charset=utf-8"
        headers = [
            (b"content-type", content_type),
            (b"content-length", str(len(body)).encode()),
            (b"connection", b"close"),  # the rest of the body is never read
        ]
        await send({"type": "http.response.start", "status": 413, "headers": headers})
        await send({"type": "http.response.body", "body": body})
