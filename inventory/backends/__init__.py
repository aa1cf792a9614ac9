"""Purchase strategies, chosen by ``settings.INVENTORY["BACKEND"]``: an alias or a dotted path.

Resolved the way Django resolves cache backends: ``import_string`` on the path, and an import
failure re-raised as ``ImproperlyConfigured`` from its cause. Adding a strategy is one module
(a :class:`~inventory.backends.base.Strategy` subclass that describes itself) and one line in
:data:`STRATEGIES`; the commands, the checks and the tests loop over this registry.
"""

from __future__ import annotations

import threading
from typing import Iterable

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.core.signals import setting_changed
from django.utils.module_loading import import_string

from .base import Strategy
from .contract import Needed

STRATEGIES = {
    "db": "inventory.backends.db.RowLockStrategy",
    "optimistic": "inventory.backends.optimistic.OptimisticStrategy",
    "redis": "inventory.backends.redis.RedisLockStrategy",
    "redlock": "inventory.backends.redlock.RedlockStrategy",
    "etcd": "inventory.backends.etcd.EtcdLockStrategy",
    "atomic": "inventory.backends.atomic.AtomicUpdateStrategy",
    "redis-stock": "inventory.backends.redis_stock.RedisStockStrategy",
    "local": "inventory.backends.local.ProcessLockStrategy",
    "unsafe": "inventory.backends.unsafe.UnsafeStrategy",
}

__all__ = [
    "STRATEGIES",
    "get_backend",
    "load_backend",
    "services_needed",
    "strategy_class",
]


def strategy_class(name: str) -> type[Strategy]:
    """The class an alias (``db``, ``redis``, ...) or a dotted path names."""
    path = STRATEGIES.get(name, name)
    if "." not in path:
        raise ImproperlyConfigured(
            f"INVENTORY_BACKEND={name!r} is not a strategy: use one of {', '.join(STRATEGIES)} or a dotted path"
        )
    try:
        cls = import_string(path)
    except ImportError as exc:
        raise ImproperlyConfigured(f"could not import inventory strategy {path!r}: {exc}") from exc
    if not (isinstance(cls, type) and issubclass(cls, Strategy)):
        raise ImproperlyConfigured(f"{path!r} is not a Strategy subclass")
    return cls


def load_backend(name: str, *, config: dict | None = None) -> Strategy:
    """Build the strategy ``name`` with ``config`` (default: ``settings.INVENTORY``)."""
    return strategy_class(name)(config=dict(settings.INVENTORY if config is None else config))


_lock = threading.Lock()
_backend: Strategy | None = None


def get_backend() -> Strategy:
    """The configured strategy, built once per process (after gunicorn forks, on first use)."""
    global _backend
    if _backend is None:
        with _lock:
            if _backend is None:
                _backend = load_backend(settings.INVENTORY["BACKEND"])
    return _backend


def reset_backend() -> None:
    global _backend
    with _lock:
        if _backend is not None:
            _backend.close()
        _backend = None


def _on_setting_changed(*, setting: str, **kwargs) -> None:
    if setting == "INVENTORY":
        reset_backend()


setting_changed.connect(_on_setting_changed)


def services_needed(names: Iterable[str], *, config: dict | None = None) -> list[Needed]:
    """What the strategies ``names`` need running, each need once (``processes.services`` runs them)."""
    config = settings.INVENTORY if config is None else config
    return list(dict.fromkeys(need for name in names for need in strategy_class(name).services(config)))
