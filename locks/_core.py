"""What the sync and asyncio locks share: the lease, the Lua scripts, the arithmetic (the errors are ``errors.py``).

Nothing here talks to Redis (it only tells redis-py's exceptions apart); the locks in ``_async/locks.py``
do (``_sync/locks.py`` is generated from it), through ``_async/io.py`` and ``_sync/io.py``.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import ipaddress
import logging
import operator
import os
import threading
import time
from dataclasses import dataclass
from typing import Callable, NamedTuple, Sequence, TypeVar

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from .errors import LockError

try:
    from hiredis import pack_command as _hiredis_pack
except ImportError:  # hiredis is optional for redis-py; without it commands pack the slow way
    _hiredis_pack = None

logger = logging.getLogger(__package__)


@dataclass(frozen=True)
class Lease:
    """One grant of a lock.

    ``token`` proves ownership to Redis (release and extend compare it); ``fence`` is the fencing
    token storage must check; ``valid_until`` is a ``time.monotonic()`` deadline after which the
    holder must assume it no longer owns the lock.
    """

    name: str
    token: str
    fence: int
    valid_until: float

    def remaining_ms(self) -> float:
        return (self.valid_until - time.monotonic()) * 1000.0


def new_lease(name: str, token: str, fence: int, valid_until: float) -> Lease:
    """``Lease(name, token, fence, valid_until)``, the same frozen, equal and hashable lease, built
    without the frozen dataclass's ``__init__``, which sets each field through ``object.__setattr__``:
    a grant builds one per acquire, and that ``__init__`` was about 0.55 us of it against 0.3 here
    (``timeit``; callgrind counts below in docs/locks.md)."""
    lease = object.__new__(Lease)
    fields = lease.__dict__
    fields["name"], fields["token"], fields["fence"], fields["valid_until"] = name, token, fence, valid_until
    return lease


#: One try to acquire, ``(lease, hint_ms, split)``: the :class:`Lease` if it was granted. If not,
#: ``hint_ms`` is the longest wait a refusal announced (the holder's remaining TTL), and ``split``
#: says some nodes granted but too few: every contender may have failed at once, so the next try
#: waits a random delay. A plain tuple, unpacked at once by ``acquire``: built on every attempt, a
#: NamedTuple cost 2,500 client instructions of an acquire and release (callgrind).
Attempt = tuple[Lease | None, float, bool]


class Script:
    """A Lua script with its SHA1 computed once, at import: calls send EVALSHA, never the text,
    and fall back to EVAL (which also caches the script) only on NOSCRIPT after a node restart."""

    __slots__ = ("text", "sha")

    def __init__(self, text: str) -> None:
        self.text = text
        self.sha = hashlib.sha1(text.encode()).hexdigest()


# Take the lock and, in the same atomic step, issue a fencing number.
# KEYS[1] lock key; KEYS[2] the lock's fence counter; KEYS[3] the set of waiter ids;
# KEYS[4] the hand-off window a release opens when it wakes a waiter.
# ARGV[1] token; ARGV[2] ttl in ms; ARGV[3] this caller's waiter id, '' if it was never refused
# (a newcomer); ARGV[4] '1' if a refused caller will wait (register it), '0' if it gives up
# (unregister it).
# Returns the fence (>= 1) on a grant; on a refusal, minus the ms the caller should expect to wait
# at most (<= 0), so a waiter knows how long a crashed holder can block it. A newcomer is refused
# inside a hand-off window, so the waiter a release woke is not overtaken by the releaser coming
# straight back. A refused newcomer that will wait registers under its token; the set expires a
# second after the longest wait announced, so a waiter that died is forgotten.
ACQUIRE = Script("""
local waiter = ARGV[3] ~= ''
if (waiter or redis.call('exists', KEYS[4]) == 0) and redis.call('set', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  if waiter then
    redis.call('del', KEYS[4])
    redis.call('srem', KEYS[3], ARGV[3])
  end
  return redis.call('incr', KEYS[2])
end
local wait = math.max(redis.call('pttl', KEYS[1]), redis.call('pttl', KEYS[4]), 0)
if ARGV[4] == '1' then
  redis.call('sadd', KEYS[3], waiter and ARGV[3] or ARGV[1])
  if redis.call('pttl', KEYS[3]) < wait + 1000 then redis.call('pexpire', KEYS[3], wait + 1000) end
elseif waiter then
  redis.call('srem', KEYS[3], ARGV[3])
end
return -wait
""")

# The wake-up RELEASE and ABANDON share: with waiters registered, the hand-off window (KEYS[4], for
# ARGV[3] ms) and one signal on the list (KEYS[2], kept ARGV[2] ms) that one waiter's BLPOP takes.
WAKE_NEXT_WAITER = """
if redis.call('scard', KEYS[3]) > 0 then
  redis.call('set', KEYS[4], 1, 'PX', ARGV[3])
  redis.call('del', KEYS[2])
  redis.call('rpush', KEYS[2], 1)
  redis.call('pexpire', KEYS[2], ARGV[2])
end
"""

# Compare-and-delete, then wake one waiter if any is registered.
# KEYS[1] lock key; KEYS[2] the lock's signal list; KEYS[3] the set of waiter ids;
# KEYS[4] the hand-off window.  ARGV[1] token; ARGV[2] signal lifetime in ms; ARGV[3] window ms.
# Returns 1 when released, 0 when the key is gone (expired, or the node forgot it), -1 when
# another token holds it. The signal list holds at most one element, so a release wakes one
# waiter, not a herd; it expires so a signal nobody took leaves nothing behind for long. With no
# waiter registered a release is GET, DEL and SCARD.
RELEASE = Script(
    """
local holder = redis.call('get', KEYS[1])
if holder == ARGV[1] then
  redis.call('del', KEYS[1])
"""
    + WAKE_NEXT_WAITER
    + """
  return 1
end
if holder then return -1 end
return 0
"""
)

# RELEASE, after first taking this caller's waiter ids off the waiter set: the undo of an acquire
# that gave up (cancelled, its reply lost, a round that could not reach a majority) and the release
# of a Redlock grant that left the caller registered on the nodes that refused it. Unlike RELEASE it
# also wakes the next waiter when the lock is free: a release wakes one waiter, and the one that gives
# up may be the one woken (its BLPOP took the signal, then it was cancelled), whose clean-up finds
# the lock free; the other waiters would sleep until the first holder's TTL had run out.
# KEYS as RELEASE.  ARGV[1..3] as RELEASE; ARGV[4..] the ids to unregister.  Returns as RELEASE.
ABANDON = Script(
    """
redis.call('srem', KEYS[3], unpack(ARGV, 4))
local holder = redis.call('get', KEYS[1])
if holder and holder ~= ARGV[1] then return -1 end
if holder then redis.call('del', KEYS[1]) end
"""
    + WAKE_NEXT_WAITER
    + """
if holder then return 1 end
return 0
"""
)

# Reset the lock's lifetime if this token still holds it.
# KEYS[1] lock key.  ARGV[1] token; ARGV[2] new ttl in ms.  Returns 1 when extended, else 0.
EXTEND = Script("""
if redis.call('get', KEYS[1]) == ARGV[1] then
  return redis.call('pexpire', KEYS[1], ARGV[2])
end
return 0
""")

# Redlock fencing write-back: raise a node's counter to the fence chosen from the majority, only
# on nodes where this token holds the lock (the ordering argument in __init__ relies on it).
# KEYS[1] lock key; KEYS[2] fence counter.  ARGV[1] token; ARGV[2] fence.  Returns 1 or 0.
RAISE_FENCE = Script("""
if redis.call('get', KEYS[1]) == ARGV[1] then
  local current = tonumber(redis.call('get', KEYS[2]) or '0')
  if current < tonumber(ARGV[2]) then redis.call('set', KEYS[2], ARGV[2]) end
  return 1
end
return 0
""")

# Recovery after the lock service forgot its counter: while this token holds the lock, move the
# counter past both its own value and a fence storage already holds, in one step.
# KEYS[1] lock key; KEYS[2] fence counter.  ARGV[1] token; ARGV[2] the fence to pass.
# Returns the new counter (> ARGV[2], and > every value this counter issued before), or 0 when
# the token no longer holds the lock.
ADVANCE_FENCE = Script("""
if redis.call('get', KEYS[1]) == ARGV[1] then
  local fence = math.max(tonumber(redis.call('get', KEYS[2]) or '0'), tonumber(ARGV[2])) + 1
  redis.call('set', KEYS[2], string.format('%d', fence))
  return fence
end
return 0
""")

SIGNAL_LIFETIME_MS = 2000
# How long a release keeps newcomers out so the waiter it woke can take the lock: a scheduling
# delay and one round trip; a woken waiter that died costs the lock this much idle time.
HANDOFF_WINDOW_MS = 20


def _pack(args: tuple) -> list[bytes]:
    """RESP bytes of a command whose arguments are str and int only (all the locks send)."""
    if _hiredis_pack is not None:
        return [_hiredis_pack(args)]
    parts = [b"*%d\r\n" % len(args)]
    for arg in args:
        data = str(arg).encode()
        parts.append(b"$%d\r\n%s\r\n" % (len(data), data))
    return [b"".join(parts)]


def pack_evalsha(script: Script, keys: Sequence[str], argv: Sequence) -> list[bytes]:
    """The wire bytes of EVALSHA. Lock arguments are str and int only, so hiredis can pack them
    directly (about 1 us) instead of redis-py's per-argument encoder (about 10 us)."""
    if _hiredis_pack is not None:  # the hot path: one call less than through _pack
        return [_hiredis_pack(("EVALSHA", script.sha, len(keys), *keys, *argv))]
    return _pack(("EVALSHA", script.sha, len(keys), *keys, *argv))


def pack_eval(script: Script, keys: Sequence[str], argv: Sequence) -> list[bytes]:
    """The wire bytes of EVAL, sent after NOSCRIPT: the node caches the script again."""
    return _pack(("EVAL", script.text, len(keys), *keys, *argv))


def new_token() -> str:
    return os.urandom(16).hex()


def fence_key(name: str) -> str:
    return f"{name}:fence"


def signal_key(name: str) -> str:
    return f"{name}:signal"


def waiters_key(name: str) -> str:
    return f"{name}:waiters"


def handoff_key(name: str) -> str:
    return f"{name}:handoff"


def acquire_keys(name: str) -> tuple[str, str, str, str]:
    """The keys :data:`ACQUIRE` runs on for the lock ``name``."""
    return (name, fence_key(name), waiters_key(name), handoff_key(name))


def release_keys(name: str) -> tuple[str, str, str, str]:
    """The keys :data:`RELEASE` runs on for the lock ``name``."""
    return (name, signal_key(name), waiters_key(name), handoff_key(name))


@functools.lru_cache(maxsize=1024)
def lock_keys(name: str) -> tuple[tuple[str, str, str, str], tuple[str, str, str, str]]:
    """:func:`acquire_keys` and :func:`release_keys` of ``name``, computed once per name: a lock is
    built per acquisition, mostly on the same few names."""
    return acquire_keys(name), release_keys(name)


def drift_ms(ttl_ms: int) -> float:
    """Clock drift allowance from the Redis distlock page: 1 % of the TTL plus 2 ms."""
    return ttl_ms * 0.01 + 2.0


def default_node_timeout_ms(ttl_ms: int) -> float:
    """Small against the TTL (the distlock page suggests 5-50 ms for 10 s): 50 ms, or ttl/20."""
    return max(5.0, min(50.0, ttl_ms / 20.0))


#: The suffixes of a Redis lock's helper keys (:func:`acquire_keys`, :func:`release_keys`): a lock
#: whose name ended in one would share its key with another lock's helper key.
HELPER_SUFFIXES = (":fence", ":signal", ":waiters", ":handoff")
#: The longest TTL, timeout or session a lock takes, in ms (about 24.8 days): ZooKeeper's session
#: timeout is a 32-bit field, ``poll`` takes a C int of ms, and every Lua script computes exactly
#: with it (the waiter set's PEXPIRE adds 1000 to a PTTL; Redis refused "invalid expire time",
#: or a Lua double printed as 1e+17, far above it).
MAX_MS = 2**31 - 1
#: The shortest TTL of a Redis lock: the smallest whole number of ms above its clock-drift
#: allowance (:func:`drift_ms`, 1 % + 2 ms); at 1 or 2 ms a grant was a lease already expired.
MIN_TTL_MS = 3
#: The longest etcd or ZooKeeper lock name, in bytes of UTF-8: far above any real name, far below
#: what one request may carry (etcd's 1.5 MiB, with the key several times in a transaction;
#: ZooKeeper's jute.maxbuffer, 1 MiB). A 1.6 MB name was taken by etcd's client for members not
#: answering (and retired the process's session), and made ZooKeeper drop the connection.
MAX_NAME_BYTES = 64 * 1024
#: What ``wait`` may be.
WAITS = ("notify", "poll")
#: The largest fence ``advance_fence`` passes: ADVANCE_FENCE computes ``max(counter, past) + 1`` in
#: Lua's doubles, exact up to 2**53 (past=2**53 returned 2**53, not above it).
MAX_FENCE = 2**53 - 1


def _of(name) -> str:
    return "" if name is None else f" (lock {name!r})"


def whole_number(value) -> int | None:
    """``value`` as an int if it is a whole number (an integer, or a float with no fraction), else
    None; a bool is not a number here."""
    if isinstance(value, bool):
        return None
    try:
        return operator.index(value)
    except TypeError:
        pass
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return None


def checked_ttl(ttl_ms, *, name=None, argument: str = "ttl_ms", minimum: int = 1) -> int:
    """``ttl_ms`` as an int, refused unless it is a whole number of ms from ``minimum`` to :data:`MAX_MS`."""
    ttl = whole_number(ttl_ms)
    if ttl is None or not minimum <= ttl <= MAX_MS:
        floor = "above the clock-drift allowance (1 % + 2 ms), so " if minimum == MIN_TTL_MS else ""
        raise ValueError(
            f"{argument} must be a whole number of ms {floor}from {minimum} to {MAX_MS}, got {ttl_ms!r}{_of(name)}"
        )
    return ttl


def check_ms(value, argument: str, *, name=None, positive: bool = False) -> None:
    """Refuse ``value`` unless it is a number of ms, finite, at most :data:`MAX_MS`, and above 0
    (``positive``) or at least 0. NaN passed before, and a wait on it never ended."""
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not (value > 0 if positive else value >= 0)
        or not value <= MAX_MS
    ):
        low = "above 0" if positive else "from 0"
        raise ValueError(f"{argument} must be a number of ms {low} to {MAX_MS}, got {value!r}{_of(name)}")


