"""A lock on a ZooKeeper ensemble by ZooKeeper's lock recipe, with the owning znode's sequence as fence.

No Django import. Talks to ZooKeeper through kazoo's client; the recipe is written here, on
kazoo's asynchronous calls, so that every call is bounded::

    from locks.zookeeper import ZooKeeperClient, ZooKeeperLock
    client = ZooKeeperClient(["127.0.0.1:7920", "127.0.0.1:7921", "127.0.0.1:7922"], session_ms=10_000)
    with ZooKeeperLock(client, "flashsale:lock:SKU1", timeout_ms=5_000) as lease:
        # UPDATE product SET stock = stock - 1, fence = :fence WHERE id = :id AND fence < :fence
        ...

The recipe (ZooKeeper's "Locks" recipe): every contender creates an ephemeral, sequential znode
``<uuid>__lock__<sequence>`` under the lock's path (``/flashsale/locks/<name>``), bound to the
process's *session*. The lowest sequence owns the lock; every other contender watches only the
znode just before its own (no herd), and looks again when it goes. The naming is kazoo's, so a
kazoo ``Lock`` on the same path and this one exclude each other.

Why not kazoo's ``Lock`` itself: its calls are synchronous and unbounded. While the client is
reconnecting (a majority down), a request waits in kazoo's queue until a member with a quorum
answers, so ``acquire(timeout=2)`` was measured to hang for as long as the majority stayed down;
the shop must answer busy within ``ACQUIRE_TIMEOUT_MS``. Here every call waits at most the
time left, and a create whose outcome is unknown (it may still be sent later, and its znode
would then block the lock as long as this session lives) retires the session it was sent on; the
``<uuid>`` is new for each try, so a try's znodes are known by name: the lowest is kept, the
others (a retried create that landed twice) deleted.

The fence: the sequence ZooKeeper appends, from the parent's child version, plus one (a first
grant's sequence is 0, and rows start at fence 0). It is per lock path,
32-bit signed (2^31 grants per SKU before it wraps negative, which the storage would refuse),
grows across elections and restarts with the data, and is known from the create's reply (the
alternative, the znode's ``czxid``, is global and 64-bit but needs one more call). It starts over
only if the parent is deleted (nothing here deletes it) or the ensemble's data is wiped; then
new fences are below the rows' fences and the storage refuses every write until the sale is reset.

What is guaranteed
------------------
* While the ensemble has a majority: one owner at a time, grants in sequence order, and the fence
  strictly increases from grant to grant of a name (a later owner's znode was created after every
  earlier owner's, or it would have been the lower one).
* ``acquire()`` returns or raises :class:`NotAcquired` within ``timeout_ms`` (at least
  ``MIN_CALL_S``), with a majority down too (:class:`QuorumUnavailable` when no member connected).
* Session loss is lock loss. The client counts every *suspended* (connection to its member lost)
  or *lost* (session expired) state. After either, :meth:`ZooKeeperLock.held` looks again before
  answering: True only if the same session is back (on any member, within a third of its
  timeout) and the grant's znode is still there; a holder that asks before writing stops
  otherwise. A write that slips in after the session ended is refused by the fence.

What is not guaranteed
----------------------
* Mutual exclusion under pauses. A holder frozen longer than the session timeout loses its
  session; the ensemble deletes its znode and the next contender owns the lock while the frozen
  holder still believes it holds it. Only storage that checks the fence refuses its late write.
* "Released when the client disconnects": a SIGKILLed client's session, and its znode, live until
  the session timeout (the client might have reconnected to another member). Only a clean close
  ends them at once.
"""

from __future__ import annotations

import contextlib
import os
import re
import threading
import time
import uuid
from typing import Callable, Sequence, TypeVar

from kazoo.client import KazooClient
from kazoo.exceptions import ConnectionClosedError, ConnectionLoss, KazooException, NoNodeError
from kazoo.handlers.threading import KazooTimeoutError
from kazoo.protocol.states import KazooState

