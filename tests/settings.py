"""Test settings: the project's settings, pointed at test-only Redis resources.

The suite's Redlock nodes listen on their own ports (7579+) so a running `make demo` and the
tests never share a node, and the single Redis lock uses database 9 of the local server.
``FLASHSALE_TEST_SLOT`` (tests/slots.py) moves all of it, for parallel checkouts.
"""

import os

from tests import slots

os.environ.setdefault("REDLOCK_BASE_PORT", str(slots.REDLOCK_BASE_PORT))
os.environ.setdefault(
    "FLASHSALE_RUN_DIR", os.path.join(os.path.dirname(os.path.dirname(__file__)), ".run", slots.RUN_DIR_NAME)
)
os.environ.setdefault("REDIS_URL", slots.SHOP_REDIS_URL)
os.environ.setdefault("ETCD_ENDPOINTS", ",".join(f"http://127.0.0.1:{slots.ETCD_BASE_PORT + i}" for i in range(3)))
os.environ.setdefault("ZOOKEEPER_HOSTS", ",".join(f"127.0.0.1:{slots.ZOOKEEPER_BASE_PORT + i}" for i in range(3)))
if slots.SLOT:
    os.environ.setdefault("DATABASE_URL", slots.DATABASE_URL)

from shop.settings import *  # noqa: E402,F401,F403
