"""A lock on an etcd cluster by etcd's mutex recipe, with the lock key's create revision as fence.

No Django import. Talks to etcd's v3 JSON gateway through ``etcd3gw`` (one endpoint per client,
no timeout by default); :class:`EtcdClient` adds what the lock needs on top: every call bounded
by a per-call timeout, failover between the members, and this process's session lease::

    from inventory.locks.etcd import EtcdLock
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

import atexit
import base64
import contextlib
import json
import math
import os
import threading
import time
from typing import Any, Callable, Sequence, TypeVar
from urllib.parse import urlsplit

import etcd3gw
import requests
from etcd3gw import exceptions as gw_errors
from requests.adapters import HTTPAdapter

from ._core import Lease, LockError, LockLost, NotAcquired, NotOwned, QuorumUnavailable, check_arguments, new_token

T = TypeVar("T")

DEFAULT_CALL_TIMEOUT_MS = 500
# Loopback and LAN members accept at once; a dead one refuses, a frozen one still accepts.
CONNECT_TIMEOUT_S = 0.1
# A waiter's watch lasts at most this long before it looks again (see "not guaranteed").
WATCH_RECHECK_S = 1.0
# After a sweep in which no member answered, pause this long before the next one (an election).
UNAVAILABLE_PAUSE_S = 0.05
# After a failed renewal the keepalive tries again this soon (an election), while the lease lasts.
KEEPALIVE_RETRY_S = 0.25


def _b64(text: str) -> str:
    """A key as the gateway wants it: base64 of its UTF-8 bytes (etcd3gw calls get the bytes, too)."""
    return base64.b64encode(text.encode()).decode()


def _prefix_end(prefix: str) -> str:
    """The first key after every key that starts with ``prefix`` (prefix ends in '/', so '/'+1)."""
    return prefix[:-1] + chr(ord(prefix[-1]) + 1)


class MembersUnavailable(Exception):
    """No member answered one sweep; ``refused`` counts members that refused the connection."""

    def __init__(self, failures: dict[str, str], refused: int) -> None:
        super().__init__("; ".join(f"{endpoint}: {why}" for endpoint, why in failures.items()))
        self.failures = failures
        self.refused = refused


class _LeaseGone(Exception):
    """The session's lease no longer exists in etcd (it expired)."""