from ._core import (
    ConsensusLockParts,
    Lease,
    acquire_claimed,
    check_arguments,
    checked_ttl,
    new_claim,
    raise_unless_interrupted,
    unclaim,
)
from .errors import LockError, LockLost, NotAcquired, NotOwned, QuorumUnavailable

__all__ = ["LOCK_ROOT", "WATCH_RECHECK_S", "ZooKeeperClient", "ZooKeeperLock", "sequence_of"]

T = TypeVar("T")
LOCK_ROOT = "/flashsale/locks"
NODE_MARK = "__lock__"
#: However short ``timeout_ms`` (0 is a single try), each call and the first connection may take this long.
MIN_CALL_S = 1.0
#: A waiter also looks again this often, in case a watch event is lost with its member.
WATCH_RECHECK_S = 1.0
#: What ZooKeeper refuses in a path (its PathUtils.validatePath), a character beyond U+FFFF being two
#: UTF-16 surrogates there.
REFUSED_CHARACTERS = re.compile("[\x00-\x1f\x7f-\x9f\ud800-\uf8ff\ufff0-\U0010ffff]")
#: A call pending on a session looks this often whether another thread retired that session meanwhile.
RETIRED_CHECK_S = 0.1


def sequence_of(node: str) -> int:
    """The sequence number ZooKeeper appended to a contender's znode name."""
    return int(node.rsplit(NODE_MARK, 1)[1])


