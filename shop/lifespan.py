"""The ASGI lifespan of a uvicorn worker: what its event loop opened is closed before the loop ends.

uvicorn (its lifespan "auto") sends ``lifespan.startup`` before the worker's first request and
``lifespan.shutdown`` when the worker stops (gunicorn's TERM, a restart), after its last answer, on
the same loop. Django's ASGI handler speaks HTTP only: it raises on a lifespan scope, and uvicorn
then runs the worker without one, so nothing ran at shutdown. :class:`Lifespan` answers the
lifespan itself and at shutdown awaits ``on_shutdown``: the shop's is
:func:`inventory.async_purchase.aclose_loop`, which closes the asyncio connections the loop's
purchases opened (the locks', the shared queues'), as an asyncio connection cannot be closed once
its loop is. Every other scope goes to the application it wraps.
"""

from __future__ import annotations

from typing import Any, Awaitable, Callable

Scope = dict[str, Any]
Message = dict[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
App = Callable[[Scope, Receive, Send], Awaitable[None]]


class Lifespan:
    """The ASGI ``app``, with the lifespan answered here and ``on_shutdown`` awaited at shutdown."""

    def __init__(self, app: App, *, on_shutdown: Callable[[], Awaitable[None]]) -> None:
        self.app, self.on_shutdown = app, on_shutdown

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "lifespan":
            return await self.app(scope, receive, send)
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                try:
                    await self.on_shutdown()
                except Exception as exc:  # said by uvicorn in the worker's log; the worker exits anyway
                    await send({"type": "lifespan.shutdown.failed", "message": f"{type(exc).__name__}: {exc}"})
                else:
                    await send({"type": "lifespan.shutdown.complete"})
                return
