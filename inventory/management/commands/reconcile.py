"""``manage.py reconcile``: put the ``redis-stock`` counters back in step with the database.

The database is the record. For every product whose sale is loaded in Redis, the counter is
compared with the database's stock, each customer's units with their allocation, and the limit and
sale window the script decides with against the product's; any drift
is reported and repaired by reloading the sale from the database (atomically, in one script).
Run it when no sale is in flight: a purchase between its Redis decrement and its database
commit looks like drift of one unit, and reconciling then refuses that purchase's database
write (the database's check), never oversells.
"""

from __future__ import annotations

from datetime import UTC, datetime

import redis
from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from inventory.models import Allocation, Product
from inventory.strategies.redis_stock import epoch_ms, load_sale, sale_generation, sale_key, units_key


def _window(starts_ms: str, ends_ms: str) -> str:
    """A sale window as the script holds it (epoch ms, '' for open), in UTC for a reader."""

    def moment(ms: str) -> str:
        return datetime.fromtimestamp(int(ms) / 1000, tz=UTC).isoformat(timespec="milliseconds") if ms else "open"

    return f"{moment(starts_ms)} to {moment(ends_ms)}"


class Command(BaseCommand):
    help = "Compare the redis-stock counters with the database and repair any drift from the database."

    def add_arguments(self, parser):
        parser.add_argument("--sku", default=None, help="only this product (default: every product loaded in Redis)")
        parser.add_argument("--dry-run", action="store_true", help="report drift, change nothing")

    def handle(self, *args, sku: str | None, dry_run: bool, **options):
        products = Product.objects.all()
        if sku is not None and not sku.strip():
            # An empty --sku (a script's --sku "$SKU" with SKU unset) is not "every product": that repairs them all.
            raise CommandError("--sku is empty: name a product's sku, or leave --sku out to check them all")
        if sku is not None:
            products = products.filter(sku=sku)
            if not products.exists():
                raise CommandError(f"no product with sku {sku!r}: see manage.py seed or the admin")
        url = settings.INVENTORY["REDIS_URL"]
        try:
            with redis.Redis.from_url(url, socket_timeout=2, socket_connect_timeout=2) as client:
                checked, drifted = self.reconcile(client, products, dry_run=dry_run)
        except redis.RedisError as exc:
            raise CommandError(f"Redis at {url} does not answer ({exc}): start it, then run reconcile again") from exc
        verb = "would repair" if dry_run else "repaired"
        self.stdout.write(f"checked {checked} sale(s) loaded in Redis; {verb} {drifted}; no drift in the rest")

    def reconcile(self, client: redis.Redis, products, *, dry_run: bool) -> tuple[int, int]:
        checked = drifted = 0
        for product in products:
            loaded = client.hmget(sale_key(product.sku), "stock", "limit", "starts_ms", "ends_ms")
            if loaded[0] is None:
                continue  # not loaded: the next purchase loads it from the database
            checked += 1
            drift = self.drift(client, product, int(loaded[0]))
            drift += self.terms_drift(product, *(value.decode() if value is not None else "" for value in loaded[1:]))
            if not drift:
                continue
            drifted += 1
            for line in drift:
                self.stdout.write(f"{product.sku}: {line}")
            if not dry_run:
                # The row read again after the sale's generation: a restock that committed since the
                # read above is not undone (the load refuses a row older than the generation, and then
                # the restock's own drop of the counter has the next purchase load it).
                generation = sale_generation(client, product.sku)
                load_sale(client, Product.objects.get(pk=product.pk), generation=generation, replace=True)
        return checked, drifted

    @staticmethod
    def terms_drift(product: Product, limit: str, starts_ms: str, ends_ms: str) -> list[str]:
        """The sale's terms the script decides with (limit, window) where they are not the database's:
        left behind when a product's save could not drop the counter (Redis down at its commit)."""
        lines = []
        if limit != str(product.per_customer_limit):
            lines.append(f"per-customer limit {limit or 'none'} in Redis, {product.per_customer_limit} in the database")
        window = (epoch_ms(product.sale_starts_at), epoch_ms(product.sale_ends_at))
        if (starts_ms, ends_ms) != window:
            lines.append(f"sale window {_window(starts_ms, ends_ms)} in Redis, {_window(*window)} in the database")
        return lines

    @staticmethod
    def drift(client: redis.Redis, product: Product, counter: int) -> list[str]:
        lines = []
        if counter != product.stock:
            lines.append(f"counter {counter}, database stock {product.stock} (drift {counter - product.stock:+d})")
        in_redis = {k.decode(): int(v) for k, v in client.hgetall(units_key(product.sku)).items()}
        in_db = dict(Allocation.objects.filter(product=product).values_list("customer", "units"))
        for customer in sorted(set(in_redis) | set(in_db)):
            if in_redis.get(customer, 0) != in_db.get(customer, 0):
                lines.append(
                    f"customer {customer}: {in_redis.get(customer, 0)} unit(s) in Redis, "
                    f"{in_db.get(customer, 0)} in the database"
                )
        return lines