def checked_fence(past, *, name=None) -> int:
    """``past`` (``advance_fence``'s) as an int, refused unless a whole number from 0 to :data:`MAX_FENCE`."""
    fence = whole_number(past)
    if fence is None or not 0 <= fence <= MAX_FENCE:
        raise ValueError(f"past must be a whole number from 0 to {MAX_FENCE} (2**53 - 1), got {past!r}{_of(name)}")
    return fence


def check_count(value, argument: str, *, name=None) -> None:
    """Refuse ``value`` unless it is a whole number (an int) of 0 or more."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{argument} must be a whole number of 0 or more, got {value!r}{_of(name)}")


def check_name(name: str) -> None:
    """Refuse a name that is not a non-empty ``str`` (bytes would become their repr in every key),
    or that does not encode as UTF-8 (a lone surrogate), as every key and path is sent."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"a lock's name must be a non-empty str, got {name!r}")
    if not name.isascii():
        try:
            name.encode()
        except UnicodeEncodeError as error:
            raise ValueError(f"a lock's name must encode as UTF-8 (its keys do), got {name!r}: {error}") from None


def check_redis_name(name: str) -> None:
    """:func:`check_name`, and refuse a name that is another lock's helper key: with ``q:signal``
    a lock, a release of ``q`` would delete it, and with ``x:fence`` held, ``x`` could not be taken."""
    check_name(name)
    for suffix in HELPER_SUFFIXES:
        if name.endswith(suffix):
            raise ValueError(
                f"a Redis lock's name may not end with {', '.join(HELPER_SUFFIXES)}: {name!r} is the helper key "
                f"{suffix!r} of the lock {name[: -len(suffix)]!r}"
            )


