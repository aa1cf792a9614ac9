"""Staff sessions that a logout ends everywhere, with sessions kept in signed cookies.

A signed-cookie session lives in the browser: Django's logout drops that browser's copy, and a copy
taken before it (a shared machine, a proxy's log, a stolen cookie) stayed a staff session until it
expired. Django verifies every authenticated request against the auth hash its session holds
(``user.get_session_auth_hash()``, derived from the password hash, so a password change ends every
session). Here that hash also covers the user's :class:`~inventory.models.SessionGeneration`, and
every logout raises the generation: every session of that user, on every browser, stops verifying,
and Django flushes it on its next request. One more row read with the user, for authenticated
requests only; shoppers are anonymous and pay nothing.

A password changed through the users' admin page (not the "change password" link) stores Django's
own hash for the session that changed it: that session then ends on its next request, as a logout.
"""

from __future__ import annotations

from django.contrib.auth import HASH_SESSION_KEY
from django.contrib.auth.backends import ModelBackend
from django.contrib.auth.signals import user_logged_in, user_logged_out
from django.db.models import F
from django.dispatch import receiver
from django.utils.crypto import salted_hmac

from .models import SessionGeneration

SALT = "inventory.sessions.RevocableSessionsBackend"


def _bound(base: str, generation: int) -> str:
    return salted_hmac(SALT, f"{base}:{generation}", algorithm="sha256").hexdigest()


def _generation(user) -> int:
    return SessionGeneration.objects.filter(user_id=user.pk).values_list("generation", flat=True).first() or 0


class RevocableSessionsBackend(ModelBackend):
    """Django's model backend; the users it loads verify sessions against the generation-bound hash."""

    def get_user(self, user_id):
        user = super().get_user(user_id)
        if user is not None:
            generation, cls = _generation(user), type(user)
            user.get_session_auth_hash = lambda: _bound(cls.get_session_auth_hash(user), generation)
            user.get_session_auth_fallback_hash = lambda: (
                _bound(base, generation) for base in cls.get_session_auth_fallback_hash(user)
            )
        return user


@receiver(user_logged_in, dispatch_uid="inventory.sessions.logged_in")
def logged_in(sender, request, user, **kwargs) -> None:
    """The hash ``login()`` just stored, bound to the user's generation (``force_login`` too)."""
    if request is not None and hasattr(request, "session"):
        request.session[HASH_SESSION_KEY] = _bound(type(user).get_session_auth_hash(user), _generation(user))


@receiver(user_logged_out, dispatch_uid="inventory.sessions.logged_out")
def logged_out(sender, request, user, **kwargs) -> None:
    """Every session of ``user``, on every browser, stops verifying."""
    if user is None or user.pk is None:
        return
    _, created = SessionGeneration.objects.get_or_create(user_id=user.pk, defaults={"generation": 1})
    if not created:
        SessionGeneration.objects.filter(user_id=user.pk).update(generation=F("generation") + 1)
