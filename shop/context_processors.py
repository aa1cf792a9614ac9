"""What every page of the storefront says about the sale as configured."""

from __future__ import annotations

from django.core.exceptions import ImproperlyConfigured
from django.http import HttpRequest

from inventory.strategies import get_strategy


def sale_guard(request: HttpRequest) -> dict:
    """What the footer may claim of the configured strategy.

    ``control``: its name when it is a control (``unsafe``, ``local``: they oversell by design).
    ``unfenced``: its name when it is a lock strategy run without its storage check (``FENCED``
    off: right only while the lock holds; a paused holder or a failover oversells). Else
    ``never_oversold``: nothing is ever oversold. A configuration naming no strategy it can build
    (the system check reports it) claims nothing. The strategy is the process's own, built once.
    """
    try:
        strategy = get_strategy()
    except ImproperlyConfigured:
        return {"control": "", "unfenced": "", "never_oversold": False}
    control = strategy.name if strategy.control else ""
    unfenced = strategy.name if not control and getattr(strategy, "fenced", True) is False else ""
    return {"control": control, "unfenced": unfenced, "never_oversold": not (control or unfenced)}
