"""BurstRun.backend is called what it is: the strategy whose row it stored (issue 27). The burst
JSON calls a row's name ``row`` (a strategy, or the floor)."""

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [
        ("inventory", "0006_order_strategy"),
    ]

    operations = [
        migrations.RenameField(model_name="burstrun", old_name="backend", new_name="strategy"),
    ]