def check_arguments(name: str, ttl_ms: int | None, timeout_ms: int) -> int | None:
    """Refuse a bad name (also one over :data:`MAX_NAME_BYTES`), TTL or acquire timeout (etcd's and
    ZooKeeper's locks; ``ttl_ms`` None for ZooKeeper's, whose session is the client's); the TTL as an int."""
    check_name(name)
    if len(name) > MAX_NAME_BYTES // 4 and len(name.encode()) > MAX_NAME_BYTES:
        raise ValueError(f"a lock's name may be at most {MAX_NAME_BYTES} bytes of UTF-8, got {len(name.encode())}")
    ttl = None if ttl_ms is None else checked_ttl(ttl_ms, name=name)
    check_ms(timeout_ms, "timeout_ms", name=name)
    return ttl


def check_redis_arguments(
    name: str, ttl_ms: int, timeout_ms: int, wait: str, retry_delay_ms: float, max_renewals: int, max_extensions: int
) -> int:
    """Every argument of a Redis lock's constructor checked (the slow path: the constructor's own
    test passes the usual ones); the TTL as an int."""
    check_redis_name(name)
    ttl = checked_ttl(ttl_ms, name=name, minimum=MIN_TTL_MS)
    check_ms(timeout_ms, "timeout_ms", name=name)
    if wait not in WAITS:
        raise ValueError(f"wait must be 'notify' or 'poll', got {wait!r}{_of(name)}")
    check_ms(retry_delay_ms, "retry_delay_ms", name=name)
    check_count(max_renewals, "max_renewals", name=name)
    check_count(max_extensions, "max_extensions", name=name)
    return ttl


