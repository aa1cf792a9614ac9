"""Whole numbers from the environment, read the same way by shop/settings.py and gunicorn.conf.py:
unset or empty is the default, anything else a whole number of at least ``least`` or one line
naming the variable. It imports nothing of Django's settings, so gunicorn's config can use it."""

from __future__ import annotations

import os

from django.core.exceptions import ImproperlyConfigured


def env_int(name: str, default: int, *, least: int | None = None) -> int:
    raw = os.environ.get(name, "")
    if raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ImproperlyConfigured(f"{name}={raw!r}: expected a whole number") from None
    if least is not None and value < least:
        raise ImproperlyConfigured(f"{name}={raw!r}: use {least} or more")
    return value
