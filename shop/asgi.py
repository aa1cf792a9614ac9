"""ASGI entry point, used by gunicorn's uvicorn workers (``SHOP_SERVER=asgi``, see gunicorn.conf.py)."""

import os

os.environ.setdefault("SHOP_SERVER", "asgi")
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "shop.settings")

from django.core.asgi import get_asgi_application  # noqa: E402

application = get_asgi_application()

# As in shop/wsgi.py: the configured strategy's module is imported before the first purchase.
from django.conf import settings  # noqa: E402

from inventory.strategies import configured_name, strategy_class  # noqa: E402

strategy_class(configured_name(settings.INVENTORY))
