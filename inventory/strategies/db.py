"""``db``: PostgreSQL row lock. ``SELECT ... FOR UPDATE`` serialises buyers of one product.

The guard is the row lock itself, taken by the section's read and held until commit, so the
write needs no check of its own and no token. What can still go wrong: every waiting buyer
holds a database connection while it waits, so a spike drains the connection pool.
"""

from __future__ import annotations

from .base import Strategy
from .contract import Grant, Shelf
from .statements import Statement, checked_update


class RowLockStrategy(Strategy):
    name = "db"
    guard_label = "SELECT … FOR UPDATE (row lock to commit)"
    check_label = "none needed (the row is locked)"

    for_update = True

    def stock_update(self, shelf: Shelf, *, quantity: int, grant: Grant) -> Statement:
        return checked_update(shelf, quantity=quantity, token=None, fenced=False)
