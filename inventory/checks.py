"""System checks for dangerous inventory configurations (run by ``manage.py check``)."""
from __future__ import annotations

from django.conf import settings
from django.core import checks

from .backends import ALIASES


@checks.register(checks.Tags.compatibility)
def check_inventory_backend(app_configs=None, **kwargs) -> list[checks.CheckMessage]:
    config = settings.INVENTORY
    backend = config["BACKEND"]
    messages: list[checks.CheckMessage] = []
    if backend not in ALIASES and "." not in backend:
        messages.append(checks.Error(
            f"INVENTORY_BACKEND={backend!r} is not a backend",
            hint=f"use one of {', '.join(ALIASES)} or a dotted path to an InventoryBackend subclass",
            id="inventory.E001",
        ))
    if backend == "unsafe":
        messages.append(checks.Warning(
            "INVENTORY_BACKEND=unsafe takes no lock and oversells under concurrency",
            hint="use db, redis or redlock; unsafe exists only to show that the audit catches oversell",
            id="inventory.W001",
        ))
    if backend == "redlock":
        nodes = len(config["REDLOCK_URLS"])
        if nodes < 3:
            messages.append(checks.Error(
                f"Redlock needs at least 3 independent nodes; REDLOCK_URLS names {nodes}",
                hint="with fewer than 3 a single node failure stops every purchase; use 5",
                id="inventory.E002",
            ))
        elif nodes % 2 == 0:
            messages.append(checks.Warning(
                f"Redlock with an even number of nodes ({nodes}) tolerates no more failures than {nodes - 1}",
                hint="use an odd number of nodes, such as 5",
                id="inventory.W002",
            ))
    if config["LOCK_TTL_MS"] <= 0 or config["ACQUIRE_TIMEOUT_MS"] < 0:
        messages.append(checks.Error(
            "LOCK_TTL_MS must be positive and ACQUIRE_TIMEOUT_MS 0 or more", id="inventory.E003",
        ))
    return messages