class ZooKeeperClient:
    """The process's ZooKeeper session (one kazoo client), shared by its threads.

    ``session_ms`` is the session timeout asked of the ensemble (it clamps it to its own minimum
    and maximum), a whole number of ms from 1 to 2**31 - 1 (the protocol's 32-bit field). The
    client counts session trouble in :attr:`troubles`: every SUSPENDED or LOST
    state adds one, so a grant taken at count ``n`` is void once the count moved on. A forked
    child starts its own session on first use.
    """

    def __init__(self, hosts: Sequence[str], *, session_ms: int = 10_000) -> None:
        if not hosts:
            raise ValueError("a ZooKeeper client needs at least one host")
        self.hosts = list(hosts)
        self.session_ms = checked_ttl(session_ms, argument="session_ms")
        self.troubles = 0
        self._kazoo: KazooClient | None = None
        self._orphans: list[tuple[str, str, float]] = []  # (lock path, znode prefix, sweep until)
        self._pid = 0
        self._guard = threading.Lock()
        self._changed = threading.Condition()  # notified when a client connects or is retired

    def _on_state(self, state: str) -> None:
        if state != KazooState.CONNECTED:
            self.troubles += 1
        with self._changed:
            self._changed.notify_all()

    def kazoo(self, deadline: float) -> KazooClient:
        """The connected kazoo client, connecting first if needed; :class:`TimeoutError` past ``deadline``.

        A client retired while this waits for it to connect is replaced by a new one at once.
        """
        while True:
            client = self._current_or_new()
            if self.wait_connected(client, deadline):
                return client
            if self.current(client) or time.monotonic() >= deadline:
                raise TimeoutError(f"no ZooKeeper member of {', '.join(self.hosts)} connected in time")

    def _current_or_new(self) -> KazooClient:
        with self._guard:
            if self._kazoo is None or self._pid != os.getpid():
                self._kazoo = KazooClient(
                    hosts=",".join(self.hosts),
                    timeout=self.session_ms / 1000.0,
                    # Reconnect every 0.5 s at most: kazoo's default backoff grows to a minute, which
                    # would keep a client away long after a lost majority is back.
                    connection_retry={"max_tries": -1, "delay": 0.05, "backoff": 2, "max_delay": 0.5},
                )
                self._kazoo.add_listener(self._on_state)
                self._pid = os.getpid()
                # kazoo reconnects on its own (calling start_async again would restart it).
                self._kazoo.start_async()
            return self._kazoo

    def current(self, client: KazooClient | None) -> bool:
        """``client`` is this process's session still: not retired, closed or inherited from a parent."""
        return client is not None and client is self._kazoo and self._pid == os.getpid()

    def wait_connected(self, client: KazooClient, deadline: float) -> bool:
        """Wait until ``client`` has (re)connected, at most until ``deadline``; False at once if it is retired."""
        with self._changed:
            self._changed.wait_for(
                lambda: not self.current(client) or client.connected, max(0.0, deadline - time.monotonic())
            )
        return self.current(client) and client.connected

    def connected(self) -> bool:
        return self._kazoo is not None and self._kazoo.state == KazooState.CONNECTED

    def session_id(self) -> int | None:
        return session_of(self._kazoo)

    def session_credentials(self) -> tuple[int, bytes] | None:
        """(id, password) of the current session while connected (kazoo's ``client_id``): what a
        second connection needs to resume the session, or to close it, as the ensemble does when a
        frozen holder's session times out. None while no session is established."""
        client = self._kazoo
        return tuple(client.client_id) if client is not None and client.client_id else None

    def retire(self, client: KazooClient | None, path: str, prefix: str) -> None:
        """End the session of ``client``, if it is still the current one, and start a new one on
        next use; in any case sweep the znodes ``prefix`` under ``path``.

        For a znode this process no longer wants and could not delete (a create whose outcome is
        unknown, a release not confirmed): with the session kept, it would block the lock as long
        as the session lives. Every grant under the old session is void. Only the session the
        failed call ran on is retired: a call pending on a session another thread retired fails
        too, and says nothing about the new one. Closing the old session reaches the ensemble
        only if a member answers; if none does, the old session and its znode outlive the outage
        by a whole session timeout, so the next acquisitions, on the new session, delete what
        matches ``prefix`` (any client may delete any znode) for two session timeouts.
        """
        with self._guard:
            self._orphans.append((path, prefix, time.monotonic() + 2 * self.session_ms / 1000.0))
            if not self.current(client):
                return
            self._kazoo = None
            self.troubles += 1
        with self._changed:
            self._changed.notify_all()
        threading.Thread(target=_stop_quietly, args=(client,), daemon=True).start()

    def sweep(self, zk: KazooClient, timeout_s: float) -> None:
        """Delete the znodes of retired sessions (see :meth:`retire`) while their sweep lasts."""
        with self._guard:
            now = time.monotonic()
            self._orphans = [orphan for orphan in self._orphans if orphan[2] > now]
            orphans = list(self._orphans)
        for path, prefix, _ in orphans:
            try:
                children = zk.get_children_async(path).get(timeout=timeout_s)
                for child in children:
                    if child.startswith(prefix):
                        zk.delete_async(f"{path}/{child}").get(timeout=timeout_s)
            except (KazooException, KazooTimeoutError):
                continue  # the next acquisition tries again

    def close(self) -> None:
        """End the session at once: its znodes are deleted now, not after the session timeout."""
        with self._guard:
            old, self._kazoo = self._kazoo, None
        with self._changed:
            self._changed.notify_all()
        if old is not None and self._pid == os.getpid():
            _stop_quietly(old)


def session_of(client: KazooClient | None) -> int | None:
    """The session id of ``client`` while it is connected; None while it reconnects (kazoo's ``client_id``)."""
    return client.client_id[0] if client is not None and client.client_id else None


class _SessionRetired(Exception):
    """A call failed because another thread retired the session it ran on: try again on the new one."""


def _stop_quietly(client: KazooClient) -> None:
    try:
        client.stop()
        client.close()
    except (KazooException, OSError, RuntimeError):  # a session being thrown away: nothing left to do
        pass