class _Session:
    """This process's lease for one TTL, renewed every ttl/3 by a daemon thread.

    The thread also deletes the keys of acquisitions that could not clean up after themselves
    (``orphans``): at once when one is added, and before each renewal until it succeeds. A key
    that cannot be deleted goes with the lease, since renewals fail just as long.
    """

    def __init__(self, client: "EtcdClient", ttl_s: int, deadline: float) -> None:
        self.client = client
        sent = time.monotonic()
        reply = client.call(
            lambda gw: gw.post(gw.get_url("/lease/grant"), json={"TTL": ttl_s, "ID": 0}), deadline=deadline
        )
        self.id = int(reply["ID"])
        self.ttl_s = int(reply["TTL"])
        self.expires_at = sent + self.ttl_s
        self.lost = False
        self.retired = False
        self.orphans: set[str] = set()
        self._stopped = False
        self._nudged = threading.Event()
        self._thread = threading.Thread(target=self._keep_alive, name=f"etcd-session-{self.id:x}", daemon=True)
        self._thread.start()

    def alive(self) -> bool:
        """Usable for new acquisitions: neither lost, retired nor past its expiry."""
        return not self.lost and not self.retired and time.monotonic() < self.expires_at

    def _keep_alive(self) -> None:
        interval = self.ttl_s / 3.0
        while True:
            self._nudged.wait(interval)
            self._nudged.clear()
            if self._stopped:
                return
            try:
                for key in list(self.orphans):
                    self.client.call(lambda gw, key=key: gw.delete(key.encode()))
                    self.orphans.discard(key)
                if self.retired:
                    if time.monotonic() >= self.expires_at:
                        return
                    interval = min(self.ttl_s / 3.0, KEEPALIVE_RETRY_S)
                    continue
                sent = time.monotonic()
                ttl = self.client.call(lambda gw: etcd3gw.Lease(self.id, client=gw).refresh())
            except (MembersUnavailable, gw_errors.Etcd3Exception, KeyError):
                # KeyError: the keepalive stream answered {"error": ...} (no leader) instead of a result.
                if time.monotonic() < self.expires_at:
                    interval = min(self.ttl_s / 3.0, KEEPALIVE_RETRY_S)  # an election; try again soon
                    continue
                ttl = -1
            if ttl <= 0:
                self.lost = True
                return
            self.expires_at = sent + ttl
            interval = self.ttl_s / 3.0

    def add_orphan(self, key: str) -> None:
        self.orphans.add(key)
        self._nudged.set()

    def retire(self, key: str) -> None:
        """Stop renewing: ``key``'s put had an unknown outcome and may still land after any delete.

        The lease then takes such a key with it within one TTL; holders under this session keep
        their keys until then (far longer than a purchase), new acquisitions take a new session.
        """
        self.retired = True
        self.add_orphan(key)

    def freeze(self) -> None:
        self._stopped = True
        self._nudged.set()

    def close(self) -> None:
        """Stop renewing and revoke the lease, which deletes every key bound to it (best effort)."""
        self.freeze()
        self.lost = True
        with contextlib.suppress(MembersUnavailable, gw_errors.Etcd3Exception):  # else it expires by its TTL
            self.client.call(lambda gw: etcd3gw.Lease(self.id, client=gw).revoke())


