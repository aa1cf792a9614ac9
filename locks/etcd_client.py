"""The etcd client the lock runs on: bounded calls with failover, and this process's session lease.

No Django import. :class:`EtcdClient` wraps ``etcd3gw`` (one endpoint per client, no timeout by
default) with a per-call timeout, failover between the members and one :class:`Session` per
process; :mod:`locks.etcd` builds the mutex recipe on it and states what is guaranteed.
"""

from __future__ import annotations

import atexit
import base64
import contextlib
import json
import os
import threading
import time
from typing import Any, Callable, Sequence, TypeVar
from urllib.parse import urlsplit

import etcd3gw
import requests
from etcd3gw import exceptions as gw_errors
from requests.adapters import HTTPAdapter

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


def b64(text: str) -> str:
    """A key as the gateway wants it: base64 of its UTF-8 bytes (etcd3gw calls get the bytes, too)."""
    return base64.b64encode(text.encode()).decode()


def prefix_end(prefix: str) -> str:
    """The first key after every key that starts with ``prefix`` (prefix ends in '/', so '/'+1)."""
    return prefix[:-1] + chr(ord(prefix[-1]) + 1)


class MembersUnavailable(Exception):
    """No member answered one sweep; ``refused`` counts members that refused the connection."""

    def __init__(self, failures: dict[str, str], refused: int) -> None:
        super().__init__("; ".join(f"{endpoint}: {why}" for endpoint, why in failures.items()))
        self.failures = failures
        self.refused = refused


class LeaseGone(Exception):
    """The session's lease no longer exists in etcd (it expired)."""


class Session:
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
        self._sessions: dict[int, Session] = {}

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

    def session(self, ttl_s: int, *, deadline: float | None = None) -> Session:
        """This process's live session lease of ``ttl_s`` seconds, granted now if it has none."""
        self._in_this_process()
        session = self._sessions.get(ttl_s)
        if session is not None and session.alive():
            return session
        with self._lock:
            session = self._sessions.get(ttl_s)
            if session is None or not session.alive():
                # A replaced session is not revoked: a retired one's holders keep their keys to the end.
                session = self._sessions[ttl_s] = Session(self, ttl_s, deadline or time.monotonic() + 1.0)
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
        request = {"create_request": {"key": b64(key), "filters": ["NOPUT"]}}
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


def kvs(response: dict) -> list[dict]:
    """The key-values of one range response inside a transaction response."""
    return response.get("response_range", {}).get("kvs", [])
