"""The probe ``manage.py purchasecost`` sends its requests with: a product of its own and a shopper.

The product (``cost-probe-<pid>``) has stock and a per-customer limit no run exhausts, so every
purchase is confirmed by the same path; it is deleted, with its orders and units, on the way out.
"""

from __future__ import annotations

import json
import os
import time
from decimal import Decimal

from django.db import connection
from django.test import Client

from inventory.models import Allocation, Order, Product

#: Far more than any run sells: every purchase takes the confirmed path.
PLENTY = 10**9
PROBE_PREFIX = "cost-probe-"
BLOCKS = 8


class Probe:
    def __init__(self) -> None:
        self.sku = f"{PROBE_PREFIX}{os.getpid()}"
        self.client = Client(HTTP_HOST="127.0.0.1", enforce_csrf_checks=True)
        self.body = json.dumps({"quantity": 1})

    def __enter__(self) -> "Probe":
        Product.objects.create(
            sku=self.sku,
            name="Cost probe",
            price=Decimal("1.00"),
            initial_stock=PLENTY,
            stock=PLENTY,
            per_customer_limit=PLENTY,
        )
        self.client.get("/api/session")
        self.csrf = self.client.cookies["csrftoken"].value
        return self

    def __exit__(self, *exc) -> None:
        # Plain DELETEs: the ORM's would load every order first, a cost that grows with the requests.
        product = Product.objects.filter(sku=self.sku).values_list("pk", flat=True).first()
        rows = ((Order, "product_id"), (Allocation, "product_id"), (Product, "id"))
        with connection.cursor() as cursor:
            for model, column in rows:
                cursor.execute(f"DELETE FROM {model._meta.db_table} WHERE {column} = %s", [product])

    def send(self, kind: str) -> None:
        """One request to ``/api/products/<sku>/<kind>``; anything but a confirmed answer is an error."""
        response = self.client.post(
            f"/api/products/{self.sku}/{kind}", self.body, content_type="application/json", HTTP_X_CSRFTOKEN=self.csrf
        )
        if response.status_code not in (200, 201):
            raise RuntimeError(f"{kind} answered {response.status_code}: {response.content[:200]!r}")

    def best_cpu_ms(self, kind: str, requests: int) -> float:
        """This process's CPU per request, the best of :data:`BLOCKS` blocks of ``requests`` / 8."""
        block = max(1, requests // BLOCKS)
        best = float("inf")
        for _ in range(BLOCKS):
            started = time.process_time()
            for _ in range(block):
                self.send(kind)
            best = min(best, (time.process_time() - started) / block * 1000)
        return best