def node_name(client) -> str:
    """``host:port`` of a redis-py (sync or asyncio) client, for error messages."""
    kwargs = client.connection_pool.connection_kwargs
    if "path" in kwargs:
        return f"unix:{kwargs['path']}"
    return f"{kwargs.get('host', 'localhost')}:{kwargs.get('port', 6379)}"


#: Host names that all reach this machine's loopback: a server on port P answers on each (Redis
#: binds ``127.0.0.1 -::1`` by default, and ``localhost`` resolves to one of them).
LOOPBACK_HOSTS = frozenset({"localhost", "127.0.0.1", "::1"})


def server_key(client) -> str:
    """Which Redis server a redis-py (sync or asyncio) client reaches, from its connection kwargs
    alone (no DNS lookup, no round trip): ``unix:<real path>`` for a unix socket, else
    ``<host>:<port>``, the database left out (every database of a server fails with it).

    Caught as one server: one client twice; two clients for one host and port (or socket) with
    any databases; host names differing in case or a trailing dot; one IP address spelt two ways
    (``::1`` and ``0:0:0:0:0:0:0:1``, an IPv4-mapped ``::ffff:a.b.c.d`` and ``a.b.c.d``);
    ``localhost``, ``127.0.0.1`` and ``::1`` on one port (two processes each bound to only one of
    those addresses are refused too: give them different ports); a socket path through a symlink
    or with ``..``. Not caught: a DNS name and the address it resolves to, two names for one
    machine (its LAN address and loopback, ``127.0.0.2``), one server reached over TCP and over
    its unix socket, or through a proxy or port forward: those ``Redlock.check_servers`` finds,
    asking each server its run_id (a round trip, so not here). Computed once per client
    (``NodeConnections.server``), never per lock.
    """
    kwargs = client.connection_pool.connection_kwargs
    if "path" in kwargs:
        return f"unix:{os.path.realpath(kwargs['path'])}"
    host = str(kwargs.get("host") or "localhost").lower().rstrip(".")
    try:
        address = ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        pass  # a name, compared as written
    else:
        host = str(getattr(address, "ipv4_mapped", None) or address)
    if host in LOOPBACK_HOSTS:
        host = "localhost"
    return f"{host}:{int(kwargs.get('port') or 6379)}"


