"""Keep what lives outside the database in step with a product's row.

Any save or delete of a :class:`~inventory.models.Product` (the admin's form, a restock, a
reset, a product created again under an old sku) raises the sold-out mark's generation and
drops the ``redis-stock`` counter once the transaction commits, so neither can answer from a
sale that no longer is; a rename does so for the old sku as well. Purchases move stock with
``UPDATE`` statements, which send no signal.
"""

from __future__ import annotations

import logging

import redis
from django.db import transaction
from django.db.models.signals import post_delete, post_save, pre_save
from django.dispatch import receiver

from . import soldout
from .models import Product
from .strategies.redis_stock import forget_sale

logger = logging.getLogger(__name__)


@receiver(pre_save, sender=Product, dispatch_uid="inventory.product_saving")
def product_saving(sender, instance: Product, **kwargs) -> None:
    """Note the sku the row had before this save: a rename ends the old sku's sale too."""
    before = Product.objects.filter(pk=instance.pk).values_list("sku", flat=True).first() if instance.pk else None
    instance._sku_before_save = before


@receiver(post_save, sender=Product, dispatch_uid="inventory.product_changed")
@receiver(post_delete, sender=Product, dispatch_uid="inventory.product_removed")
def product_changed(sender, instance: Product, signal, **kwargs) -> None:
    gone = signal is post_delete
    old = getattr(instance, "_sku_before_save", None)
    # The sku as saved, and the one it replaced: a process that kept the row under the old name
    # would go on selling the renamed product under it until its memory ran out.
    changed = {instance.sku: gone, **({old: True} if old and old != instance.sku else {})}

    def after_commit() -> None:
        for sku, units_too in changed.items():
            soldout.sale_changed(sku)
            try:
                forget_sale(soldout.client(), sku, units_too=units_too)
            except redis.RedisError:
                logger.exception("could not drop the redis-stock counter of %s; run manage.py reconcile", sku)

    transaction.on_commit(after_commit)
