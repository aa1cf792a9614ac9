"""Every use of redis-py beyond its documented API, in one module.

The locks keep connections of their own (``_connections``) and, on the blocking hot path, write
to and read from a connection's socket directly (``_sync/io.py``): redis-py's
``send_packed_command``/``read_response`` wrap those calls in checks that cost more than the
lock's own code. That reaches into redis-py's internals, which a release may change without
notice:

* a connection's socket (``Connection._sock``) and its reply parser (``Connection._parser``): with
  hiredis, the parser's ``hiredis.Reader`` and buffer (``_reader``, ``_buffer``, the module's
  ``NOT_ENOUGH_DATA``), fed from the socket directly; without it, how the parser reports a receive
  that the kernel's timeout ended (a ``ConnectionError`` raised while handling the
  :class:`BlockingIOError`);
* connecting without the health check and without redis-py's own retry
  (``connect_check_health(check_health=False, retry_socket_connect=False)``), and on a socket the
  library connected itself, without blocking (``Connection._connect`` replaced for one call);
* the keys a pool adds to ``connection_kwargs`` that a new connection refuses or must not share;
* an asyncio connection's stream (``Connection._reader``, ``Connection._writer``) and the bytes its
  reader holds unread (asyncio's ``StreamReader._buffer``), to tell an idle connection whose
  server went away.

Beside these, ``_connections`` keeps a poll object of its own on a blocking connection (the
``_lock_poller`` attribute, read through the connection's instance ``__dict__``), which assumes only
that redis-py's connections keep one. Nothing else in the package touches a name redis-py does
not document. ``tests/locks/test_redis_py.py`` runs each function here against a real
``redis-server`` with the installed redis-py, so an upgrade that breaks one fails there, by name,
before any lock test does.
"""

from __future__ import annotations

import socket

from redis._parsers.hiredis import NOT_ENOUGH_DATA
from redis._parsers.socket import SERVER_CLOSED_CONNECTION_ERROR
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

_NO_READER = object()

#: Keys of a pool's ``connection_kwargs`` that are the pool's own bookkeeping, not connection settings.
POOL_ONLY_KWARGS = (
    "maint_notifications_config",
    "maint_notifications_pool_handler",
    "orig_host_address",
    "orig_socket_timeout",
    "orig_socket_connect_timeout",
)


def pool_kwargs(client) -> dict:
    """The settings a new connection of ``client`` (sync or asyncio) takes, without the pool's own keys."""
    kwargs = dict(client.connection_pool.connection_kwargs)
    for key in POOL_ONLY_KWARGS:
        kwargs.pop(key, None)
    return kwargs


def socket_of(conn) -> socket.socket | None:
    """The connected socket of a blocking connection, or None when it is not connected."""
    return conn._sock


def read_reply(conn):
    """Read one reply on a blocking connection (no health check, no retry); a reply that is an
    error (``ResponseError`` and its kinds, ``NoScriptError`` among them) is raised.

    With hiredis (redis-py's ``_HiredisParser``) the bytes go straight from the socket into the
    parser's own ``hiredis.Reader`` (its ``_reader``, ``_buffer`` and ``NOT_ENOUGH_DATA``): redis-py's
    ``read_response`` around the same two calls costs more than the lock's own Python per reply.
    Without hiredis the parser's ``read_response`` reads. Either way, on a socket whose kernel bounds
    the wait (``_connections.bound_blocking``) a receive that runs out raises ``TimeoutError``, as a
    socket timeout does, and a server that closed or reset the connection raises ``ConnectionError``."""
    parser = conn._parser
    reader = getattr(parser, "_reader", _NO_READER)
    reply = _read_with_parser(parser) if reader is _NO_READER else _from_reader(conn, parser, reader, 0)
    if isinstance(reply, Exception):
        raise reply
    return reply


def _from_reader(conn, parser, reader, flags: int):
    """One reply through hiredis's reader, receiving into the parser's buffer with ``flags``; with
    ``MSG_DONTWAIT``, :data:`INCOMPLETE` once the socket holds no more of it."""
    if reader is None:
        raise RedisConnectionError(SERVER_CLOSED_CONNECTION_ERROR)
    reply = reader.gets()
    while reply is NOT_ENOUGH_DATA:
        buffer = parser._buffer
        try:
            count = conn._sock.recv_into(buffer, 0, flags)
        except BlockingIOError as error:
            if flags:
                return INCOMPLETE
            raise RedisTimeoutError("no reply within the socket's timeout") from error
        except TimeoutError as error:  # a socket left with Python's own timeout
            raise RedisTimeoutError("no reply within the socket's timeout") from error
        except OSError as error:  # a reset connection comes through as a bare OSError
            raise RedisConnectionError(f"error reading from the node: {error}") from error
        if not count:
            raise RedisConnectionError(SERVER_CLOSED_CONNECTION_ERROR)
        reader.feed(buffer, 0, count)
        reply = reader.gets()
    return reply


#: What :func:`read_available` returns while the socket holds only part of a reply.
INCOMPLETE = object()


def read_available(conn):
    """One reply from what the socket already holds, without waiting: :data:`INCOMPLETE` when the
    bytes that arrived are only part of it (the caller polls again, against its own deadline); an
    error reply is raised, and a server that closed the connection raises ``ConnectionError``.

    For a round that reads several nodes against one deadline: a node whose reply arrives in two
    segments made :func:`read_reply` wait for the second for up to the socket's own timeout (the
    client's ``socket_timeout``, seconds) instead of the round's (milliseconds). With hiredis it
    reads with ``MSG_DONTWAIT`` into the parser's buffer; without it, the parser reads, which may
    block as :func:`read_reply` does."""
    parser = conn._parser
    reader = getattr(parser, "_reader", _NO_READER)
    if reader is _NO_READER:
        return read_reply(conn)
    reply = _from_reader(conn, parser, reader, socket.MSG_DONTWAIT)
    if isinstance(reply, Exception):
        raise reply
    return reply


def _read_with_parser(parser):
    try:
        return parser.read_response()
    except RedisConnectionError as error:
        # The parser reports a receive that the kernel's timeout ended as a ConnectionError.
        if isinstance(error.__context__, BlockingIOError):
            raise RedisTimeoutError(f"no reply within the socket's timeout ({error})") from error
        raise


def connect_quietly(conn) -> None:
    """Connect (handshake included: AUTH, SELECT) with no health check and no retry."""
    conn.connect_check_health(check_health=False, retry_socket_connect=False)


def stream_of(conn):
    """An asyncio connection's ``(reader, transport)``."""
    return conn._reader, conn._writer.transport


def unread_bytes(reader) -> int:
    """How many bytes an asyncio stream reader holds that nobody read yet."""
    return len(reader._buffer)


async def connect_quietly_async(conn) -> None:
    """:func:`connect_quietly` for an asyncio connection."""
    await conn.connect_check_health(check_health=False, retry_socket_connect=False)


def connect_on(conn, sock: socket.socket) -> None:
    """Make ``sock``, already connected, the connection's socket, and run its handshake on it."""
    conn._connect = lambda: sock
    try:
        connect_quietly(conn)
    finally:
        del conn._connect
