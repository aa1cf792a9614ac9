"""Keep what lives outside the database in step with a product's row.

Any save or delete of a :class:`~inventory.models.Product` (the admin's form, a restock, a
reset, a product created again under an old sku) raises the sold-out mark's generation and
drops the ``redis-stock`` counter once the transaction commits, so neither can answer from a
sale that no longer is. Purchases move stock with ``UPDATE`` statements, which send no signal.
"""

from __future__ import annotations

import logging

import redis
from django.db import transaction
from django.db.models.signals import post_delete, post_save
from django.dispatch import receiver

from . import soldout
from .models import Product
from .strategies.redis_stock import forget_sale

logger = logging.getLogger(__name__)


@receiver(post_save, sender=Product, dispatch_uid="inventory.product_changed")
@receiver(post_delete, sender=Product, dispatch_uid="inventory.product_removed")
def product_changed(sender, instance: Product, signal, **kwargs) -> None:
    sku, gone = instance.sku, signal is post_delete

    def after_commit() -> None:
        soldout.sale_changed(sku)
        try:
            forget_sale(soldout.client(), sku, units_too=gone)
        except redis.RedisError:
            logger.exception("could not drop the redis-stock counter of %s; run manage.py reconcile", sku)

    transaction.on_commit(after_commit)
