# Generated from _async/base.py by scripts/unasync_locks.py (make twins): do not edit;
# edit _async/base.py and regenerate.
"""What the two Redis locks share: waiting, the lease, extension, fence recovery, the watchdog, ``with``.

One source for both twins: ``_async/base.py`` is the asyncio source and ``_sync/base.py`` is generated
from it by ``scripts/unasync_locks.py``, as ``_sync/locks.py`` is from ``_async/locks.py``. The lock classes there
supply one attempt, release, extension and fence advance on their nodes.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import random
import time
import weakref
from typing import Callable

from .._core import (
    AMBIGUOUS,
    HELPER_SUFFIXES,
    IN_USE,
    MAX_MS,
    MIN_TTL_MS,
    REFUSALS,
    RELEASED,
    WAITS,
    Lease,
    Process,
    check_redis_arguments,
    checked_fence,
    checked_ttl,
    drift_ms,
    forked_message,
    lock_keys,
    log_ambiguous_release,
    logger,
    new_claim,
    new_token,
    raise_unless_interrupted,
    unclaim,
)
from ..errors import LockError, LockLost, NotAcquired, NotOwned
from . import io as _io

__all__ = ["BaseLock"]


class BaseLock:
    """What both locks share: waiting, the lease, extension, fence recovery, the watchdog, ``with``."""

    quorum: int
    # Per-acquisition state starts at these class defaults: a lock is built once per purchase,
    # so its constructor stays short.
    _lease: Lease | None = None
    _lost: LockLost | None = None
    _extensions = 0
    _watchdog: _io.Watchdog | None = None
    # (node, connection) of the refused attempt a waiter blocks on: the same server session that
    # registered it as a waiter, so a restart of that server ends the wait at once.
    _held: tuple | None = None
    # The process the lease was granted to: a child forked while it held the lock has a copy of
    # the lease, not the lock.
    _pid = 0
    _on_lost: Callable[[Lease, LockLost], None] | None = None

    def __init__(
        self,
        name: str,
        *,
        ttl_ms: int,
        timeout_ms: int,
        wait: str,
        retry_delay_ms: float,
        watchdog: bool,
        max_renewals: int,
        on_lost: Callable[[Lease, LockLost], None] | None,
        max_extensions: int,
    ) -> None:
        if (
            type(name) is not str
            or not name
            or not name.isascii()
            or name.endswith(HELPER_SUFFIXES)
            or type(ttl_ms) is not int
            or not MIN_TTL_MS <= ttl_ms <= MAX_MS
            or type(timeout_ms) is not int
            or not 0 <= timeout_ms <= MAX_MS
            or wait not in WAITS
            or type(retry_delay_ms) not in (float, int)
            or not 0 <= retry_delay_ms <= MAX_MS
            or type(max_renewals) is not int
            or max_renewals < 0
            or type(max_extensions) is not int
            or max_extensions < 0
        ):
            # The usual arguments pass the test above; anything else is checked, and refused or made an int.
            ttl_ms = check_redis_arguments(name, ttl_ms, timeout_ms, wait, retry_delay_ms, max_renewals, max_extensions)
        self._claim = new_claim()
        self.name = name
        self.ttl_ms = ttl_ms
        self.timeout_ms = timeout_ms
        self.wait = wait
        self.retry_delay_ms = retry_delay_ms
        self.watchdog = watchdog
        self.max_renewals = max_renewals
        if on_lost is not None:  # None is the class default: no setter call for the usual lock
            self.on_lost = on_lost
        self.max_extensions = max_extensions
        self._keys, self._release_keys = lock_keys(name)
        self._drift_ms = drift_ms(self.ttl_ms)
        self._refusal_detail = ""  # a refused release's per-node outcomes (Redlock), for its message

    # Subclasses provide: _attempt(token, waiter_id, register) -> Attempt,
    # _unlock(token) -> a _core.release_outcome, _abandon(token, waiter_id) (best effort: release
    # the token and unregister the waiter), _extend_nodes(lease, ttl_ms) -> Lease,
    # _advance_nodes(lease, past) -> int, node_names().

    @property
    def on_lost(self) -> Callable[[Lease, LockLost], None] | None:
        return self._on_lost

    @on_lost.setter
    def on_lost(self, on_lost: Callable[[Lease, LockLost], None] | None) -> None:
        if on_lost is not None:
            _io.check_on_lost(on_lost)  # the blocking twin cannot await a coroutine function
        self._on_lost = on_lost

    @property
    def lease(self) -> Lease | None:
        """The lease this object holds; None in a child forked while its parent held it."""
        if self._lease is not None and self._pid != Process.id:
            return None
        return self._lease

    @property
    def lost(self) -> LockLost | None:
        return self._lost

    def _error(self, cls: type[LockError], message: str) -> LockError:
        return cls(message, name=self.name, nodes=self.node_names())

    def acquire(self) -> Lease:
        """Take the lock, waiting up to ``timeout_ms``; returns the :class:`Lease`.

        An attempt that starts after the deadline is the last: if refused, it also takes this
        caller off the waiter count, so giving up costs no extra round trip. The whole call lasts
        at most ``timeout_ms`` plus that last attempt: one node timeout for :class:`RedisLock`;
        for :class:`Redlock` one round (``node_timeout_ms``), plus one more to undo a partial
        grant or a node that did not answer. With ``timeout_ms=0`` the first attempt is the
        last, and a refused try-lock never counts as a waiter.

        An acquire that fails in transport (the reply lost or late: the node may have run it) or
        is cancelled or interrupted releases its token and unregisters its waiter id, best effort,
        in one more round bounded by the node timeout; in asyncio that round runs as a task of its
        own after a cancellation, so the cancellation is not held up.
        """
        if self._lease is not None and self._pid != Process.id:
            self._forget_forked()
        if not self._claim.acquire(False):  # held, or being acquired by another thread or task: refused at once
            raise self._error(LockError, IN_USE)
        deadline = time.monotonic() + self.timeout_ms / 1000.0
        waiter_id = token = ""
        try:
            while True:
                token = new_token()
                last = time.monotonic() >= deadline
                lease, hint_ms, split = self._attempt(token, waiter_id, not last)
                if lease is not None:
                    self._lease, self._lost, self._extensions, self._pid = lease, None, 0, Process.id
                    if self.watchdog:
                        self._start_watchdog()
                    return lease
                if last:
                    raise self._error(NotAcquired, f"not acquired within {self.timeout_ms} ms")
                waiter_id = waiter_id or token
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    self._give_back_held()
                elif self._held is None or split:
                    # A split vote means every contender failed at once: a random pause desynchronizes them.
                    self._give_back_held()
                    _io.sleep(min(remaining, random.uniform(0.5, 1.0) * self.retry_delay_ms / 1000.0))
                else:
                    # Wake on the holder's release, or when it would have expired if it crashed.
                    self._wait_for_release(min(remaining, (hint_ms + 1) / 1000.0 if hint_ms > 0 else 0.01))
        except LockError:
            # The lock's own refusals: each attempt cleaned up after itself (_attempt).
            self._give_back_held()
            unclaim(self)
            raise
        except BaseException as error:
            # Cancelled (asyncio) or interrupted mid-round trip or mid-wait: a node may have run the
            # acquire whose reply never came (its key would block everyone for a TTL), and this
            # caller may still count as a waiter (every release would open a hand-off window for
            # nobody). Undone best effort; after a cancellation in a task of its own, so the
            # cancellation still comes through at once.
            self._give_back_held()
            unclaim(self)
            _io.clean_up(error, self._abandon, token, waiter_id)
            raise

    def _start_watchdog(self) -> None:
        """The watchdog keeps only a weak reference: a lock object nobody can release any more
        (dropped, or its thread died) is not renewed; it expires by its TTL."""
        body = functools.partial(_watch, weakref.ref(self))
        self._watchdog = _io.Watchdog(f"lock-watchdog:{self.name}", body)

    def _hold(self, node, conn) -> None:
        """Keep ``conn`` (a refused attempt's) for the wait that follows, in notify mode."""
        if self.wait == "notify":
            self._held = (node, conn)
        else:
            node.give(conn)

    def _give_back_held(self) -> None:
        held, self._held = self._held, None
        if held is not None:
            held[0].give(held[1])

    def _wait_for_release(self, wait_s: float) -> None:
        node, conn = self._held
        self._held = None
        try:
            _io.block_on_signal(node, conn, self.name, wait_s)
        finally:
            node.give(conn)

    def _forget_forked(self) -> None:
        """In a child forked while its parent held the lock (the caller checked: a lease, granted
        to another process): forget the parent's lease (no node is touched: the lock is the
        parent's) and raise :class:`LockError` saying so."""
        parent = self._pid
        self._lease = self._watchdog = self._held = None
        unclaim(self)
        raise self._error(LockError, forked_message(parent))

    def release(self) -> None:
        """Give the lock up; raises :class:`NotOwned` if this token no longer holds it.

        Any thread (or task) may release the lease this object holds; a child forked while the
        lock was held may not (:class:`LockError`, no node touched): the lock is its parent's."""
        if self._lease is not None and self._pid != Process.id:
            self._forget_forked()
        lease = self._lease
        if lease is None:
            raise self._error(NotOwned, "release of a lock this object does not hold")
        if self._watchdog is not None:
            self._stop_watchdog()
        # The claim's release is the one atomic step: of two threads releasing at once, the second
        # finds it released and holds nothing.
        self._lease = None
        try:
            self._claim.release()
        except RuntimeError:
            raise self._error(NotOwned, "release of a lock this object does not hold") from None
        try:
            outcome = self._unlock(lease.token)
        except Exception:
            raise
        except BaseException as error:
            self._release_anyway(error, lease.token)
            raise
        if outcome == AMBIGUOUS:
            log_ambiguous_release(self.name, lease.fence)
        elif outcome != RELEASED:
            raise self._error(NotOwned, REFUSALS[outcome] + self._refusal_detail)

    def extend(self, *, ttl_ms: int | None = None) -> Lease:
        """Reset the lease to ``ttl_ms`` (default: the lock's TTL) from now; at most ``max_extensions`` times.

        ``ttl_ms`` is refused (ValueError) unless a whole number of ms from 3 to 2**31 - 1, as the
        constructor's: -1 deleted the key, and 0 meant the default."""
        if ttl_ms is not None:
            ttl_ms = checked_ttl(ttl_ms, name=self.name, minimum=MIN_TTL_MS)
        if self._lease is not None and self._pid != Process.id:
            self._forget_forked()
        if self._extensions >= self.max_extensions:
            raise self._error(LockError, f"extension limit reached ({self.max_extensions})")
        lease = self._renew(ttl_ms)
        self._extensions += 1
        return lease

    def advance_fence(self, past: int) -> int:
        """Raise this lease's fence above ``past`` while the lock is still held; returns the new fence.

        For the holder whose write storage refused because the row's fence (``past``) is not below
        its own: the lock service forgot its counter (a restart without persistence, a new lock
        name) and issued a fence storage has already seen. In one round trip, and only where this
        lease's token still holds the lock (checked in the same Lua step), each node's counter is
        set to ``max(counter, past) + 1``; for Redlock a majority must confirm, and nodes left
        below the highest value are raised to it before the new fence counts (the same write-back
        as a grant), so later grants still get larger fences. ``lease.fence`` is updated.
        Raises :class:`NotOwned` if the lease's validity is over or the token no longer holds the
        lock (on a majority, for Redlock): a holder that lost its lock cannot advance.

        Why this is safe only together with a storage check that also compares the row's version
        (``UPDATE ... WHERE version = :read_version AND fence < :fence``): the fence alone orders
        writers by when they were granted, and advancing re-orders this holder after every fence
        already written. Another holder may have written the row since this one read it (a paused
        holder of an older grant whose write landed late); with a fence check alone, the advanced
        fence would let this holder overwrite that write with a decision made on the stale read.
        The version check refuses that write; so the holder must re-read after a refusal and
        decide again, and then write with the advanced fence. Without persistence the counter
        can still be forgotten again; advancing repeats the recovery with one more round trip.

        ``past`` is refused (ValueError) unless a whole number from 0 to 2**53 - 1: the scripts
        compute in Lua's doubles, which are exact up to 2**53.
        """
        past = checked_fence(past, name=self.name)
        if self._lease is not None and self._pid != Process.id:
            self._forget_forked()
        lease = self._lease
        if lease is None:
            raise self._error(NotOwned, "advance_fence of a lock this object does not hold")
        if lease.remaining_ms() <= 0:
            raise self._error(NotOwned, "advance_fence after the lease's validity ended")
        fence = self._advance_nodes(lease, int(past))
        self._lease = dataclasses.replace(lease, fence=fence)
        return fence

    def _renew(self, ttl_ms: int | None = None) -> Lease:
        lease = self._lease
        if lease is None:
            raise self._error(NotOwned, "extend of a lock this object does not hold")
        self._lease = self._extend_nodes(lease, int(ttl_ms or self.ttl_ms))
        return self._lease

    def _mark_lost(self, cause: BaseException | None, message: str) -> None:
        lost = self._error(LockLost, message)
        lost.__cause__ = cause
        self._lost = lost
        if self.on_lost is not None and self._lease is not None:
            try:
                _io.call(self.on_lost, self._lease, lost)
            except Exception:  # noqa: BLE001 - the lock is lost all the same: the block still releases
                logger.exception("on_lost of %s raised; the lock is lost all the same", self.name)

    def _stop_watchdog(self) -> None:
        watchdog, self._watchdog = self._watchdog, None
        if watchdog is None:
            return
        try:
            watchdog.stop()
        except Exception:
            raise
        except BaseException as error:
            # Cancelled while awaiting the watchdog's renewal in flight (which cancels the watchdog
            # too): the block's exit, or the release, goes no further, so the release is sent here.
            lease, self._lease = self._lease, None
            if lease is not None:
                self._release_anyway(error, lease.token)
            raise

    def _release_anyway(self, error: BaseException, token: str) -> None:
        """A release cancelled (asyncio) or interrupted before its round trip was done: sent all the
        same, after a cancellation in a task of its own (as an acquire's clean-up), or the key would
        stay its whole TTL on a healthy node; one that already ran is refused again, harmlessly."""
        _io.clean_up(error, self._unlock, token)

    def __enter__(self) -> Lease:
        return self.acquire()

    def __exit__(self, exc_type, exc, tb) -> None:
        if self._lease is not None and self._pid != Process.id:  # a forked child leaving its parent's block
            self._forget_forked()
        self._stop_watchdog()
        lost = self._lost
        if lost is not None:
            with contextlib.suppress(LockError):
                self.release()
            raise_unless_interrupted(lost, exc)
            return
        lease = self._lease
        if lease is None:
            # Released under the block (by another thread or task, or in the block itself): the
            # block's writes after that were unprotected, and nothing is left to release.
            raise self._error(LockLost, "the lock was released while the block held it")
        try:
            self.release()
        except NotOwned as error:
            lost = self._error(LockLost, "the lease expired while the block held it")
            lost.__cause__ = error
            raise_unless_interrupted(lost, exc)
            return
        overrun_ms = -lease.remaining_ms()
        if overrun_ms > 0:
            # Redis may not have expired the key yet, but the safety margin was spent: another
            # holder could have been granted, so the block's writes were unprotected by time.
            lost = self._error(LockLost, f"the block ran {overrun_ms:.0f} ms past the lease's validity")
            raise_unless_interrupted(lost, exc)


def _watch(lock_of: Callable[[], BaseLock | None], dog: _io.Watchdog) -> None:
    """The watchdog's body: renew every ttl/3, at most ``max_renewals`` times; report a failed
    renewal, or the lease running out after the last one, as the loss of the lock.

    It holds its lock only through ``lock_of`` (a weak reference) and never across a wait: a lock
    object dropped while held (``await lock.acquire()`` in a task cancelled before its release) ends
    its watchdog, and the key expires by its TTL. Held strongly, it had been renewed up to 1,000 times
    (55 min at a 10 s TTL) for nobody."""
    renewals = 0
    while not dog.wait(_renewal_interval_s(lock_of)):
        lock = lock_of()
        if lock is None:
            return
        if renewals >= lock.max_renewals:
            lease = lock.lease
            del lock
            if lease is not None and not dog.wait(lease.valid_until - time.monotonic()):
                lock = lock_of()
                if lock is not None:
                    lock._mark_lost(None, f"the lease expired after the watchdog's {renewals} renewals")
            return
        try:
            lock._renew()
        except Exception as error:  # noqa: BLE001 - every failure is reported, none swallowed
            if not dog.stopped():
                lock._mark_lost(error, "the watchdog could not renew the lease")
            return
        del lock
        renewals += 1


def _renewal_interval_s(lock_of: Callable[[], BaseLock | None]) -> float:
    lock = lock_of()
    return 0.0 if lock is None else lock.ttl_ms / 3000.0
