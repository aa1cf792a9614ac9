"""Purchase strategies, chosen by ``settings.INVENTORY["STRATEGY"]``: an alias or a dotted path.

``INVENTORY["BACKEND"]`` is read as the older name of ``STRATEGY`` (a settings file written before
the rename keeps working); giving both with different values is refused.

Resolved the way Django resolves cache backends: ``import_string`` on the path, and an import
failure re-raised as ``ImproperlyConfigured`` from its cause. Adding a strategy is one module
(a :class:`~inventory.strategies.base.Strategy` subclass that describes itself) and one line in
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
    "db": "inventory.strategies.db.RowLockStrategy",
    "optimistic": "inventory.strategies.optimistic.OptimisticStrategy",
    "redis": "inventory.strategies.redis.RedisLockStrategy",
    "redlock": "inventory.strategies.redlock.RedlockStrategy",
    "etcd": "inventory.strategies.etcd.EtcdLockStrategy",
    "zookeeper": "inventory.strategies.zookeeper.ZooKeeperLockStrategy",
    "atomic": "inventory.strategies.atomic.AtomicUpdateStrategy",
    "redis-stock": "inventory.strategies.redis_stock.RedisStockStrategy",
    "local": "inventory.strategies.local.ProcessLockStrategy",
    "unsafe": "inventory.strategies.unsafe.UnsafeStrategy",
}

__all__ = [
    "STRATEGIES",
    "configured_name",
    "get_strategy",
    "load_strategy",
    "needs_of",
    "strategy_class",
]


def strategy_class(name: str) -> type[Strategy]:
    """The class an alias (``db``, ``redis``, ...) or a dotted path names."""
    path = STRATEGIES.get(name, name)
    if "." not in path:
        raise ImproperlyConfigured(
            f"INVENTORY_STRATEGY={name!r} is not a strategy: use one of {', '.join(STRATEGIES)} or a dotted path"
        )
    try:
        cls = import_string(path)
    except ImportError as exc:
        raise ImproperlyConfigured(f"could not import inventory strategy {path!r}: {exc}") from exc
    if not (isinstance(cls, type) and issubclass(cls, Strategy)):
        raise ImproperlyConfigured(f"{path!r} is not a Strategy subclass")
    return cls


def configured_name(config: dict) -> str:
    """The strategy ``config`` names: its ``STRATEGY``, or its ``BACKEND`` (the older name), or db."""
    named = {key: config[key] for key in ("STRATEGY", "BACKEND") if config.get(key)}
    if len(set(named.values())) > 1:
        raise ImproperlyConfigured(
            f"INVENTORY names two strategies, STRATEGY={named['STRATEGY']!r} and BACKEND={named['BACKEND']!r} "
            "(its older name): keep STRATEGY"
        )
    return next(iter(named.values()), "db")


def load_strategy(name: str, *, config: dict | None = None) -> Strategy:
    """Build the strategy ``name`` with ``config`` (default: ``settings.INVENTORY``)."""
    return strategy_class(name)(config=dict(settings.INVENTORY if config is None else config))


_lock = threading.Lock()
_strategy: Strategy | None = None


def get_strategy() -> Strategy:
    """The configured strategy, built once per process (after gunicorn forks, on first use)."""
    global _strategy
    if _strategy is None:
        with _lock:
            if _strategy is None:
                _strategy = load_strategy(configured_name(settings.INVENTORY))
    return _strategy


def reset_strategy() -> None:
    global _strategy
    with _lock:
        if _strategy is not None:
            _strategy.close()
        _strategy = None


def _on_setting_changed(*, setting: str, **kwargs) -> None:
    if setting == "INVENTORY":
        reset_strategy()


setting_changed.connect(_on_setting_changed)


def needs_of(names: Iterable[str], *, config: dict | None = None) -> list[Needed]:
    """What the strategies ``names`` need running, each need once (``processes.needs`` runs them)."""
    config = settings.INVENTORY if config is None else config
    return list(dict.fromkeys(need for name in names for need in strategy_class(name).needs(config)))
