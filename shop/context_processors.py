"""What every page of the storefront says about the sale as configured."""

from __future__ import annotations

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.http import HttpRequest

from inventory.strategies import configured_name, strategy_class


def sale_guard(request: HttpRequest) -> dict:
    """``control``: the configured strategy's name when it is a control (``unsafe``, ``local``: they
    oversell by design), else "". ``never_oversold``: the footer may say nothing is ever oversold,
    true only for a strategy that is no control; a configuration naming no strategy it can load
    (the system check reports it) claims nothing."""
    try:
        name = configured_name(settings.INVENTORY)
        control = strategy_class(name).control
    except ImproperlyConfigured:
        return {"control": "", "never_oversold": False}
    return {"control": name if control else "", "never_oversold": not control}