def check_distinct_nodes(nodes: Sequence, clients: Sequence, name: str) -> None:
    """Refuse a Redlock given one server twice (``node.server``, :func:`server_key`): as one
    client twice, two of its databases, or two names for it. Its copies fail and restart together,
    so a majority of them could be one process, which Redlock's safety argument rules out."""
    if len({node.server for node in nodes}) == len(nodes):
        return
    seen: dict[str, int] = {}
    for index, node in enumerate(nodes):
        first = seen.setdefault(node.server, index)
        if first != index:
            given = " and ".join(
                f"{node_name(clients[i])} db {clients[i].connection_pool.connection_kwargs.get('db') or 0}"
                for i in (first, index)
            )
            raise ValueError(
                f"clients: Redlock needs independent servers, but the server {node_name(clients[first])} is given "
                f"more than once (clients {first} and {index}: {given}); databases of one server, or two names "
                f"for it, fail together{_of(name)}"
            )


# Which server a node is: the run_id of ``INFO server``, 40 hex digits a server process draws at
# random when it starts, whatever name or address it was reached by. No keys; returns the run_id.
SERVER_ID = Script("return string.match(redis.call('info', 'server'), 'run_id:(%x+)')")


def check_server_ids(replies: Sequence, node_names: Sequence[str], name: str) -> list[str | None]:
    """Each node's run_id from its :data:`SERVER_ID` reply (None for a node that did not answer
    with one: down, slow, or not Redis); :class:`ValueError` when two nodes answered the same: one
    server under two names, which :func:`check_distinct_nodes` cannot see from hosts and ports."""
    ids = [
        reply.decode() if isinstance(reply, bytes) else reply if isinstance(reply, str) else None for reply in replies
    ]
    seen: dict[str, int] = {}
    for index, run_id in enumerate(ids):
        if run_id is None:
            continue
        first = seen.setdefault(run_id, index)
        if first != index:
            raise ValueError(
                f"clients: Redlock needs independent servers, but {node_names[first]} and {node_names[index]} "
                f"(clients {first} and {index}) are one server, run_id {run_id}: two names for one Redis "
                f"(a DNS name and its address, a LAN address and loopback, TCP and its socket, a proxy or "
                f"port forward) fail together{_of(name)}"
            )
    return ids


