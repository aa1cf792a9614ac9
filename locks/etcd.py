"""A lock on an etcd cluster by etcd's mutex recipe, with the lock key's create revision as fence.

No Django import. Talks to etcd's v3 JSON gateway through ``etcd3gw`` (one endpoint per client,
no timeout by default); :class:`EtcdClient` adds what the lock needs on top: every call bounded
by a per-call timeout, failover between the members, and this process's session lease::

    from locks.etcd import EtcdLock
    endpoints = ["http://127.0.0.1:7479", "http://127.0.0.1:7480", "http://127.0.0.1:7481"]
    with EtcdLock(endpoints, "flashsale:lock:SKU1", ttl_ms=10_000, timeout_ms=5_000) as lease:
        # UPDATE product SET stock = stock - 1, fence = :fence WHERE id = :id AND fence < :fence
        ...

The recipe (etcd's ``client/v3/concurrency``): the process holds one *session*, a lease of
``ttl_ms`` (rounded up to whole seconds) that a daemon thread keeps alive every ttl/3 while the
process lives; a forked child gets its own. To acquire, a caller puts ``<name>/<lease hex>/<random>``
bound to that lease, in a transaction that creates it only if absent and reads the key with the
lowest create revision under ``<name>/``. The owner is the key with the lowest create revision;
every other caller watches the deletion of the key just before its own (no polling), then looks
again, and owns the lock when no earlier key is left *and its own key still exists* (its lease
may have expired meanwhile: Jepsen's etcd 3.4.3 analysis). Release deletes the key only if its
create revision is still the grant's. A waiter that gives up deletes its key. (etcd's key is
``<name>/<lease hex>``; the random part lets the threads of one process, which share the session,
queue separately.)

What is guaranteed
------------------
* While the cluster has a majority: at most one live key is the lowest, grants follow create
  order, and the fence (the key's create revision) strictly increases from grant to grant of a
  name, because a later grant's key was created after every earlier owner's key.
* Every call waits at most ``call_timeout_ms`` for one member and moves to the next member on a
  connection error, a timeout or "unavailable" (no leader). With one member of three down, a grant
  still succeeds (after an election if it was the leader). With a majority down, ``acquire()``
  raises :class:`QuorumUnavailable` as soon as a majority of members refuse connections, and in
  any case within ``timeout_ms`` (plus one call timeout).
* Nothing is left behind. A waiter that gives up deletes its key (or, with no member answering,
  the keepalive thread deletes it as soon as one does). The acquire transaction is idempotent
  per key, so a put whose reply was lost is retried on another member without a second key; but
  such a put may still land *after* any delete and recreate the key, bound to a lease this
  process keeps alive, blocking the lock for good. So after a put with an unknown outcome the
  session is *retired*: no longer renewed, it expires within one TTL and takes any such key with
  it; holders under it keep their keys until then, and new acquisitions take a new session.
* A release by a holder whose key is gone raises :class:`NotOwned` and touches nothing else.

What is not guaranteed
----------------------
* Mutual exclusion under pauses. A holder frozen (GC, ``SIGSTOP``) longer than the session TTL
  loses its lease; etcd deletes its key and the next waiter owns the lock, while the frozen
  holder still believes it holds it. Only storage that checks the fence refuses its late write.
  The lease belongs to the process, so one stalled thread keeps its lock; a frozen process, or
  a holder under a retired session past that session's last TTL, does not.
* ``Lease.valid_until`` is the session's expiry as known at the grant (the send time of the last
  successful keepalive plus the TTL); the keepalive moves the real expiry on, so it is a lower
  bound while the process runs, not a promise after a pause.
* Hand-off waits for a watch event: a member that loses the cluster may never deliver it, so a
  waiter also looks again every second (and a watch on a dead member fails over at once).
"""

from __future__ import annotations

import base64
import contextlib
import math
import os
import time
from typing import Callable, Sequence, TypeVar

import etcd3gw
from etcd3gw import exceptions as gw_errors

from ._core import (
    ConsensusLockParts,
    Lease,
    acquire_claimed,
    check_arguments,
    new_claim,
    new_token,
    raise_unless_interrupted,
    unclaim,
)
from .errors import LockError, LockLost, NotAcquired, NotOwned, QuorumUnavailable
from .etcd_client import (
    DEFAULT_CALL_TIMEOUT_MS,
    UNAVAILABLE_PAUSE_S,
    WATCH_RECHECK_S,
    EtcdClient,
    LeaseGone,
    MembersUnavailable,
    Session,
    b64,
    kvs,
    prefix_end,
)

__all__ = ["DEFAULT_CALL_TIMEOUT_MS", "WATCH_RECHECK_S", "EtcdClient", "EtcdLock", "MembersUnavailable"]

T = TypeVar("T")


