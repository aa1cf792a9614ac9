"""The bounds of a purchase request, with no Django import: the shop's services check them, and the
load test's locustfile (a Locust process, no Django) refuses a ``--quantity`` past them at start."""

from __future__ import annotations

#: The largest quantity any request may name; per-product limits are usually lower.
MAX_QUANTITY = 100