# Redlock's reading of one round's replies (a list with, per node, its reply or its exception).
# Both twins decide through these, so the quorum rules are written once.


class Round:
    """What one script call on every node keeps (``eval_all`` in each I/O twin): the command, one
    connection and one reply per node, and the deadline every reply is read against."""

    def __init__(
        self,
        nodes: Sequence,
        script: Script,
        keys: Sequence[str],
        argv: Sequence,
        timeout_s: float,
        *,
        started: float,
        fresh: bool = False,
    ) -> None:
        self.nodes = nodes
        self.fresh = fresh
        self.script, self.keys, self.argv = script, keys, argv
        self.timeout_s = timeout_s
        self.started = started
        self.deadline = started + timeout_s
        self.packed = pack_evalsha(script, keys, argv)
        self.replies: list = [None] * len(nodes)
        self.conns: list = [None] * len(nodes)


def granted_votes(replies: Sequence) -> dict[int, int]:
    """The nodes that granted an acquire: node index → that node's fence counter."""
    return {i: r for i, r in enumerate(replies) if type(r) is int and r > 0}


def fence_and_laggards(granted: dict[int, int]) -> tuple[int, list[int]]:
    """``(fence, laggards)`` of the granting nodes (node index → that node's fence counter): the
    fence a majority's counters give (the highest), and the granting nodes whose counter is below
    it, which must have the fence written back before the lock is granted. A plain tuple, as
    :data:`Attempt`: it is unpacked at once, on every Redlock grant."""
    fence = max(granted.values())
    return fence, [i for i, counter in granted.items() if counter < fence]


def confirmations(replies: Sequence) -> int:
    """How many nodes answered 1 (fence raised, lease extended)."""
    return sum(1 for r in replies if r == 1)


