"""The Lua scripts the Redis locks run and the keys they run on, for tools that send them raw.

``lockbench``'s fenced floors send exactly these, with no lock object around them, to tell the
scripts' cost on the server from the library's in Python.
"""

from ._core import ACQUIRE, HANDOFF_WINDOW_MS, RELEASE, SIGNAL_LIFETIME_MS, acquire_keys, release_keys

__all__ = ["ACQUIRE", "HANDOFF_WINDOW_MS", "RELEASE", "SIGNAL_LIFETIME_MS", "acquire_keys", "release_keys"]
