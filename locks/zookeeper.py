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
would then block the lock as long as this session lives) retires the session.

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

import os
import threading
import time
import uuid
from typing import Callable, Sequence, TypeVar

from kazoo.client import KazooClient
from kazoo.exceptions import ConnectionLoss, KazooException, NoNodeError
from kazoo.handlers.threading import KazooTimeoutError
from kazoo.protocol.states import KazooState

from ._core import Lease, check_arguments
from .errors import LockError, LockLost, NotAcquired, NotOwned, QuorumUnavailable

__all__ = ["LOCK_ROOT", "WATCH_RECHECK_S", "ZooKeeperClient", "ZooKeeperLock", "sequence_of"]

T = TypeVar("T")
LOCK_ROOT = "/flashsale/locks"
NODE_MARK = "__lock__"
#: However short ``timeout_ms`` (0 is a single try), each call and the first connection may take this long.
MIN_CALL_S = 1.0
#: A waiter also looks again this often, in case a watch event is lost with its member.
WATCH_RECHECK_S = 1.0


def sequence_of(node: str) -> int:
    """The sequence number ZooKeeper appended to a contender's znode name."""
    return int(node.rsplit(NODE_MARK, 1)[1])


class ZooKeeperClient:
    """The process's ZooKeeper session (one kazoo client), shared by its threads.

    ``session_ms`` is the session timeout asked of the ensemble (it clamps it to its own minimum
    and maximum). The client counts session trouble in :attr:`troubles`: every SUSPENDED or LOST
    state adds one, so a grant taken at count ``n`` is void once the count moved on. A forked
    child starts its own session on first use.
    """

    def __init__(self, hosts: Sequence[str], *, session_ms: int = 10_000) -> None:
        if not hosts:
            raise ValueError("a ZooKeeper client needs at least one host")
        self.hosts = list(hosts)
        self.session_ms = session_ms
        self.troubles = 0
        self._kazoo: KazooClient | None = None
        self._live = threading.Event()
        self._orphans: list[tuple[str, str, float]] = []  # (lock path, znode prefix, sweep until)
        self._pid = 0
        self._guard = threading.Lock()

    def _on_state(self, state: str) -> None:
        if state != KazooState.CONNECTED:
            self.troubles += 1

    def kazoo(self, deadline: float) -> KazooClient:
        """The connected kazoo client, connecting first if needed; :class:`TimeoutError` past ``deadline``."""
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
                # Set while connected; kazoo reconnects on its own (calling start_async again would restart it).
                self._live = self._kazoo.start_async()
            client, live = self._kazoo, self._live
        if not live.wait(max(0.0, deadline - time.monotonic())):
            raise TimeoutError(f"no ZooKeeper member of {', '.join(self.hosts)} connected in time")
        return client

    def wait_connected(self, deadline: float) -> bool:
        """Wait until kazoo has (re)connected, at most until ``deadline``."""
        live = self._live if self._kazoo is not None else None
        return live is not None and live.wait(max(0.0, deadline - time.monotonic()))

    def connected(self) -> bool:
        return self._kazoo is not None and self._kazoo.state == KazooState.CONNECTED

    def session_id(self) -> int | None:
        return self._kazoo.client_id[0] if self._kazoo is not None and self._kazoo.client_id else None

    def retire(self, path: str, prefix: str) -> None:
        """End this session and start a new one on next use; sweep the znodes ``prefix`` under ``path``.

        For a znode this process no longer wants and could not delete (a create whose outcome is
        unknown, a release not confirmed): with the session kept, it would block the lock as long
        as the session lives. Every grant under the old session is void. Closing the old session
        reaches the ensemble only if a member answers; if none does, the old session and its
        znode outlive the outage by a whole session timeout, so the next acquisitions, on the new
        session, delete what matches ``prefix`` (any client may delete any znode) for two
        session timeouts.
        """
        with self._guard:
            old, self._kazoo = self._kazoo, None
            self.troubles += 1
            self._orphans.append((path, prefix, time.monotonic() + 2 * self.session_ms / 1000.0))
        if old is not None:
            threading.Thread(target=_stop_quietly, args=(old,), daemon=True).start()

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
        if old is not None and self._pid == os.getpid():
            _stop_quietly(old)