def validity_ms(ttl_ms: float, start: float, drift: float, now: float | None = None) -> float:
    """What is left of a lease taken at ``start`` (monotonic) as of ``now``: ttl − elapsed − drift."""
    return ttl_ms - ((time.monotonic() if now is None else now) - start) * 1000.0 - drift


class RefusedRound(NamedTuple):
    """A round that granted nothing: the nodes that answered, the longest wait a refusal announced
    (ms), and, when too few answered to ever form a majority, why (else None)."""

    answered: list[int]
    hint_ms: float
    unavailable: str | None


def refused_round(replies: Sequence, quorum: int, node_names: Sequence[str]) -> RefusedRound:
    """The :class:`RefusedRound` of a round's replies (one per node, in ``node_names``' order)."""
    answered = [i for i, r in enumerate(replies) if type(r) is int]
    unavailable = None
    if len(answered) < quorum:
        failures = "; ".join(f"{name}: {r}" for name, r in zip(node_names, replies, strict=True) if type(r) is not int)
        unavailable = f"only {len(answered)} of {len(replies)} nodes answered, {quorum} needed ({failures})"
    hint_ms = max((-r for r in replies if type(r) is int and r <= 0), default=0)
    return RefusedRound(answered, hint_ms, unavailable)


#: What one node's release came to (:func:`release_outcome`).
RELEASED, GONE, TAKEN, AMBIGUOUS, FAILED = "released", "gone", "taken", "ambiguous", "failed"


def transport_error(reply) -> bool:
    """Whether a node's reply is a failure to talk to it (reset, refused, timed out), which a
    retry on a fresh connection may cure, rather than an answer."""
    return isinstance(reply, (RedisConnectionError, RedisTimeoutError, OSError))


def release_outcome(first, retried=None) -> str:
    """One node's release from its RELEASE reply (or exception) and, if it failed for a transport
    reason, the retry's. A retry that finds the key gone, or held by another token, after a first
    attempt that timed out is ambiguous: that first attempt may have run and deleted it, and the
    waiter it woke may have taken the lock before the retry (the hand-off window lets it in)."""
    reply = first if retried is None else retried
    if type(reply) is not int:
        return FAILED
    if reply == 1:
        return RELEASED
    if isinstance(first, RedisTimeoutError):
        return AMBIGUOUS
    return TAKEN if reply < 0 else GONE


def majority_denies(outcomes: Sequence[str], quorum: int) -> bool:
    """True when a majority answered that the token does not hold the lock (gone or another
    token's). A node that cannot be reached proves nothing either way, and its copy expires on
    its own; an ambiguous node may have released it."""
    return sum(1 for outcome in outcomes if outcome in (GONE, TAKEN)) >= quorum


def redlock_release_outcome(outcomes: Sequence[str], quorum: int) -> str:
    """A Redlock release from its nodes' outcomes: refused (taken if any node holds another token,
    else gone) when a majority denies, ambiguous if any node's answer was, else released."""
    if majority_denies(outcomes, quorum):
        return TAKEN if TAKEN in outcomes else GONE
    return AMBIGUOUS if AMBIGUOUS in outcomes else RELEASED


#: Why a release was refused, by outcome (the message of :class:`NotOwned`).
REFUSALS = {
    GONE: "release refused: the key is gone (the lease expired, or the node restarted and forgot it)",
    TAKEN: "release refused: another holder took over",
}


#: Why an acquire of a lock object that holds a lease, or is being acquired, is refused.
IN_USE = (
    "this lock object already holds a lease or is being acquired (by another thread or task); make one per acquisition"
)


class Process:
    """This process's id, kept current across ``os.fork`` (:func:`os.register_at_fork`): a lock
    compares the process its lease was granted to with it on every call, an attribute read where
    ``os.getpid()`` is a system call (glibc caches no pid)."""

    id = os.getpid()


def _forked() -> None:
    Process.id = os.getpid()


os.register_at_fork(after_in_child=_forked)


