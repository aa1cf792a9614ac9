"""The lock library's errors, one base class: what a caller of ``locks`` catches.

Every error carries the lock's key (``name``) and the nodes involved (``nodes``, ``host:port`` or
etcd endpoints), and says both in its message.
"""

from __future__ import annotations


class LockError(Exception):
    """A lock operation failed; ``name`` is the lock's key, ``nodes`` the Redis nodes involved."""

    def __init__(self, message: str, *, name: str, nodes: list[str]) -> None:
        super().__init__(f"{message} (lock {name!r} on {', '.join(nodes) or 'no nodes'})")
        self.name = name
        self.nodes = list(nodes)


class NotAcquired(LockError):
    """The wait ran out (``timeout_ms``) without a grant."""


class QuorumUnavailable(NotAcquired):
    """Too few nodes answered to ever form a majority, so waiting could not help."""


class NotOwned(LockError):
    """Release or extend by a holder whose token no longer owns the lock (expired or taken over)."""


class LockLost(LockError):
    """The lease ended while held: the watchdog could not renew, or the lease expired."""
