"""System checks for dangerous inventory configurations (run by ``manage.py check``).

Each strategy adds its own (:meth:`Strategy.checks`: controls warn, Redlock wants an odd node
count of at least 3); this module checks what is common to all of them.
"""

from __future__ import annotations

from django.conf import settings
from django.core import checks
from django.core.exceptions import ImproperlyConfigured

from .async_purchase import loop_refusal
from .strategies import STRATEGIES, configured_name, strategy_class


@checks.register(checks.Tags.compatibility)
def check_inventory_strategy(app_configs=None, **kwargs) -> list[checks.CheckMessage]:
    config = settings.INVENTORY
    messages: list[checks.CheckMessage] = []
    try:
        cls = strategy_class(configured_name(config))
    except ImproperlyConfigured as exc:
        messages.append(
            checks.Error(
                str(exc),
                hint=f"use one of {', '.join(STRATEGIES)} or a dotted path to a Strategy subclass",
                id="inventory.E001",
            )
        )
    else:
        messages.extend(cls.checks(config))
        messages.extend(_built(cls, config))
        if getattr(settings, "SHOP_SERVER", "wsgi") == "asgi" and loop_refusal(cls):
            messages.append(checks.Error(loop_refusal(cls), hint="run it with SHOP_SERVER=wsgi", id="inventory.E005"))
        unknown = sorted(set(config.get("OPTIONS") or {}) - known_options())
        if unknown:
            messages.append(
                checks.Warning(
                    f"INVENTORY['OPTIONS'] names option(s) no strategy reads: {', '.join(unknown)}",
                    hint=f"known options: {', '.join(sorted(known_options()))}",
                    id="inventory.W003",
                )
            )
    if config["LOCK_TTL_MS"] <= 0 or config["ACQUIRE_TIMEOUT_MS"] < 0 or config.get("ROW_LOCK_TIMEOUT_MS", 1) <= 0:
        messages.append(
            checks.Error(
                "LOCK_TTL_MS and ROW_LOCK_TIMEOUT_MS must be positive and ACQUIRE_TIMEOUT_MS 0 or more",
                id="inventory.E003",
            )
        )
    return messages


def _built(cls, config: dict) -> list[checks.CheckMessage]:
    """An error when the strategy cannot be built from ``config`` (a URL it cannot parse, an
    option out of range): every purchase would fail where it is first built. Building connects
    nothing (every client here connects on first use)."""
    try:
        strategy = cls(config=dict(config))
    except (ImproperlyConfigured, ValueError, TypeError) as exc:
        return [checks.Error(f"the {cls.name} strategy cannot be built: {exc}", id="inventory.E004")]
    strategy.close()
    return []


def known_options() -> set[str]:
    return {key for name in STRATEGIES for key in strategy_class(name).default_options}