#: A lock object's claim (its ``_claim``, made in its constructor): a thread lock taken without
#: waiting, so of two threads (or tasks) acquiring one object at once only the first gets it. It was
#: a key set in the object's ``__dict__`` by ``dict.setdefault``: as atomic, but reaching for the
#: instance dictionary costs every later attribute read of the object its fast path, 7,900 client
#: instructions a RedisLock acquire and release (callgrind; 112,092 before the claim, 122,423 with it).
new_claim = threading.Lock


def claim(lock) -> bool:
    """Claim the lock object ``lock`` for one acquisition, until :func:`unclaim`; False if it is
    claimed already (held, or being acquired by another thread or task). Each try keeps
    per-acquisition state in the object."""
    return lock._claim.acquire(False)


def unclaim(lock) -> None:
    """Give up ``lock``'s claim, if it is claimed."""
    with contextlib.suppress(RuntimeError):  # not claimed: nothing to give up
        lock._claim.release()


T = TypeVar("T")


def acquire_claimed(lock, acquire: Callable[[], T]) -> T:
    """``acquire()`` with ``lock`` claimed for it (the etcd and ZooKeeper locks' ``acquire``): held,
    or being acquired by another thread, it is refused at once; any failure gives the claim up."""
    if not claim(lock):
        raise lock._error(LockError, IN_USE)
    try:
        return acquire()
    except BaseException:
        unclaim(lock)
        raise


def raise_unless_interrupted(lost: Exception, exc: BaseException | None) -> None:
    """Raise ``lost`` (a block's :class:`LockLost`), unless the block is ending by a cancellation
    (asyncio) or an interruption (KeyboardInterrupt, SystemExit): that comes through as it is and
    the loss is logged. Raised in its place, LockLost had turned a task's cancellation into an error
    (``asyncio.timeout`` said LockLost, not TimeoutError) and Ctrl-C into an exception an ``except
    Exception`` could swallow. Every lock's ``with`` ends through here."""
    if exc is not None and not isinstance(exc, Exception):
        logger.warning("%s; the block was ending by %s, which goes on", lost, type(exc).__name__)
        return
    raise lost


def forked_message(parent: int) -> str:
    """Why a lock object's lease is refused in a child forked while ``parent`` held it: the child
    has a copy of the lease (token, key, fence), not the lock, and must not release the parent's."""
    return (
        f"this lock's lease was granted to process {parent}, and this is process {os.getpid()}, forked from it "
        "while it held the lock: a forked child does not hold its parent's lock (nothing was released)"
    )


class ConsensusLockParts:
    """What the etcd and ZooKeeper locks share: their errors name the lock and its nodes, and a
    child forked while its parent held the lock holds none of it. A subclass keeps its lease in
    ``_lease``, the process it was granted to in ``_pid``, and says in :meth:`_forget_held` what
    else of the grant to drop."""

    name: str
    _lease: object
    _pid: int

    @property
    def lease(self):
        """The lease this object holds; None in a child forked while its parent held it."""
        if self._lease is not None and self._pid != os.getpid():
            return None
        return self._lease

    def node_names(self) -> list[str]:
        raise NotImplementedError

    def _forget_held(self) -> None:
        raise NotImplementedError

    def _forget_if_forked(self) -> None:
        """In a child forked while its parent held the lock: forget the parent's lease (nothing is
        deleted: the lock is the parent's) and raise :class:`LockError` saying so."""
        if self._lease is None or self._pid == os.getpid():
            return
        parent = self._pid
        self._forget_held()
        unclaim(self)
        raise self._error(LockError, forked_message(parent))

    def _error(self, cls: type[LockError], message: str) -> LockError:
        return cls(message, name=self.name, nodes=self.node_names())


def log_failed_release(name: str, node: str, error) -> None:
    logger.warning("release of %s failed on %s (%s); the key there expires by its TTL", name, node, error)


def log_ambiguous_release(name: str, fence: int) -> None:
    logger.warning(
        "release of %s (fence %s) ambiguous: the first attempt timed out and the retry found the key gone or "
        "another token's; the first attempt may have deleted it, and a waiter it woke taken the lock since",
        name,
        fence,
    )
