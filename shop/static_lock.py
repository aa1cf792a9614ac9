"""One lock on ``STATIC_ROOT`` per checkout: a collect of static files takes it alone, a starting
server shares it while its static-file middleware (WhiteNoise, ServeStatic) scans the folder.

Two collects at once fail on hashed files the other's post-processing replaced, and a server that
starts during a collect fails the same way on a file listed then gone (both seen in make test, where
a burst row's pods start beside the browser tests' collect in the other xdist worker).
"""

from __future__ import annotations

import contextlib
import fcntl
from collections.abc import Iterator
from pathlib import Path

from django.conf import settings


def lock_path() -> Path:
    """The lock file at the checkout's top, beside the ``staticfiles/`` that collects and servers
    share (git ignores it); not derived from ``STATIC_ROOT``, which a test points elsewhere."""
    return Path(settings.BASE_DIR) / "staticfiles.lock"


@contextlib.contextmanager
def static_files(*, writing: bool) -> Iterator[None]:
    """Hold the lock: alone when ``writing`` (a collect), else shared with other readers."""
    with open(lock_path(), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX if writing else fcntl.LOCK_SH)
        yield  # released when the file closes