class EtcdClient:
    """The cluster's member endpoints (``http://host:port``), each call bounded and failed over.

    Holds one HTTP connection pool per member and this process's session leases (one per TTL).
    Thread-safe; after ``fork()`` the child builds its own connections and sessions on first use.
    :meth:`shared` gives one client per endpoint list per process, closed (leases revoked) at exit.
    """

    _shared: dict[tuple[str, ...], "EtcdClient"] = {}
    _shared_lock = threading.Lock()

    def __init__(self, endpoints: Sequence[str], *, call_timeout_ms: float = DEFAULT_CALL_TIMEOUT_MS) -> None:
        if not endpoints:
            raise ValueError("an etcd client needs at least one endpoint")
        self._members = []
        for endpoint in endpoints:
            parts = urlsplit(endpoint)
            if parts.scheme not in ("http", "https") or not parts.hostname or parts.port is None:
                raise ValueError(f"etcd endpoint {endpoint!r} is not http(s)://host:port")
            self._members.append((parts.scheme, parts.hostname, parts.port))
        if call_timeout_ms <= 0:
            raise ValueError(f"call_timeout_ms must be positive, got {call_timeout_ms}")
        self.endpoints = [endpoint.rstrip("/") for endpoint in endpoints]
        self.quorum = len(self.endpoints) // 2 + 1
        self.call_timeout_s = call_timeout_ms / 1000.0
        self._lock = threading.Lock()
        self._pid = -1
        self._start_process()

    @classmethod
    def shared(cls, endpoints: Sequence[str]) -> "EtcdClient":
        key = tuple(endpoints)
        with cls._shared_lock:
            client = cls._shared.get(key)
            if client is None:
                client = cls._shared[key] = cls(endpoints)
                atexit.register(client.close)
            return client

    def _start_process(self) -> None:
        self._pid = os.getpid()
        self._http = []
        for _ in self._members:
            http = requests.Session()
            # Every thread of a gunicorn worker may hold a connection, a waiter one more for its watch.
            http.mount("http://", HTTPAdapter(pool_connections=1, pool_maxsize=64))
            http.mount("https://", HTTPAdapter(pool_connections=1, pool_maxsize=64))
            self._http.append(http)
        self._preferred = 0
        self._sessions: dict[int, _Session] = {}

    def _in_this_process(self) -> None:
        if self._pid != os.getpid():
            with self._lock:
                if self._pid != os.getpid():
                    # The parent's sockets and keepalive thread are not ours to use.
                    self._start_process()

    def gateway(self, index: int, timeout_s: float) -> etcd3gw.Etcd3Client:
        """An etcd3gw client for member ``index`` whose calls wait at most ``timeout_s``."""
        scheme, host, port = self._members[index]
        return etcd3gw.Etcd3Client(
            host=host,
            port=port,
            protocol=scheme,
            timeout=(CONNECT_TIMEOUT_S, timeout_s),
            api_path="/v3/",
            session=self._http[index],
        )

    def call(
        self, op: Callable[[etcd3gw.Etcd3Client], T], *, deadline: float | None = None, doubts: list[str] | None = None
    ) -> T:
        """Run ``op`` on one member, moving on to the next when it does not answer; one sweep at most.

        Each attempt waits at most the call timeout; the first is always made, the others only
        before ``deadline`` and never past it (``timeout_ms=0`` is one attempt). Raises
        :class:`MembersUnavailable` when no member answered; errors etcd itself returned
        (``etcd3gw.exceptions.Etcd3Exception`` other than "unavailable") pass through. Every member
        that failed other than by refusing the connection is appended to ``doubts``: the request
        may have reached it and may still take effect.
        """
        self._in_this_process()
        failures: dict[str, str] = {}
        refused = 0
        first = self._preferred
        for step in range(len(self._members)):
            index = (first + step) % len(self._members)
            timeout_s = self.call_timeout_s
            if deadline is not None and step > 0:
                timeout_s = min(timeout_s, deadline - time.monotonic())
                if timeout_s <= 0:
                    break
            try:
                result = op(self.gateway(index, timeout_s))
            except (
                gw_errors.ConnectionFailedError,
                gw_errors.ConnectionTimeoutError,
                requests.RequestException,
            ) as exc:
                cause = exc if isinstance(exc, requests.RequestException) else exc.__context__
                if isinstance(cause, requests.ConnectionError) and not isinstance(cause, requests.Timeout):
                    refused += 1
                elif doubts is not None:
                    doubts.append(self.endpoints[index])
                failures[self.endpoints[index]] = type(exc).__name__ + (
                    f" {exc.detail_text.strip()[:120]}" if getattr(exc, "detail_text", None) else ""
                )
                continue
            self._preferred = index
            return result
        raise MembersUnavailable(failures, refused)

    def session(self, ttl_s: int, *, deadline: float | None = None) -> _Session:
        """This process's live session lease of ``ttl_s`` seconds, granted now if it has none."""
        self._in_this_process()
        session = self._sessions.get(ttl_s)
        if session is not None and session.alive():
            return session
        with self._lock:
            session = self._sessions.get(ttl_s)
            if session is None or not session.alive():
                # A replaced session is not revoked: a retired one's holders keep their keys to the end.
                session = self._sessions[ttl_s] = _Session(self, ttl_s, deadline or time.monotonic() + 1.0)
            return session

    def wait_deleted(self, key: str, seen_at: int, wait_s: float) -> None:
        """Block on a watch until ``key`` (which existed at revision ``seen_at``) is deleted, or
        ``wait_s`` passes. Returns in either case (the caller looks again); a member that went
        away makes the next call start with another member.

        The watch starts at the current revision, not at ``seen_at + 1``: etcd serves a watch that
        starts in the past from a catch-up loop that runs every 100 ms, which would add up to
        that much to every hand-off while other waiters keep the revision moving. A delete
        between ``seen_at`` and the watch's start is caught by reading the key once the watch
        exists, if the revision moved meanwhile.
        """
        self._in_this_process()
        index = self._preferred
        gateway = self.gateway(index, wait_s)
        request = {"create_request": {"key": _b64(key), "filters": ["NOPUT"]}}
        # etcd3gw's own watch has no timeout and starts a thread pool per watch; a waiter only needs
        # to block on the stream's socket until the first event, bounded by the read timeout.
        deadline = time.monotonic() + wait_s
        try:
            with self._http[index].post(
                gateway.get_url("/watch"), json=request, stream=True, timeout=(CONNECT_TIMEOUT_S, wait_s)
            ) as response:
                if response.status_code != 200:
                    return
                for line in response.iter_lines(chunk_size=None):
                    result: dict[str, Any] = json.loads(line).get("result", {}) if line.strip() else {}
                    if result.get("events") or result.get("canceled") or time.monotonic() >= deadline:
                        return
                    if result.get("created") and int(result["header"]["revision"]) > seen_at:
                        probe = self.gateway(index, min(self.call_timeout_s, wait_s))
                        if not probe.get(key.encode(), keys_only=True):
                            return
        except (requests.Timeout, gw_errors.ConnectionTimeoutError):
            return
        except (requests.RequestException, gw_errors.Etcd3Exception, ValueError):
            self._preferred = (index + 1) % len(self.endpoints)

    def freeze_sessions(self) -> None:
        """Stop renewing this process's sessions without revoking them, as if the process froze.

        Their leases run out within one TTL and etcd deletes their keys; a holder keeps believing
        it holds its lock. For demonstrations and tests of the pause; the next acquire after the
        expiry starts a new session.
        """
        for session in list(self._sessions.values()):
            session.freeze()

    def close(self) -> None:
        """Revoke this process's sessions (their keys go at once) and close the connections."""
        if self._pid != os.getpid():
            return
        for session in list(self._sessions.values()):
            session.close()
        self._sessions.clear()
        for http in self._http:
            http.close()


