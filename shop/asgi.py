"""ASGI entry point, used by gunicorn's uvicorn workers (``SHOP_SERVER=asgi``, see gunicorn.conf.py)."""

import os

os.environ.setdefault("SHOP_SERVER", "asgi")
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "shop.settings")

import django  # noqa: E402

django.setup(set_prefix=False)

from shop.body_limit import BodyLimit  # noqa: E402
from shop.handlers import ShopASGIHandler  # noqa: E402
from shop.static_lock import static_files  # noqa: E402

with static_files(writing=False):  # ServeStatic scans STATIC_ROOT here: not while a collect rewrites it
    django_application = ShopASGIHandler()  # Django's, with requests that leave no cycle (shop/handlers.py)

# As in shop/wsgi.py: the configured strategy's module is imported before the first purchase; and a
# strategy whose guard would block the event loop stops the pod at start, saying why.
from django.conf import settings  # noqa: E402
from django.core.exceptions import ImproperlyConfigured  # noqa: E402

from inventory.async_purchase import aclose_loop, loop_refusal  # noqa: E402
from inventory.strategies import configured_name, strategy_class  # noqa: E402
from shop.lifespan import Lifespan  # noqa: E402

# A body past the cap is refused before Django's handler reads it all (shop/body_limit.py); the
# worker's shutdown closes the connections its loop's purchases opened (shop/lifespan.py).
application = Lifespan(
    BodyLimit(django_application, max_bytes=settings.REQUEST_BODY_MAX_BYTES), on_shutdown=aclose_loop
)

_refusal = loop_refusal(strategy_class(configured_name(settings.INVENTORY)))
if _refusal:
    raise ImproperlyConfigured(_refusal)
