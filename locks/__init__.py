"""Distributed locks with fencing tokens, no Django import.

What the package holds:

* the Redis locks, exported here: one node (:class:`RedisLock`) and Redlock over N independent
  masters (:class:`Redlock`), each with an asyncio twin (``AsyncRedisLock``, ``AsyncRedlock``)
  of the same arguments and semantics. The asyncio source is in ``_async/``; ``_sync/`` is
  generated from it (``make twins``, ``scripts/unasync_locks.py``), each folder with its own
  hand-written ``io.py``; the quorum rules live once in ``_core.py``;
* :mod:`locks.etcd`: ``EtcdLock``, etcd's mutex recipe (the lock key's create revision is the
  fence), on :mod:`locks.etcd_client`;
* :mod:`locks.zookeeper`: ``ZooKeeperLock``, ZooKeeper's lock recipe on kazoo (ephemeral
  sequential znodes; the znode's sequence + 1 is the fence).

The Redis locks work with any redis-py client; what follows is about them (the etcd and ZooKeeper
modules state their own guarantees)::

    from locks import RedisLock, Redlock
    with RedisLock(client, "flashsale:lock:SKU1", ttl_ms=10_000, timeout_ms=5_000) as lease:
        # storage accepts the write only if lease.fence is larger than the last one it saw:
        # UPDATE product SET stock = stock - 1, fence = :fence WHERE id = :id AND fence < :fence
        ...
    with Redlock([c1, c2, c3, c4, c5], "flashsale:lock:SKU1", ttl_ms=10_000, watchdog=True) as lease:
        ...

A lock object is cheap (no I/O, nothing registered per call: scripts are sent by a SHA computed
at import) and is made per acquisition: a second ``acquire`` while it holds a lease or is being
acquired (another thread or task, a nested ``with``) raises :class:`LockError` at once. Any
thread may release it; a child forked while it was held holds nothing (``lease`` is None there,
and its release, extend or exit raises :class:`LockError`, no node touched). A watchdog holds its
lock object weakly: a lock dropped unreleased is not renewed, and expires by its TTL. Every grant
returns a :class:`Lease` with a random ``token`` (release and extend compare it in Lua), a
``fence`` and a ``valid_until`` deadline on ``time.monotonic()``.

What is guaranteed
------------------
* Single node: while the Redis server keeps its data, at most one token holds the key at a time,
  and fences for a name strictly increase (``INCR`` of ``<name>:fence`` in the same script as
  ``SET NX PX``). Release and extend act only if the token still matches; a stale holder's
  release is refused with :class:`NotOwned` and leaves the new holder's lock intact.
* Redlock (Redis distlock page): the command goes to all N nodes at once and the replies are
  read against one per-node timeout (default ttl/20, at most 50 ms), so a dead or frozen node
  costs at most that timeout. A grant needs a majority (N//2+1) and a positive validity
  ``ttl - elapsed - (ttl*0.01 + 2 ms)``, which is what is left from now: ``valid_until`` is
  start + ttl - (ttl*0.01 + 2 ms), every granting node having set its key after start. On any failure
  the token is released on every node, including those that said no. Contenders that split a
  vote retry after a random delay. If fewer than a majority answer, :class:`QuorumUnavailable`
  is raised rather than waiting out ``timeout_ms`` (waiting cannot make dead nodes answer), after
  one more round if the missed one was the acquire's first and time is left: a worker's first
  round also connects to every node, which a loaded machine can stretch past the node timeout.
  Dead nodes refuse that second round at once; frozen ones cost it one more node timeout. A
  try-lock (``timeout_ms=0``) has one round only.
* Redlock fences are monotonic across the quorum. Each node's acquire script increments that
  node's counter; the lock takes ``f = max`` of the counters on the granting majority and, on
  granting nodes whose counter is below ``f``, raises it to ``f`` (only where the token holds
  the lock) before granting; it grants only if at least a majority then have counter >= f.
  Argument: let grant G1 (fence f1) be granted before grant G2. Q1, the majority with
  counter >= f1, consists of nodes where G1's key was set and, by positive validity, still
  alive at G1's grant. G2's granting majority M2 intersects Q1 in some node n; G2 could set its
  key on n only after G1's key there was gone, i.e. after G1's grant and so after n's counter
  reached f1; G2's increment on n then yields > f1, so f2 >= that > f1. When the counters agree
  (the normal case) no write-back is needed and an acquire is one round trip.
* Blocking acquire (``wait="notify"``, default) sleeps in ``BLPOP`` on ``<name>:signal``, on
  the connection of its refused attempt. A refused caller that will wait registers its id in
  the set ``<name>:waiters`` (which expires a second after the longest wait announced, so a
  waiter that died is forgotten); it leaves the set when it gets the lock, or on its last
  attempt (the one that starts after ``timeout_ms``: a caller gives up with no extra round
  trip, and ``acquire`` lasts at most ``timeout_ms`` plus one node timeout). A release that finds
  the set non-empty pushes one element, so it wakes one waiter, and opens a 20 ms hand-off
  window in which only registered waiters may take the lock, so the releaser coming straight
  back cannot overtake the waiter it woke. With nobody registered a release costs GET, DEL and
  SCARD and opens no window; a try-lock (``timeout_ms=0``) never registers. A waiter also wakes
  when the holder's key would expire, and at once when the server it waits on goes away or
  restarts (the connection breaks), to try the fresh server. ``wait="poll"`` retries after
  random delays instead (its waiters register too, but find the window only on their next poll).
* Recovery when the lock service forgot its counter: ``lock.advance_fence(past)`` raises the
  fence of a lease that still holds the lock above ``past`` (the row's fence) in one round trip;
  see its docstring for why storage must also compare the row's version.
* ``watchdog=True`` renews every ttl/3, at most ``max_renewals`` times. A failed renewal (or the
  lease running out after the last one) marks the lease lost, calls ``on_lost(lease, error)``,
  and leaving the ``with`` block raises :class:`LockLost`. Leaving a ``with`` block after the
  lease's ``valid_until`` (or after its key vanished) raises :class:`LockLost` too, even if the
  key was still there to delete: the validity margin was spent. ``extend()`` counts only if the
  node (or a majority) confirms within the current validity, and at most ``max_extensions`` times.

What is not guaranteed
----------------------
* Mutual exclusion by time alone. A holder that pauses (GC, SIGSTOP, swapping) past
  ``valid_until`` still believes it holds the lock; only the fence checked by storage makes its
  late write harmless. Always write with the fence, and check ``lease.remaining_ms()``.
* Clock jumps. Redis expires keys by its own clock; a node whose clock jumps forward drops
  keys early. Redlock keeps mutual exclusion through such a jump only if the grant still has
  a majority without that node: a grant by exactly a majority (say 3 of 5, two nodes down or
  slow) loses its majority when one granting node jumps, and a second holder can be granted
  while the first still holds a valid lease (tests/locks/test_lock_faults.py shows it). The fences
  still order the two (the second is larger), so the storage check refuses the first one's
  late write. The single node has no such margin. The client side uses the monotonic clock,
  so its own wall clock does not matter; rate drift beyond 1 % + 2 ms breaks the validity
  arithmetic.
* Node restarts without persistence (this project's nodes run with ``--save ""``). A restarted
  node forgets keys and counters. Single node: both guarantees are gone across the restart
  (fences restart from 1). Redlock: fences stay monotonic while the nodes that confirmed the
  last fence, minus those restarted since, still overlap every majority. Mutual exclusion
  survives a minority forgetting *within one lease*: restarts one at a time, each after the
  node was down one TTL (distlock's delayed restart), are fine, and the fault test does exactly
  that. Two nodes restarting empty one after the other within one lease are not: a lease granted
  by four loses its majority and a second holder gets the lock (the test beside it shows it).
  Delay restarts by one TTL for the lock, and use ``appendfsync always`` persistence for the
  counters.
* Tight latency bounds of a single node. ``RedisLock`` waits for each reply (and for a connect)
  at most the client's ``socket_timeout``: redis-py's default is 5 s, and a client created with
  ``socket_timeout=None`` gets 5 s here too (the library never waits without a bound). Give the
  client a smaller one if a frozen server should cost less. Redlock waits ``node_timeout_ms``
  per round for all nodes together (connects included; a connect that outlasts a round is not
  waited for again for a second). The library keeps its own connections per client (not the
  client's pool); the blocking locks' close when the client is garbage-collected. The asyncio
  twins' belong to the event loop that opened them, which alone uses them: await
  :func:`aclose_connections` on a loop before it ends (its idle ones close, every client's), as
  nothing can close them once it has.
* Failover of one replicated Redis (Sentinel): replication is asynchronous, the promoted replica
  may not have the key. Use Redlock across independent masters instead.
"""

from ._async.io import aclose_connections
from ._async.locks import AsyncRedisLock, AsyncRedlock
from ._core import Lease
from ._sync.locks import RedisLock, Redlock
from .errors import LockError, LockLost, NotAcquired, NotOwned, QuorumUnavailable

__all__ = [
    "AsyncRedisLock",
    "AsyncRedlock",
    "Lease",
    "LockError",
    "LockLost",
    "NotAcquired",
    "NotOwned",
    "QuorumUnavailable",
    "RedisLock",
    "Redlock",
    "aclose_connections",
]
