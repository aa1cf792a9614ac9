"""Django's own middleware with its hooks run inline on the event loop: the ASGI pod's chain.

Django marks its middleware async-capable but, under ASGI, runs every sync hook
(``process_request``, ``process_view``, ``process_response``) through ``sync_to_async`` with
``thread_sensitive=True``, and its ASGI handler gives each request its own thread-sensitive
context: a thread per request in flight, a dozen hops into it per request. A spike of 2,000
purchases made 2,000 threads per worker (``flashsale --server asgi``: the ASGI floor at a quarter
of WSGI's, load 23 on two cores). These hooks do no I/O in this shop (sessions are signed cookies,
messages live in cookies, the user is loaded lazily and the purchase views never ask for it), so
here they run inline on the loop. Should one ever touch the database there (say, a database
session engine), Django raises ``SynchronousOnlyOperation`` at once: the chain fails loudly
rather than blocking the loop. Under WSGI the settings keep Django's classes as they are.
"""

from __future__ import annotations

from django.contrib.auth.middleware import AuthenticationMiddleware
from django.contrib.messages.middleware import MessageMiddleware
from django.contrib.sessions.middleware import SessionMiddleware
from django.middleware.clickjacking import XFrameOptionsMiddleware
from django.middleware.common import CommonMiddleware
from django.middleware.csrf import CsrfViewMiddleware
from django.middleware.security import SecurityMiddleware
from django.utils.deprecation import MiddlewareMixin


class OnLoop:
    """Mixin for a ``MiddlewareMixin`` class: in async mode, its hooks are called inline."""

    sync_capable = False
    async_capable = True

    async def __acall__(self: MiddlewareMixin, request):
        response = self.process_request(request) if hasattr(self, "process_request") else None
        response = response or await self.get_response(request)
        return self.process_response(request, response) if hasattr(self, "process_response") else response


class SecurityOnLoop(OnLoop, SecurityMiddleware):
    pass


class SessionOnLoop(OnLoop, SessionMiddleware):
    pass


class CommonOnLoop(OnLoop, CommonMiddleware):
    pass


class CsrfOnLoop(OnLoop, CsrfViewMiddleware):
    async def process_view(self, request, callback, callback_args, callback_kwargs):
        return super().process_view(request, callback, callback_args, callback_kwargs)


class AuthenticationOnLoop(OnLoop, AuthenticationMiddleware):
    pass


class MessageOnLoop(OnLoop, MessageMiddleware):
    pass


class XFrameOptionsOnLoop(OnLoop, XFrameOptionsMiddleware):
    pass
