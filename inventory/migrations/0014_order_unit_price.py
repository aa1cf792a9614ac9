"""Each order keeps its unit price: what one unit cost when it was bought.

Orders had no price, and every page showing an order's total multiplied by the product's price as it
is now, so a price staff changed after a purchase rewrote what the shopper was charged. Orders from
before this migration never stored the price they were bought at: they are filled with their
product's *current* price (the best that is known), then the column is made NOT NULL.

The purchase path names the price its own read saw in every order it writes, and so do the hot-row
benchmark's SQL (loadtests/hotrow.py) and scripts/async_routes.py. A writer that names none (the
narrated demos' and tests' ORM orders) gets its product's price at the insert from a trigger, which runs only for such a row
(``WHEN (NEW.unit_price IS NULL)``: the purchase path's inserts call no function). Reversed, the
trigger and the column are dropped.
"""

import django.core.validators

from django.db import migrations, models

FILL_FROM_PRODUCTS = """
UPDATE inventory_order o SET unit_price = p.price FROM inventory_product p WHERE p.id = o.product_id
"""
PRICE_WHEN_UNNAMED = """
CREATE FUNCTION inventory_order_unit_price() RETURNS trigger AS $$
BEGIN
  SELECT price INTO NEW.unit_price FROM inventory_product WHERE id = NEW.product_id;
  RETURN NEW;
END $$ LANGUAGE plpgsql;
CREATE TRIGGER inventory_order_unit_price BEFORE INSERT ON inventory_order
FOR EACH ROW WHEN (NEW.unit_price IS NULL) EXECUTE FUNCTION inventory_order_unit_price();
"""
NO_PRICE_WHEN_UNNAMED = """
DROP TRIGGER inventory_order_unit_price ON inventory_order; DROP FUNCTION inventory_order_unit_price();
"""


class Migration(migrations.Migration):

    dependencies = [
        ('inventory', '0013_session_generation'),
    ]

    operations = [
        migrations.AddField(
            model_name='order',
            name='unit_price',
            field=models.DecimalField(decimal_places=2, max_digits=10, null=True),
        ),
        migrations.RunSQL(FILL_FROM_PRODUCTS, reverse_sql=migrations.RunSQL.noop),
        migrations.AlterField(
            model_name='order',
            name='unit_price',
            field=models.DecimalField(
                decimal_places=2,
                help_text='The price of one unit when it was bought.',
                max_digits=10,
                validators=[django.core.validators.MinValueValidator(0)],
            ),
        ),
        migrations.RunSQL(PRICE_WHEN_UNNAMED, reverse_sql=NO_PRICE_WHEN_UNNAMED),
        migrations.AddConstraint(
            model_name='order',
            constraint=models.CheckConstraint(
                condition=models.Q(('unit_price__gte', 0)), name='order_unit_price_not_negative'
            ),
        ),
    ]
