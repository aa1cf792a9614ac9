"""Order.backend is called what it is: the strategy that guarded the purchase (issue 27)."""

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [
        ("inventory", "0005_product_listed"),
    ]

    operations = [
        migrations.RenameField(model_name="order", old_name="backend", new_name="strategy"),
    ]
