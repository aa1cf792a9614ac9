"""WSGI entry point, used by gunicorn (see gunicorn.conf.py)."""

import os

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "shop.settings")
import django  # noqa: E402

django.setup(set_prefix=False)

from shop.handlers import ShopWSGIHandler  # noqa: E402
from shop.static_lock import static_files  # noqa: E402

with static_files(writing=False):  # WhiteNoise scans STATIC_ROOT here: not while a collect rewrites it
    application = ShopWSGIHandler()  # Django's, with requests that leave no cycle (shop/handlers.py)

# Import the configured strategy's module now, not inside a shopper's first purchase: a worker is
# warm before it answers (and a strategy that cannot be imported stops the worker at start).
from django.conf import settings  # noqa: E402

from inventory.strategies import configured_name, strategy_class  # noqa: E402

strategy_class(configured_name(settings.INVENTORY))
