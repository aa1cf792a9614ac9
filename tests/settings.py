"""Test settings: the project's settings, pointed at test-only Redis resources.

The suite's Redlock nodes listen on their own ports (7579+) so a running `make demo` and the
tests never share a node, and the single Redis lock uses database 9 of the local server.
"""
import os

os.environ.setdefault("REDLOCK_BASE_PORT", "7579")
os.environ.setdefault("REDIS_URL", "redis://127.0.0.1:6379/9")

from shop.settings import *  # noqa: E402,F401,F403