class EtcdLock(ConsensusLockParts):
    """One acquisition of the lock ``name`` on an etcd cluster; make one object per acquisition.

    ``client_or_endpoints``: an :class:`EtcdClient`, or member endpoints (then the process's
    shared client for them). ``ttl_ms``: the session lease's TTL (whole seconds, at least etcd's
    minimum); ``timeout_ms``: how long ``acquire()`` may wait for the lock. ``name`` may not contain
    ``/``: the keys are under ``<name>/``, so a lock ``shop/sku`` would block the lock ``shop``.
    """

    _lease: Lease | None = None
    _key: str | None = None
    _session: Session | None = None
    # A put of this acquisition had an unknown outcome (timeout, dropped connection, no leader).
    _doubtful = False
    _pid = 0  # the process the lease was granted to (a forked child has a copy, not the lock)

    def __init__(
        self,
        client_or_endpoints: EtcdClient | Sequence[str],
        name: str,
        *,
        ttl_ms: int = 10_000,
        timeout_ms: int = 5_000,
    ) -> None:
        ttl_ms = check_arguments(name, ttl_ms, timeout_ms)
        if "/" in name:
            # Its keys are under "<name>/": "shop/sku" held would block an unrelated lock "shop".
            raise ValueError(f"an etcd lock name may not contain '/' (its keys are under '<name>/'): {name!r}")
        if isinstance(client_or_endpoints, EtcdClient):
            self.client = client_or_endpoints
        else:
            self.client = EtcdClient.shared(client_or_endpoints)
        self._claim = new_claim()
        self.name = name
        self.prefix = f"{name}/"
        self.ttl_s = max(1, math.ceil(ttl_ms / 1000))
        self.timeout_ms = timeout_ms

    def _forget_held(self) -> None:
        self._lease = self._key = self._session = None

    def node_names(self) -> list[str]:
        return list(self.client.endpoints)

    def acquire(self) -> Lease:
        """Take the lock, waiting up to ``timeout_ms``; returns the :class:`Lease` (fence = create revision)."""
        self._forget_if_forked()
        return acquire_claimed(self, self._acquire)

    def _acquire(self) -> Lease:
        self._doubtful = False  # per acquisition: an earlier one's doubt retired its own session already
        deadline = time.monotonic() + self.timeout_ms / 1000.0
        key = None
        try:
            while True:
                session = self._retrying(lambda: self.client.session(self.ttl_s, deadline=deadline), deadline)
                self._session = session
                key = f"{self.prefix}{session.id:x}/{new_token()}"
                enqueued = False
                try:
                    revision, owner_revision = self._enqueue(session, key, deadline)
                    enqueued = True
                    if owner_revision != revision:
                        if time.monotonic() >= deadline:  # a single try (timeout_ms=0) need not look again
                            raise self._error(NotAcquired, f"not acquired within {self.timeout_ms} ms")
                        self._wait_turn(key, revision, deadline)
                except LeaseGone as gone:
                    session.lost = True  # its keys are gone with it: start over on a new session
                    key = None
                    if time.monotonic() >= deadline:
                        raise self._error(
                            NotAcquired, f"session lease lost; no time left of {self.timeout_ms} ms"
                        ) from gone
                    continue
                self._key, self._pid = key, os.getpid()
                self._lease = Lease(name=self.name, token=key, fence=revision, valid_until=session.expires_at)
                return self._lease
        except NotAcquired:
            if key is not None:
                self._abandon(key)
            raise
        except BaseException:
            # Interrupted (an exception from a signal handler, KeyboardInterrupt) or failed otherwise:
            # the key would own the lock once its turn came, on a session this process keeps alive.
            if key is not None:
                # Interrupted inside the put, its outcome is unknown: the session goes (_abandon).
                self._doubtful = self._doubtful or not enqueued
                with contextlib.suppress(Exception):  # best effort; the interruption is what is raised
                    self._abandon(key)
            raise

    def _retrying(self, op: Callable[[], T], deadline: float, *, failure: type[LockError] = QuorumUnavailable) -> T:
        """``op`` until a member answers; ``failure`` when a majority refuse connections or time runs out.

        Retrying rides out an election (members answer "unavailable" or time out meanwhile).
        """
        while True:
            try:
                return op()
            except gw_errors.Etcd3Exception as exc:
                raise self._error(failure, f"etcd refused the request: {exc.detail_text}") from exc
            except MembersUnavailable as exc:
                if exc.refused >= self.client.quorum:
                    raise self._error(
                        failure, f"{exc.refused} of {len(self.client.endpoints)} members refused connections ({exc})"
                    ) from exc
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise self._error(failure, f"no member answered within {self.timeout_ms} ms ({exc})") from exc
                time.sleep(min(remaining, UNAVAILABLE_PAUSE_S))

    def _txn(self, txn: dict, deadline: float, *, puts: bool = False) -> dict:
        doubts: list[str] = []

        def op(gw: etcd3gw.Etcd3Client) -> dict:
            try:
                return gw.transaction(txn)
            except gw_errors.Etcd3Exception as exc:
                if "lease not found" in (exc.detail_text or ""):
                    raise LeaseGone() from exc
                raise

        try:
            return self._retrying(lambda: self.client.call(op, deadline=deadline, doubts=doubts), deadline)
        finally:
            self._doubtful = self._doubtful or (puts and bool(doubts))

    def _enqueue(self, session: Session, key: str, deadline: float) -> tuple[int, int]:
        """Create ``key`` on the session's lease if absent; its create revision and the owner's."""
        owner = {
            "request_range": {
                "key": b64(self.prefix),
                "range_end": b64(prefix_end(self.prefix)),
                "sort_order": "ASCEND",
                "sort_target": "CREATE",
                "limit": 1,
                "keys_only": True,
            }
        }
        reply = self._txn(
            {
                "compare": [{"key": b64(key), "target": "CREATE", "result": "EQUAL", "create_revision": 0}],
                "success": [{"request_put": {"key": b64(key), "value": "", "lease": session.id}}, owner],
                # A retry after a lost reply finds the key the first attempt created.
                "failure": [{"request_range": {"key": b64(key)}}, owner],
            },
            deadline,
            puts=True,
        )
        responses = reply["responses"]
        if reply.get("succeeded"):
            revision = int(reply["header"]["revision"])
        else:
            mine = kvs(responses[0])
            if not mine:
                raise LeaseGone()
            revision = int(mine[0]["create_revision"])
        owners = kvs(responses[1])
        return revision, int(owners[0]["create_revision"]) if owners else revision

    def _wait_turn(self, key: str, revision: int, deadline: float) -> None:
        """Wait until no key under the prefix is older than ``key``; :class:`LeaseGone` if ``key`` vanished."""
        earlier = {
            "request_range": {
                "key": b64(self.prefix),
                "range_end": b64(prefix_end(self.prefix)),
                "sort_order": "DESCEND",
                "sort_target": "CREATE",
                "limit": 1,
                "keys_only": True,
                "max_create_revision": revision - 1,
            }
        }
        mine = {"request_range": {"key": b64(key), "keys_only": True}}
        while True:
            reply = self._txn({"compare": [], "success": [earlier, mine], "failure": []}, deadline)
            responses = reply["responses"]
            if not kvs(responses[1]):
                raise LeaseGone()
            before = kvs(responses[0])
            if not before:
                return
            wait_s = min(WATCH_RECHECK_S, deadline - time.monotonic())
            if wait_s <= 0:
                raise self._error(NotAcquired, f"not acquired within {self.timeout_ms} ms")
            predecessor = base64.b64decode(before[0]["key"]).decode()
            self.client.wait_deleted(predecessor, int(reply["header"]["revision"]), wait_s)
            if time.monotonic() >= deadline:
                raise self._error(NotAcquired, f"not acquired within {self.timeout_ms} ms")

    def _abandon(self, key: str) -> None:
        """Get rid of a key this acquisition may have created and no longer wants.

        When every put of it had a known outcome, delete it now (or, with no member answering,
        have the keepalive delete it). When one had not, a late put could recreate the key after
        any delete, so the session is retired and the key goes with its lease.
        """
        session = self._session
        if self._doubtful:
            session.retire(key)
            return
        try:
            deadline = time.monotonic() + self.client.call_timeout_s
            self.client.call(lambda gw: gw.delete(key.encode()), deadline=deadline)
        except (MembersUnavailable, gw_errors.Etcd3Exception):
            session.add_orphan(key)

    def release(self) -> None:
        """Delete the lock's key if it is still this grant's; raises :class:`NotOwned` if it is gone.

        Any thread may release it; a child forked while the lock was held may not (:class:`LockError`,
        nothing deleted): the lock is its parent's."""
        self._forget_if_forked()
        lease, key = self._lease, self._key
        if lease is None or key is None:
            raise self._error(NotOwned, "release of a lock this object does not hold")
        self._lease = self._key = None
        unclaim(self)
        txn = {
            "compare": [{"key": b64(key), "target": "CREATE", "result": "EQUAL", "create_revision": lease.fence}],
            "success": [{"request_delete_range": {"key": b64(key)}}],
            "failure": [],
        }
        # Bounded like an acquire: long enough to ride out an election, not to wait for a majority back.
        deadline = time.monotonic() + max(self.timeout_ms / 1000.0, self.client.call_timeout_s)
        doubts: list[str] = []
        try:
            reply = self._retrying(
                lambda: self.client.call(lambda gw: gw.transaction(txn), deadline=deadline, doubts=doubts),
                deadline,
                failure=LockError,
            )
        except LockError:
            self._session.add_orphan(key)  # deleted when a member answers, else it goes with the lease
            raise
        finally:
            if self._doubtful:
                self._session.retire(key)  # a late put of this grant's key could recreate it
        if not reply.get("succeeded"):
            # Only this grant's delete or the end of its lease removes its key. After an attempt
            # with an unknown outcome, a key gone while the lease is still alive was ours to delete.
            if doubts and not self._session.lost and time.monotonic() < self._session.expires_at:
                return
            raise self._error(NotOwned, "release refused: the session lease expired and the key is gone")

    def __enter__(self) -> Lease:
        return self.acquire()

    def __exit__(self, exc_type, exc, tb) -> None:
        try:
            self.release()
        except NotOwned as error:
            lost = self._error(LockLost, "the session lease expired while the block held the lock")
            lost.__cause__ = error
            raise_unless_interrupted(lost, exc)
