"""Purchase backends, chosen by ``settings.INVENTORY["BACKEND"]``: an alias or a dotted path.

Resolved the way Django resolves cache backends: ``import_string`` on the path, and an import
failure re-raised as ``ImproperlyConfigured`` from its cause.
"""
from __future__ import annotations

import threading

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.core.signals import setting_changed
from django.utils.module_loading import import_string

from .base import InventoryBackend, LockUnavailable, Outcome, StaleFence

ALIASES = {
    "db": "inventory.backends.db.RowLockBackend",
    "redis": "inventory.backends.redis.RedisLockBackend",
    "redlock": "inventory.backends.redlock.RedlockBackend",
    "unsafe": "inventory.backends.unsafe.UnsafeBackend",
}

__all__ = ["ALIASES", "InventoryBackend", "LockUnavailable", "Outcome", "StaleFence", "get_backend", "load_backend"]


def load_backend(name: str, *, options: dict | None = None) -> InventoryBackend:
    """Build the backend named by an alias (``db``, ``redis``, ``redlock``, ``unsafe``) or a dotted path."""
    options = dict(settings.INVENTORY if options is None else options)
    path = ALIASES.get(name, name)
    if "." not in path:
        raise ImproperlyConfigured(
            f"INVENTORY_BACKEND={name!r} is not a backend: use one of {', '.join(ALIASES)} or a dotted path"
        )
    try:
        backend_class = import_string(path)
    except ImportError as exc:
        raise ImproperlyConfigured(f"could not import inventory backend {path!r}: {exc}") from exc
    if not (isinstance(backend_class, type) and issubclass(backend_class, InventoryBackend)):
        raise ImproperlyConfigured(f"{path!r} is not an InventoryBackend subclass")
    return backend_class(options=options)


_lock = threading.Lock()
_backend: InventoryBackend | None = None


def get_backend() -> InventoryBackend:
    """The configured backend, built once per process (after gunicorn forks, on first use)."""
    global _backend
    if _backend is None:
        with _lock:
            if _backend is None:
                _backend = load_backend(settings.INVENTORY["BACKEND"])
    return _backend


def reset_backend(**kwargs) -> None:
    global _backend
    with _lock:
        if _backend is not None:
            _backend.close()
        _backend = None


def _on_setting_changed(*, setting: str, **kwargs) -> None:
    if setting == "INVENTORY":
        reset_backend()


setting_changed.connect(_on_setting_changed)