def _kvs(response: dict) -> list[dict]:
    """The key-values of one range response inside a transaction response."""
    return response.get("response_range", {}).get("kvs", [])


class EtcdLock:
    """One acquisition of the lock ``name`` on an etcd cluster; make one object per acquisition.

    ``client_or_endpoints``: an :class:`EtcdClient`, or member endpoints (then the process's
    shared client for them). ``ttl_ms``: the session lease's TTL (whole seconds, at least etcd's
    minimum); ``timeout_ms``: how long ``acquire()`` may wait for the lock.
    """

    _lease: Lease | None = None
    _key: str | None = None
    _session: _Session | None = None
    # A put of this acquisition had an unknown outcome (timeout, dropped connection, no leader).
    _doubtful = False

    def __init__(
        self,
        client_or_endpoints: EtcdClient | Sequence[str],
        name: str,
        *,
        ttl_ms: int = 10_000,
        timeout_ms: int = 5_000,
    ) -> None:
        check_arguments(name, ttl_ms, timeout_ms)
        if isinstance(client_or_endpoints, EtcdClient):
            self.client = client_or_endpoints
        else:
            self.client = EtcdClient.shared(client_or_endpoints)
        self.name = name
        self.prefix = f"{name}/"
        self.ttl_s = max(1, math.ceil(ttl_ms / 1000))
        self.timeout_ms = timeout_ms

    @property
    def lease(self) -> Lease | None:
        return self._lease

    def node_names(self) -> list[str]:
        return list(self.client.endpoints)

    def _error(self, cls: type[LockError], message: str) -> LockError:
        return cls(message, name=self.name, nodes=self.node_names())

    def acquire(self) -> Lease:
        """Take the lock, waiting up to ``timeout_ms``; returns the :class:`Lease` (fence = create revision)."""
        if self._lease is not None:
            raise self._error(LockError, "this lock object already holds a lease; make one per acquisition")
        deadline = time.monotonic() + self.timeout_ms / 1000.0
        key = None
        try:
            while True:
                session = self._retrying(lambda: self.client.session(self.ttl_s, deadline=deadline), deadline)
                self._session = session
                key = f"{self.prefix}{session.id:x}/{new_token()}"
                try:
                    revision, owner_revision = self._enqueue(session, key, deadline)
                    if owner_revision != revision:
                        if time.monotonic() >= deadline:  # a single try (timeout_ms=0) need not look again
                            raise self._error(NotAcquired, f"not acquired within {self.timeout_ms} ms")
                        self._wait_turn(key, revision, deadline)
                except _LeaseGone as gone:
                    session.lost = True  # its keys are gone with it: start over on a new session
                    key = None
                    if time.monotonic() >= deadline:
                        raise self._error(
                            NotAcquired, f"session lease lost; no time left of {self.timeout_ms} ms"
                        ) from gone
                    continue
                self._key = key
                self._lease = Lease(name=self.name, token=key, fence=revision, valid_until=session.expires_at)
                return self._lease
        except NotAcquired:
            if key is not None:
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
                    raise _LeaseGone() from exc
                raise

        try:
            return self._retrying(lambda: self.client.call(op, deadline=deadline, doubts=doubts), deadline)
        finally:
            self._doubtful = self._doubtful or (puts and bool(doubts))

    def _enqueue(self, session: _Session, key: str, deadline: float) -> tuple[int, int]:
        """Create ``key`` on the session's lease if absent; its create revision and the owner's."""
        owner = {
            "request_range": {
                "key": _b64(self.prefix),
                "range_end": _b64(_prefix_end(self.prefix)),
                "sort_order": "ASCEND",
                "sort_target": "CREATE",
                "limit": 1,
                "keys_only": True,
            }
        }
        reply = self._txn(
            {
                "compare": [{"key": _b64(key), "target": "CREATE", "result": "EQUAL", "create_revision": 0}],
                "success": [{"request_put": {"key": _b64(key), "value": "", "lease": session.id}}, owner],
                # A retry after a lost reply finds the key the first attempt created.
                "failure": [{"request_range": {"key": _b64(key)}}, owner],
            },
            deadline,
            puts=True,
        )
        responses = reply["responses"]
        if reply.get("succeeded"):
            revision = int(reply["header"]["revision"])
        else:
            mine = _kvs(responses[0])
            if not mine:
                raise _LeaseGone()
            revision = int(mine[0]["create_revision"])
        owners = _kvs(responses[1])
        return revision, int(owners[0]["create_revision"]) if owners else revision

    def _wait_turn(self, key: str, revision: int, deadline: float) -> None:
        """Wait until no key under the prefix is older than ``key``; :class:`_LeaseGone` if ``key`` vanished."""
        earlier = {
            "request_range": {
                "key": _b64(self.prefix),
                "range_end": _b64(_prefix_end(self.prefix)),
                "sort_order": "DESCEND",
                "sort_target": "CREATE",
                "limit": 1,
                "keys_only": True,
                "max_create_revision": revision - 1,
            }
        }
        mine = {"request_range": {"key": _b64(key), "keys_only": True}}
        while True:
            reply = self._txn({"compare": [], "success": [earlier, mine], "failure": []}, deadline)
            responses = reply["responses"]
            if not _kvs(responses[1]):
                raise _LeaseGone()
            before = _kvs(responses[0])
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
        """Delete the lock's key if it is still this grant's; raises :class:`NotOwned` if it is gone."""
        lease, key = self._lease, self._key
        if lease is None or key is None:
            raise self._error(NotOwned, "release of a lock this object does not hold")
        self._lease = self._key = None
        txn = {
            "compare": [{"key": _b64(key), "target": "CREATE", "result": "EQUAL", "create_revision": lease.fence}],
            "success": [{"request_delete_range": {"key": _b64(key)}}],
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
            raise self._error(LockLost, "the session lease expired while the block held the lock") from error
