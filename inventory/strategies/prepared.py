"""The section's statements as named prepared statements: planned once per connection, not per run.

Django's psycopg cursor binds parameters on the client and sends the text with the simple query
protocol (which lets one message carry several statements: the riding BEGIN, the write with its
COMMIT, :mod:`.statements`). That protocol parses, analyses and plans every statement every time
it runs. For a purchase's two messages that was most of the PostgreSQL backend's CPU, spent while
the row's lock (or the guard) was held: ``scripts/section_bench.py redis`` measured 1.05 ms of
backend CPU a section with the texts, and the same two messages as ``EXECUTE``s of prepared
statements about half of it (docs/batching.md, "A short hold").

:func:`execute` sends statements (each a text with ``%s`` placeholders, and its parameters) as
``EXECUTE fs_<hash>(%s, ...)`` with the same parameters, still bound on the client and still one
statement among others in a message, so nothing else about the messages changes. The first time a
connection meets a text, the text is ``PREPARE``d on it (one round trip, on the psycopg connection
directly, so it is not counted among the section's statements and does not carry the riding
BEGIN). A prepared statement belongs to its server session: it outlives a rolled-back transaction
and ends with the connection (a pooled connection keeps it between requests).

PostgreSQL replans a prepared statement by itself when a table it reads changes (a migration, a
TRUNCATE); a change of its result's columns' types fails it instead ("cached plan must not change
result type"). A section that fails that way (or finds its statement gone) calls :func:`forget`,
which drops every prepared statement of the connection, and the next run prepares them anew.

``DATABASE_PREPARED_STATEMENTS=0`` (a setting) sends the texts as before, to measure the difference.
"""

from __future__ import annotations

import hashlib
import logging
import re
from typing import Callable, TypeVar

import psycopg
from django.conf import settings
from django.db import DatabaseError, connection
from psycopg.pq import TransactionStatus

logger = logging.getLogger(__name__)

T = TypeVar("T")

#: SQL text with ``%s`` placeholders and its parameters: ``statements.Statement``, named again here
#: because statements.py imports this module (the import contract allows no cycle).
Statement = tuple[str, list]

#: Errors after which a connection's prepared statements are dropped and prepared again.
STALE = (psycopg.errors.FeatureNotSupported, psycopg.errors.InvalidSqlStatementName)

_names: dict[str, tuple[str, str]] = {}  # statement text -> (its name, its EXECUTE with placeholders)
_texts: dict[str, str] = {}  # name -> statement text
#: The attribute of a psycopg connection that holds the names prepared on it (a connection is
#: used by one thread at a time, so no lock; it goes with the connection).
_PREPARED_ON = "flashsale_prepared"


def _known(sql: str) -> tuple[str, str]:
    """(the prepared statement's name for ``sql``, its ``EXECUTE`` with placeholders): the same
    text, the same name, in every process."""
    known = _names.get(sql)
    if known is None:
        name = "fs_" + hashlib.sha1(sql.encode()).hexdigest()[:20]
        count = sql.count("%s")
        known = (name, f"EXECUTE {name}({', '.join(['%s'] * count)})" if count else f"EXECUTE {name}")
        _texts[name] = sql
        _names[sql] = known
    return known


_EXECUTE = re.compile(r"EXECUTE (fs_[0-9a-f]{20})")


def expanded(sql: str) -> str:
    """``sql`` (a message as sent) with each ``EXECUTE fs_...`` replaced by the text this process
    prepared under that name (its arguments left after it): what the statements are, for reading
    a message in a test or a log."""
    return _EXECUTE.sub(lambda match: _texts.get(match[1], match[0]), sql)


def numbered(sql: str) -> str:
    """``sql`` with its ``%s`` placeholders numbered (``$1``, ``$2``...), as ``PREPARE`` takes them."""
    if "%%" in sql:
        raise ValueError("a prepared statement's text has no literal %: write it as a parameter")
    pieces = sql.split("%s")
    return "".join(f"{piece}${n}" for n, piece in enumerate(pieces[:-1], 1)) + pieces[-1]


def _prepared_on(raw: psycopg.Connection) -> set[str]:
    done = getattr(raw, _PREPARED_ON, None)
    if done is None:
        done = set()
        setattr(raw, _PREPARED_ON, done)
    return done


def _message(cursor, statements: tuple[Statement, ...]) -> Statement:
    """``statements`` as one message: each the ``EXECUTE`` of its prepared statement on the cursor's
    connection, ``PREPARE``d there first if it is not yet (a round trip, once per connection and
    text), run in turn by the simple query protocol (each with its own snapshot, stopping at the
    first error)."""
    params = [param for _, each in statements for param in each]
    if not settings.DATABASE_PREPARED_STATEMENTS:
        return "; ".join(sql for sql, _ in statements), params
    raw = cursor.db.connection
    done = _prepared_on(raw)
    executes = []
    for sql, _ in statements:
        name, execute_sql = _known(sql)
        if name not in done:
            with cursor.db.wrap_database_errors:
                raw.execute(f"PREPARE {name} AS {numbered(sql)}")
            done.add(name)
        executes.append(execute_sql)
    return "; ".join(executes), params


def execute(cursor, *statements: Statement, then: str = "") -> None:
    """Send ``statements`` (and ``then``, a statement without parameters such as ``COMMIT``) as one
    message on ``cursor`` (a Django cursor). Outside a transaction (a read before the section), a
    message that found its prepared statements gone or out of date is sent once more, prepared
    anew; inside one the error ends the transaction and the section runs again
    (:func:`again_if_stale`)."""
    sql, params = _message(cursor, statements)
    try:
        cursor.execute(f"{sql}; {then}" if then else sql, params)
    except DatabaseError as exc:
        raw = cursor.db.connection
        if not is_stale(exc) or raw is None or raw.info.transaction_status != TransactionStatus.IDLE:
            raise
        forget()
        sql, params = _message(cursor, statements)
        cursor.execute(f"{sql}; {then}" if then else sql, params)


def again_if_stale(run: Callable[[], T]) -> T:
    """``run()`` (a section), run once more when its prepared statements were gone or out of date
    (a migration changed a column they return): the section rolled back, nothing written, and its
    connection dropped them (``section_transaction``), so the second run prepares them anew."""
    try:
        return run()
    except DatabaseError as exc:
        if not is_stale(exc):
            raise
    return run()


def is_stale(error: BaseException) -> bool:
    """Whether ``error`` (Django's, or psycopg's) says a prepared statement is gone or out of date."""
    cause = error if isinstance(error, psycopg.Error) else error.__cause__
    return isinstance(cause, STALE)


def forget() -> None:
    """Drop this thread's connection's prepared statements (``DEALLOCATE ALL``, outside any
    transaction); the next :func:`execute` prepares each again."""
    raw = connection.connection
    if raw is None or raw.closed:
        return
    setattr(raw, _PREPARED_ON, set())
    try:
        raw.execute("DEALLOCATE ALL")
    except psycopg.Error:
        logger.warning("DEALLOCATE ALL failed: closing the connection instead", exc_info=True)
        connection.close()
    else:
        logger.warning("a prepared statement was gone or out of date: this connection prepares them anew")


def prepared_here() -> set[str]:
    """The names prepared on this thread's connection, as this process knows them (for tests)."""
    raw = connection.connection
    return set(getattr(raw, _PREPARED_ON, ())) if raw is not None else set()