def _stop_quietly(client: KazooClient) -> None:
    try:
        client.stop()
        client.close()
    except (KazooException, OSError, RuntimeError):  # a session being thrown away: nothing left to do
        pass


class ZooKeeperLock:
    """One acquisition of the lock ``name`` on a ZooKeeper ensemble; make one object per acquisition.

    ``timeout_ms``: how long ``acquire()`` may wait for the lock. The session timeout is the
    client's (``session_ms``): it bounds how long a crashed or frozen holder keeps the lock.
    """

    _lease: Lease | None = None
    _node: str | None = None
    _troubles = 0
    _session_id: int | None = None
    _started = 0.0

    def __init__(self, client: ZooKeeperClient, name: str, *, timeout_ms: int = 5_000) -> None:
        check_arguments(name, client.session_ms, timeout_ms)
        if "/" in name:
            raise ValueError(f"a ZooKeeper lock name is one znode name, without '/': {name!r}")
        self.client = client
        self.name = name
        self.path = f"{LOCK_ROOT}/{name}"
        self.prefix = f"{uuid.uuid4().hex}{NODE_MARK}"
        self.timeout_ms = timeout_ms

    @property
    def lease(self) -> Lease | None:
        return self._lease

    def node_names(self) -> list[str]:
        return list(self.client.hosts)

    def _error(self, cls: type[LockError], message: str) -> LockError:
        return cls(message, name=self.name, nodes=self.node_names())

    def held(self) -> bool:
        """The grant still stands: no session trouble since it, or, after a connection dropped, the
        same session back (on any member) and its znode still there.

        A suspended session makes the holder stop and look before it writes: the ensemble may
        have expired it meanwhile. It waits for the reconnection at most a third of the session
        timeout; a lost session (expired, or retired) is never back.
        """
        if self._lease is None:
            return False
        if self.client.troubles == self._troubles and self.client.connected():
            return True
        deadline = time.monotonic() + self.client.session_ms / 3000.0
        if self.client.session_id() != self._session_id or not self.client.wait_connected(deadline):
            return False
        try:
            zk = self.client.kazoo(deadline)
            stat = zk.exists_async(self._lease.token).get(timeout=max(0.001, deadline - time.monotonic()))
        except (KazooException, KazooTimeoutError, TimeoutError):
            return False
        if stat is None or stat.ephemeralOwner != self._session_id or self.client.session_id() != self._session_id:
            return False
        self._troubles = self.client.troubles  # looked at anew: good until the next trouble
        return True

    def acquire(self) -> Lease:
        """Take the lock, waiting up to ``timeout_ms``; returns the :class:`Lease` (fence = sequence + 1)."""
        if self._lease is not None:
            raise self._error(LockError, "this lock object already holds a lease; make one per acquisition")
        self._started = time.monotonic()
        deadline = self._started + self.timeout_ms / 1000.0
        try:
            zk = self.client.kazoo(max(deadline, self._started + MIN_CALL_S))
        except TimeoutError as exc:
            raise self._error(QuorumUnavailable, str(exc)) from exc
        troubles = self.client.troubles
        self.client.sweep(zk, MIN_CALL_S)
        node = None
        try:
            node = self._create(zk, deadline)
            self._wait_turn(zk, node, deadline)
        except NotAcquired:
            if node is not None:
                self._abandon(zk, node)
            raise
        self._node, self._troubles, self._session_id = node, troubles, self.client.session_id()
        valid_until = time.monotonic() + self.client.session_ms / 1000.0
        token = f"{self.path}/{node}"
        self._lease = Lease(name=self.name, token=token, fence=sequence_of(node) + 1, valid_until=valid_until)
        return self._lease

    def _call(self, result, deadline: float):
        """Wait for an asynchronous kazoo call, at most until ``deadline``."""
        try:
            return result.get(timeout=max(0.001, max(deadline, self._started + MIN_CALL_S) - time.monotonic()))
        except KazooTimeoutError as exc:
            raise self._error(NotAcquired, f"ZooKeeper did not answer within {self.timeout_ms} ms") from exc

    def _retrying(self, op: Callable[[], T], deadline: float) -> T:
        """``op`` again after each lost connection, once kazoo has reconnected (to any member)."""
        while True:
            try:
                return op()
            except ConnectionLoss as exc:
                if not self.client.wait_connected(deadline):
                    raise self._error(NotAcquired, f"no ZooKeeper member answered within {self.timeout_ms} ms") from exc
            except KazooException as exc:
                raise self._error(NotAcquired, f"ZooKeeper refused the request: {exc!r}") from exc

    def _create(self, zk: KazooClient, deadline: float) -> str:
        """Create this acquisition's znode, or find the one a create with a lost reply made."""
        tried = False

        def create() -> str:
            nonlocal tried
            if tried:
                mine = [c for c in self._call(zk.get_children_async(self.path), deadline) if c.startswith(self.prefix)]
                if mine:
                    return f"{self.path}/{mine[0]}"
            tried = True
            self._call(zk.ensure_path_async(self.path), deadline)
            return self._call(zk.create_async(f"{self.path}/{self.prefix}", ephemeral=True, sequence=True), deadline)

        try:
            created = self._retrying(create, deadline)
        except NotAcquired:
            if tried:
                self.client.retire(self.path, self.prefix)  # the create may still be applied
            raise
        return created.rsplit("/", 1)[1]

    def _wait_turn(self, zk: KazooClient, node: str, deadline: float) -> None:
        """Wait until no contender has a lower sequence than ``node``."""
        mine = sequence_of(node)
        while True:
            children = self._retrying(lambda: self._call(zk.get_children_async(self.path), deadline), deadline)
            if node not in children:
                raise self._error(NotAcquired, "the session ended while waiting: its znode is gone")
            before = [c for c in children if NODE_MARK in c and sequence_of(c) < mine]
            if not before:
                return
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
        stat = self._retrying(lambda: self._call(zk.exists_async(path, watch=lambda _: gone.set()), deadline), deadline)
        if stat is None:
            return False
        gone.wait(wait_s)
        return True

    def _abandon(self, zk: KazooClient, node: str) -> None:
        """Delete a znode this acquisition no longer wants; if that cannot be confirmed, retire the session."""
        try:
            zk.delete_async(f"{self.path}/{node}").get(timeout=self.client.session_ms / 3000.0)
        except NoNodeError:
            pass
        except (KazooException, KazooTimeoutError):  # unknown outcome: the session takes the znode with it
            self.client.retire(self.path, self.prefix)

    def release(self) -> None:
        """Delete the grant's znode; :class:`NotOwned` if the session ended and took it."""
        lease, node = self._lease, self._node
        if lease is None or node is None:
            raise self._error(NotOwned, "release of a lock this object does not hold")
        self._lease = self._node = None
        # Bounded like an acquire, and at least MIN_CALL_S: a reconnecting client may be back by then.
        deadline = time.monotonic() + max(self.timeout_ms / 1000.0, MIN_CALL_S)
        try:
            while True:
                zk = self.client.kazoo(deadline)
                try:
                    zk.delete_async(lease.token).get(timeout=max(0.001, deadline - time.monotonic()))
                    return
                except ConnectionLoss:
                    if time.monotonic() >= deadline or not self.client.wait_connected(deadline):
                        raise
        except NoNodeError as exc:
            raise self._error(NotOwned, "release refused: the session ended and its znode is gone") from exc
        except (KazooException, KazooTimeoutError, TimeoutError) as exc:
            self.client.retire(self.path, self.prefix)  # the znode goes with the session, or is swept
            raise self._error(LockError, f"release not confirmed ({exc!r}); the session is retired") from exc

    def __enter__(self) -> Lease:
        return self.acquire()

    def __exit__(self, exc_type, exc, tb) -> None:
        try:
            self.release()
        except NotOwned as error:
            raise self._error(LockLost, "the session ended while the block held the lock") from error
