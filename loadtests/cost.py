"""The probe ``manage.py purchasecost`` sends its requests with: a product of its own and its shoppers.

The product (``cost-probe-<pid>``) has stock and a per-customer limit no run exhausts, so every
purchase is confirmed by the same path; it is deleted, with its orders and units, on the way out.
With more than one shopper (``purchasecost --batch N``) each is a thread with a session of its own,
sending one request after another as Locust's closed-loop shoppers do, so that a strategy with
``BATCH`` > 1 serves them in shared sections.
"""

from __future__ import annotations

import json
import os
import re
import threading
import time
from decimal import Decimal
from typing import Callable

from django.db import connection
from django.test import Client

from inventory.models import Allocation, Order, Product

#: Far more than any run sells: every purchase takes the confirmed path.
PLENTY = 10**9
PROBE_PREFIX = "cost-probe-"
BLOCKS = 8
#: Requests each shopper thread sends before the counted ones (``purchasecost --batch``).
WARM_UP_EACH = 4


#: The section size a purchase answer's ``Server-Timing`` names (absent from a floor answer).
BATCH_TIMING = re.compile(r"\bbatch;dur=(\d+)")


class Probe:
    def __init__(self, shoppers: int = 1) -> None:
        self.sku = f"{PROBE_PREFIX}{os.getpid()}"
        self.clients = [Client(HTTP_HOST="127.0.0.1", enforce_csrf_checks=True) for _ in range(shoppers)]
        self.body = json.dumps({"quantity": 1})
        #: With more than one shopper, the ``Server-Timing`` of every answer since the last
        #: :meth:`sections`, read only then: a probe of one shopper adds nothing to what is counted.
        self.timings: list[str] | None = [] if shoppers > 1 else None

    def __enter__(self) -> "Probe":
        Product.objects.create(
            sku=self.sku,
            name="Cost probe",
            price=Decimal("1.00"),
            initial_stock=PLENTY,
            stock=PLENTY,
            per_customer_limit=PLENTY,
        )
        for client in self.clients:
            client.get("/api/session")
        self.csrfs = [client.cookies["csrftoken"].value for client in self.clients]
        return self

    def __exit__(self, *exc) -> None:
        # Plain DELETEs: the ORM's would load every order first, a cost that grows with the requests.
        product = Product.objects.filter(sku=self.sku).values_list("pk", flat=True).first()
        rows = ((Order, "product_id"), (Allocation, "product_id"), (Product, "id"))
        with connection.cursor() as cursor:
            for model, column in rows:
                cursor.execute(f"DELETE FROM {model._meta.db_table} WHERE {column} = %s", [product])

    def send(self, kind: str, shopper: int = 0) -> None:
        """One request to ``/api/products/<sku>/<kind>``; anything but a confirmed answer is an error."""
        response = self.clients[shopper].post(
            f"/api/products/{self.sku}/{kind}",
            self.body,
            content_type="application/json",
            HTTP_X_CSRFTOKEN=self.csrfs[shopper],
        )
        if response.status_code not in (200, 201):
            raise RuntimeError(f"{kind} answered {response.status_code}: {response.content[:200]!r}")
        if self.timings is not None:
            self.timings.append(response.get("Server-Timing", ""))

    def sections(self) -> float:
        """The mean size of the sections the requests answered since the last call were served in, as
        a purchase saw it (a floor answer names none: 1); 1 for a probe of one shopper."""
        if self.timings is None:
            return 1.0
        timings, self.timings = self.timings, []
        sizes = [int(found.group(1)) if (found := BATCH_TIMING.search(header)) else 1 for header in timings]
        return sum(sizes) / len(sizes) if sizes else 0.0

    def each_shopper(self, kind: str, requests: int, *, warmed: Callable[[], None]) -> None:
        """Every shopper sends :data:`WARM_UP_EACH` requests, then ``requests`` more, one after another,
        on a thread of its own; ``warmed()`` runs on the caller's thread between the two rounds, once every
        shopper is done with the first and before any starts the second (the threads and their database
        connections live on, so neither counts as the counted requests' cost)."""
        between = threading.Barrier(len(self.clients) + 1)
        failures: list[BaseException] = []

        def shop(shopper: int) -> None:
            try:
                for _ in range(WARM_UP_EACH):
                    self.send(kind, shopper)
                between.wait()
                between.wait()
                for _ in range(requests):
                    self.send(kind, shopper)
            except BaseException as exc:  # noqa: BLE001 (raised again on the caller's thread)
                failures.append(exc)
                between.abort()
            finally:
                connection.close()

        threads = [threading.Thread(target=shop, args=(n,), name=f"shopper-{n}") for n in range(len(self.clients))]
        for thread in threads:
            thread.start()
        try:
            between.wait()
            warmed()
            between.wait()
        except threading.BrokenBarrierError:
            pass  # a shopper failed: raised below
        for thread in threads:
            thread.join()
        if failures:
            raise failures[0]

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