class ZooKeeperLock(ConsensusLockParts):
    """One acquisition of the lock ``name`` on a ZooKeeper ensemble; make one object per acquisition.

    ``timeout_ms``: how long ``acquire()`` may wait for the lock. The session timeout is the
    client's (``session_ms``): it bounds how long a crashed or frozen holder keeps the lock.
    """

    _lease: Lease | None = None
    _node: str | None = None
    _zk: KazooClient | None = None
    _troubles = 0
    _session_id: int | None = None
    _started = 0.0
    _pid = 0  # the process the lease was granted to (a forked child has a copy, not the lock)

    def __init__(self, client: ZooKeeperClient, name: str, *, timeout_ms: int = 5_000) -> None:
        check_arguments(name, None, timeout_ms)  # the session's timeout is the client's, checked there
        if "/" in name or name in (".", ".."):
            raise ValueError(f"a ZooKeeper lock name is one znode name, without '/' and not '.' or '..': {name!r}")
        if not name.isascii() or not name.isprintable():
            refused = REFUSED_CHARACTERS.search(name)
            if refused:
                raise ValueError(
                    f"a ZooKeeper lock name may not contain {refused.group()!r} at {refused.start()} (ZooKeeper "
                    f"refuses U+0000-U+001F, U+007F-U+009F, U+D800-U+F8FF, U+FFF0 and above in a path): {name!r}"
                )
        self.client = client
        self._claim = new_claim()
        self.name = name
        self.path = f"{LOCK_ROOT}/{name}"
        self.prefix = ""
        self.timeout_ms = timeout_ms

    def _forget_held(self) -> None:
        self._lease = self._node = self._zk = None

    def node_names(self) -> list[str]:
        return list(self.client.hosts)

    def held(self) -> bool:
        """The grant still stands: no session trouble since it, or, after a connection dropped, the
        same session back (on any member) and its znode still there.

        A suspended session makes the holder stop and look before it writes: the ensemble may
        have expired it meanwhile. It waits for the reconnection at most a third of the session
        timeout (kazoo knows no session id while it reconnects); a lost session (expired, or
        retired) is never back.
        """
        if self._lease is None:
            return False
        zk = self._zk
        if self.client.troubles == self._troubles and self.client.current(zk) and zk.connected:
            return True
        deadline = time.monotonic() + self.client.session_ms / 3000.0
        if not self.client.wait_connected(zk, deadline) or session_of(zk) != self._session_id:
            return False
        try:
            stat = zk.exists_async(self._lease.token).get(timeout=max(0.001, deadline - time.monotonic()))
        except (KazooException, KazooTimeoutError):
            return False
        if stat is None or stat.ephemeralOwner != self._session_id or session_of(zk) != self._session_id:
            return False
        self._troubles = self.client.troubles  # looked at anew: good until the next trouble
        return True

    def acquire(self) -> Lease:
        """Take the lock, waiting up to ``timeout_ms``; returns the :class:`Lease` (fence = sequence + 1).

        If another thread retires the session meanwhile, the acquisition starts again on the new
        session, as long as time is left.
        """
        self._forget_if_forked()
        return acquire_claimed(self, self._acquire)

    def _acquire(self) -> Lease:
        self._started = time.monotonic()
        deadline = self._started + self.timeout_ms / 1000.0
        while True:
            try:
                zk = self.client.kazoo(max(deadline, self._started + MIN_CALL_S))
            except TimeoutError as exc:
                raise self._error(QuorumUnavailable, str(exc)) from exc
            troubles = self.client.troubles
            try:
                node = self._attempt(zk, deadline)
                break
            except _SessionRetired as exc:
                if time.monotonic() >= deadline:
                    raise self._error(NotAcquired, "the session was retired while waiting") from exc
        self._zk, self._troubles, self._session_id, self._pid = zk, troubles, session_of(zk), os.getpid()
        valid_until = time.monotonic() + self.client.session_ms / 1000.0
        token = f"{self.path}/{node}"
        self._lease = Lease(name=self.name, token=token, fence=sequence_of(node) + 1, valid_until=valid_until)
        return self._lease

    def _attempt(self, zk: KazooClient, deadline: float) -> str:
        """One try on the session ``zk``, under a new znode prefix: the znodes of a try whose session
        was retired are the old session's, deleted with it or swept by their prefix."""
        self.prefix = f"{uuid.uuid4().hex}{NODE_MARK}"
        self.client.sweep(zk, MIN_CALL_S)
        self._node = None
        try:
            self._node = self._create(zk, deadline)
            return self._wait_turn(zk, deadline)
        except NotAcquired:
            if self._node is not None:
                self._abandon(zk, self._node)
            self._node = None
            raise
        except _SessionRetired:
            self.client.retire(zk, self.path, self.prefix)  # retired already: only the sweep is added
            self._node = None
            raise
        except BaseException:
            # Interrupted (an exception from a signal handler, KeyboardInterrupt) or failed otherwise:
            # the znode would own the lock once its turn came, on a session this process keeps. One
            # interrupted inside its create was seen to by _create (the session is retired).
            if self._node is not None:
                with contextlib.suppress(Exception):  # best effort; the interruption is what is raised
                    self._abandon(zk, self._node)
            self._node = None
            raise

    def _call(self, zk: KazooClient, result, deadline: float):
        """Wait for an asynchronous kazoo call, at most until ``deadline``; :class:`_SessionRetired`
        as soon as another thread retires ``zk``."""
        end = max(deadline, self._started + MIN_CALL_S)
        while True:
            try:
                return result.get(timeout=max(0.001, min(end - time.monotonic(), RETIRED_CHECK_S)))
            except KazooTimeoutError as exc:
                if not self.client.current(zk):
                    raise _SessionRetired() from exc
                if time.monotonic() >= end:
                    raise self._error(NotAcquired, f"ZooKeeper did not answer within {self.timeout_ms} ms") from exc

    def _retrying(self, zk: KazooClient, op: Callable[[], T], deadline: float) -> T:
        """``op`` again after each lost connection, once kazoo has reconnected (to any member)."""
        while True:
            try:
                return op()
            except ConnectionLoss as exc:
                if self.client.wait_connected(zk, deadline):
                    continue
                if not self.client.current(zk):
                    raise _SessionRetired() from exc
                raise self._error(NotAcquired, f"no ZooKeeper member answered within {self.timeout_ms} ms") from exc
            except KazooException as exc:
                if not self.client.current(zk):
                    raise _SessionRetired() from exc  # ConnectionClosedError: says nothing of the new session
                raise self._error(NotAcquired, f"ZooKeeper refused the request: {exc!r}") from exc

    def _own(self, children: list[str]) -> list[str]:
        """This try's znodes among ``children``, lowest first."""
        return sorted((c for c in children if c.startswith(self.prefix)), key=sequence_of)

    def _create(self, zk: KazooClient, deadline: float) -> str:
        """Create this try's znode, or find the one a create with a lost reply made."""
        tried = False

        def create() -> str:
            nonlocal tried
            if tried:
                mine = self._own(self._call(zk, zk.get_children_async(self.path), deadline))
                if mine:
                    return f"{self.path}/{mine[0]}"
            self._call(zk, zk.ensure_path_async(self.path), deadline)
            tried = True  # from here on, the create may be applied whatever its reply says
            request = zk.create_async(f"{self.path}/{self.prefix}", ephemeral=True, sequence=True)
            return self._call(zk, request, deadline)

        try:
            created = self._retrying(zk, create, deadline)
        except _SessionRetired:
            raise
        except BaseException:  # refused, timed out, or interrupted (a signal handler's exception)
            if tried:
                self.client.retire(zk, self.path, self.prefix)  # the create may still be applied
            raise
        return created.rsplit("/", 1)[1]

    def _wait_turn(self, zk: KazooClient, deadline: float) -> str:
        """Wait until no contender has a lower sequence than this try's lowest znode; return that znode.

        A create retried after a lost reply may have landed twice (the first one through a member
        that the reconnected session's member had not caught up with): the lower one is kept, the
        others are deleted, so the try never waits on itself nor leaves a znode behind. A delete that
        is not confirmed retires the session (:meth:`_abandon`), and the try ends there: the
        acquisition starts again on the next session rather than grant on a retired one.
        """
        while True:
            children = self._retrying(zk, lambda: self._call(zk, zk.get_children_async(self.path), deadline), deadline)
            mine = self._own(children)
            if not mine:
                raise self._error(NotAcquired, "the session ended while waiting: its znode is gone")
            self._node = mine[0]
            for extra in mine[1:]:
                self._abandon(zk, extra)
            if not self.client.current(zk):
                raise _SessionRetired()  # an extra's delete went unconfirmed: this session's grants are void
            before = [c for c in children if NODE_MARK in c and sequence_of(c) < sequence_of(self._node)]
            if not before:
                return self._node
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise self._error(NotAcquired, f"not acquired within {self.timeout_ms} ms")
            predecessor = f"{self.path}/{max(before, key=sequence_of)}"
            if self._watch_gone(zk, predecessor, deadline, min(remaining, WATCH_RECHECK_S)) and (
                time.monotonic() >= deadline
            ):
                raise self._error(NotAcquired, f"not acquired within {self.timeout_ms} ms")

    def _watch_gone(self, zk: KazooClient, path: str, deadline: float, wait_s: float) -> bool:
        """Wait up to ``wait_s`` for ``path`` to be deleted; False when it was gone already."""
        gone = threading.Event()
        stat = self._retrying(
            zk, lambda: self._call(zk, zk.exists_async(path, watch=lambda _: gone.set()), deadline), deadline
        )
        if stat is None:
            return False
        gone.wait(wait_s)
        return True

    def _abandon(self, zk: KazooClient, node: str) -> None:
        """Delete a znode this acquisition no longer wants; if that cannot be confirmed, retire its session."""
        try:
            zk.delete_async(f"{self.path}/{node}").get(timeout=self.client.session_ms / 3000.0)
        except NoNodeError:
            pass
        except (KazooException, KazooTimeoutError):  # unknown outcome: the session takes the znode with it
            self.client.retire(zk, self.path, self.prefix)

    def release(self) -> None:
        """Delete the grant's znode; :class:`NotOwned` if the session ended and took it.

        Any thread may release it; a child forked while the lock was held may not (:class:`LockError`,
        nothing deleted): the lock is its parent's."""
        self._forget_if_forked()
        lease, node, granted_on = self._lease, self._node, self._zk
        if lease is None or node is None:
            raise self._error(NotOwned, "release of a lock this object does not hold")
        self._lease = self._node = self._zk = None
        unclaim(self)
        # Bounded like an acquire, and at least MIN_CALL_S: a reconnecting client may be back by then.
        deadline = time.monotonic() + max(self.timeout_ms / 1000.0, MIN_CALL_S)
        try:
            while True:
                zk = self.client.kazoo(deadline)  # the grant's session, or the one after it (any may delete)
                try:
                    zk.delete_async(lease.token).get(timeout=max(0.001, deadline - time.monotonic()))
                    return
                except (ConnectionLoss, ConnectionClosedError):
                    if time.monotonic() >= deadline or (
                        self.client.current(zk) and not self.client.wait_connected(zk, deadline)
                    ):
                        raise
        except NoNodeError as exc:
            raise self._error(NotOwned, "release refused: the session ended and its znode is gone") from exc
        except (KazooException, KazooTimeoutError, TimeoutError) as exc:
            self.client.retire(granted_on, self.path, self.prefix)  # the znode goes with its session, or is swept
            raise self._error(LockError, f"release not confirmed ({exc!r}); the session is retired") from exc

    def __enter__(self) -> Lease:
        return self.acquire()

    def __exit__(self, exc_type, exc, tb) -> None:
        try:
            self.release()
        except NotOwned as error:
            lost = self._error(LockLost, "the session ended while the block held the lock")
            lost.__cause__ = error
            raise_unless_interrupted(lost, exc)
