"""Test settings: the project's settings, pointed at test-only Redis resources.

The suite's Redlock nodes listen on their own ports (7579+) so a running `make demo` and the
tests never share a node, and the single Redis lock uses database 9 of the local server.
``FLASHSALE_TEST_SLOT`` (tests/slots.py) moves all of it, for parallel checkouts and for the
pytest-xdist workers of ``make test``.

A variable already in the environment wins (to point the suite elsewhere by hand), except one
that these settings put there themselves in another slot: pytest-xdist's controller loads these
settings (slot 0) before it starts the workers, which inherit its environment.
"""

import os

from tests import slots

#: Names of the variables these settings set themselves, and the slot they set them for.
_OURS = "FLASHSALE_TEST_ENV"


def _slot_env() -> dict[str, str]:
    env = {
        "REDLOCK_BASE_PORT": str(slots.REDLOCK_BASE_PORT),
        "FLASHSALE_RUN_DIR": os.path.join(os.path.dirname(os.path.dirname(__file__)), ".run", slots.RUN_DIR_NAME),
        "REDIS_URL": slots.SHOP_REDIS_URL,
        "ETCD_ENDPOINTS": ",".join(f"http://127.0.0.1:{slots.ETCD_BASE_PORT + i}" for i in range(3)),
        "ZOOKEEPER_HOSTS": ",".join(f"127.0.0.1:{slots.ZOOKEEPER_BASE_PORT + i}" for i in range(3)),
    }
    if slots.SLOT:
        env["DATABASE_URL"] = slots.DATABASE_URL
    return env


_slot, _, _names = os.environ.get(_OURS, "").partition(":")
_set_by_us = set(_names.split(",")) if _slot and _slot != str(slots.SLOT) else set()
if _set_by_us and "DATABASE_URL" in _set_by_us and not slots.SLOT:
    os.environ.pop("DATABASE_URL")
_mine = []
for _name, _value in _slot_env().items():
    if _name not in os.environ or _name in _set_by_us:
        os.environ[_name] = _value
        _mine.append(_name)
os.environ[_OURS] = f"{slots.SLOT}:{','.join(_mine)}"

from shop.settings import *  # noqa: E402,F401,F403

# Staff users are made in many tests: Django's default hasher (PBKDF2, a million iterations) costs
# about 0.4 s per password on this machine. The tests check who may log in, not the hash's strength.
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
