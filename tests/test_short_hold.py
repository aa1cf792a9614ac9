"""The hold is short (issue 28): a purchase's section transaction is two messages, the reads
with the BEGIN aboard and the write with the COMMIT aboard, so the row's lock is released by the
same round trip that took it (``atomic``, which may still have to undo its units, sends its COMMIT
alone). Before, nine round trips: BEGIN, SET LOCAL, the row, the key's order, the units, the
UPDATE, the upsert, the INSERT, COMMIT; then four (``db``: five); then three (psycopg sent the
BEGIN of Django's ``atomic`` alone)."""

from __future__ import annotations

import re
import tempfile
import threading
from contextlib import contextmanager
from typing import Iterator, NamedTuple

import pytest
from django.db import connection, connections, transaction
from django.test.utils import CaptureQueriesContext
from psycopg.pq import Trace, TransactionStatus

from inventory.models import Allocation, Order, Product
from inventory.services import purchase
from inventory.strategies import get_strategy
from inventory.strategies.contract import Outcome
from inventory.strategies.prepared import expanded
from inventory.strategies.section import section_transaction
from tests.helpers import refusing_trigger

#: Messages from BEGIN to COMMIT, both included, for one confirmed purchase, per strategy.
INSIDE = {"db": 2, "optimistic": 2, "redis": 2, "redlock": 2, "atomic": 3, "redis-stock": 3}
#: Strategies whose write does not carry the COMMIT (it may roll back what it wrote).
COMMIT_ALONE = {"atomic", "redis-stock"}


#: A record of libpq's trace: who sent it (F frontend, B backend), its length, its kind, its text.
TRACE_RECORD = re.compile(r"^(?P<side>[FB])\t\d+\t(?P<kind>\w+)\t?(?P<text>.*)")


class Message(NamedTuple):
    """One SQL message as libpq's trace saw it: the start of its text (the trace shortens long
    ones), the command tags PostgreSQL answered it with, and the transaction status after it
    (``I`` idle, ``T`` in a transaction, ``E`` failed)."""

    sql: str
    tags: list[str]
    status: str


@contextmanager
def messages_sent() -> Iterator[list[Message]]:
    """The SQL messages this thread's connection sends inside the block (each one round trip):
    what went over the wire and what PostgreSQL ran, not what Django logged."""
    connection.ensure_connection()
    pgconn, sent = connection.connection.pgconn, []
    with tempfile.TemporaryFile("w+") as trace:
        pgconn.trace(trace.fileno())
        pgconn.set_trace_flags(Trace.SUPPRESS_TIMESTAMPS | Trace.REGRESS_MODE)
        try:
            yield sent
        finally:
            pgconn.untrace()
            trace.seek(0)
            for line in trace:
                record = TRACE_RECORD.match(line)
                if record is None:
                    continue  # the rest of a statement whose text runs over several lines
                side, kind, text = record["side"], record["kind"], record["text"].strip()
                if (side, kind) == ("F", "Query"):
                    sent.append(Message(expanded(text.strip('"')), [], ""))  # statements, not EXECUTEs
                elif (side, kind) == ("B", "CommandComplete") and sent:
                    sent[-1].tags.append(text.strip('"').split(" ")[0])
                elif (side, kind) == ("B", "ReadyForQuery") and sent:
                    sent[-1] = sent[-1]._replace(status=text)


def the_transaction(sent: list[Message]) -> list[Message]:
    """The messages from the one that began the section's transaction to the one that ended it."""
    begin = next(i for i, message in enumerate(sent) if "BEGIN" in message.tags)
    end = next(i for i, message in enumerate(sent) if i >= begin and message.status == "I")
    return sent[begin : end + 1]


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("name", sorted(INSIDE))
def test_a_purchase_holds_the_row_for_two_messages(name, use_strategy, make_product):
    use_strategy(name)
    make_product(stock=5, limit=3)
    assert purchase(sku="phone-x", customer="first", quantity=1).confirmed
    with messages_sent() as sent, CaptureQueriesContext(connection) as captured:
        result = purchase(sku="phone-x", customer="me", quantity=2, idempotency_key="key-1")
    assert result.confirmed
    messages = the_transaction(sent)
    assert len(messages) == INSIDE[name], messages
    # The BEGIN rides the first statement, which bounds every row-lock wait.
    assert messages[0].tags[0] == "BEGIN" and messages[0].sql.startswith("BEGIN; SELECT set_config('lock_timeout'")
    if name in COMMIT_ALONE:
        assert messages[-1].tags == ["COMMIT"], messages[-1]
    else:
        assert messages[-1].tags[-1] == "COMMIT" and len(messages[-1].tags) == 2, messages[-1]  # the write's
    # A purchase served alone binds a parameter per value: no array or JSON document.
    queries = [expanded(query["sql"]) for query in captured.captured_queries]
    write = next(sql for sql in queries if sql.startswith("WITH "))
    assert "json_" not in write and "unnest" not in write and "ARRAY[" not in write, write
    assert connection.connection.info.transaction_status == TransactionStatus.IDLE
    # What the one write statement did, from the database.
    product = Product.objects.get(sku="phone-x")
    order = Order.objects.get(pk=result.order_id)
    assert (product.stock, order.customer, order.quantity, order.idempotency_key) == (2, "me", 2, "key-1")
    assert order.strategy == name and order.created_at is not None
    assert Allocation.objects.get(product=product, customer="me").units == 2
    # The retry under the same key is answered from the order, without a write.
    again = purchase(sku="phone-x", customer="me", quantity=2, idempotency_key="key-1")
    assert again.order_id == order.pk and Product.objects.get(sku="phone-x").stock == 2


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("name", sorted(INSIDE))
def test_every_way_a_section_ends_leaves_no_transaction_open(name, use_strategy, make_product):
    """The section's BEGIN rides its first statement, so Django's ``atomic`` does not end it: a
    replay, a refusal, a sale that undoes its units (``atomic``) and a sold-out shelf must each
    leave the connection idle, with nothing written, and the next purchase served."""
    use_strategy(name)
    product = make_product(stock=3, limit=2)
    idle = TransactionStatus.IDLE
    first = purchase(sku="phone-x", customer="me", quantity=2, idempotency_key="k")
    assert first.confirmed and connection.connection.info.transaction_status == idle
    replay = purchase(sku="phone-x", customer="me", quantity=2, idempotency_key="k")
    assert replay.order_id == first.order_id and connection.connection.info.transaction_status == idle
    limit = purchase(sku="phone-x", customer="me", quantity=1)
    assert limit.outcome is Outcome.LIMIT_REACHED and connection.connection.info.transaction_status == idle
    # One unit left: two wanted. A plain read would answer from the shelf; a shelf known to this
    # process is read under the guard (atomic takes the units first, then finds no stock).
    short = purchase(sku="phone-x", customer="you", quantity=2)
    assert short.outcome is Outcome.SOLD_OUT and connection.connection.info.transaction_status == idle
    product.refresh_from_db()
    assert product.stock == 1 and Order.objects.count() == 1
    assert list(Allocation.objects.values_list("customer", "units")) == [("me", 2)]
    assert purchase(sku="phone-x", customer="you", quantity=1).confirmed
    assert connection.connection.info.transaction_status == idle


@pytest.mark.django_db(transaction=True)
def test_a_section_whose_backend_died_raises_its_own_error_and_drops_the_connection(use_strategy, make_product):
    """The section failed and its ROLLBACK cannot be sent (the backend was terminated under it):
    the section's own error is the one raised, the dead connection is dropped, and the next
    purchase gets a new one."""
    use_strategy("redis")
    make_product(stock=5, limit=3)
    other = connections.create_connection("default")
    section = section_transaction(get_strategy(), bound_by_first_statement=True)
    try:
        with pytest.raises(ValueError, match="the section's own"), section:
            with connection.cursor() as cursor:
                cursor.execute("SELECT set_config('lock_timeout', '1000', true), pg_backend_pid()")
                pid = cursor.fetchone()[1]
            with other.cursor() as cursor:
                cursor.execute("SELECT pg_terminate_backend(%s, 2000)", [pid])
            raise ValueError("the section's own")
    finally:
        other.close()
    assert connection.connection is None  # dropped
    assert purchase(sku="phone-x", customer="me", quantity=1).confirmed


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("name", ["redis", "atomic"])
def test_a_refused_limit_writes_nothing(name, use_strategy, make_product):
    use_strategy(name)
    make_product(stock=5, limit=2)
    assert purchase(sku="phone-x", customer="me", quantity=2).confirmed
    result = purchase(sku="phone-x", customer="me", quantity=1)
    assert result.outcome.value == "limit_reached"
    assert Product.objects.get(sku="phone-x").stock == 3
    assert Allocation.objects.get(customer="me").units == 2 and Order.objects.count() == 1


@pytest.mark.django_db
def test_inside_a_callers_transaction_the_write_leaves_the_commit_to_it(use_strategy, make_product):
    """The section nested in another transaction (here the test's own) is a savepoint: its write
    must not commit the caller's work, so the COMMIT does not ride with it."""
    use_strategy("db")
    make_product(stock=5, limit=3)
    with CaptureQueriesContext(connection) as captured:
        assert purchase(sku="phone-x", customer="me", quantity=1).confirmed
    assert not any(query["sql"].endswith("COMMIT") for query in captured.captured_queries)
    assert connection.in_atomic_block  # the test's transaction is still open, and sees the sale
    assert Product.objects.get(sku="phone-x").stock == 4


REFUSE_BOB, DROP_REFUSE_BOB = refusing_trigger("refuse_bob_order", table="inventory_order")


@pytest.fixture
def bob_refused(transactional_db):
    with connection.cursor() as cursor:
        cursor.execute(REFUSE_BOB)
    yield
    with connection.cursor() as cursor:
        cursor.execute(DROP_REFUSE_BOB)


@pytest.mark.parametrize("name", ["db", "redis"])
def test_a_write_refused_with_its_commit_aboard_leaves_nothing(name, bob_refused, use_strategy, make_product):
    """The write fails inside PostgreSQL (a constraint refuses bob's order): the COMMIT after it
    in the same message never runs, the stock UPDATE and the units go with the rolled-back
    transaction, and the connection serves the next purchase."""
    use_strategy(name)
    product = make_product(stock=5, limit=2)
    refused = purchase(sku="phone-x", customer="bob", quantity=1)
    assert refused.outcome is Outcome.LIMIT_REACHED and refused.constraint_hits == 1
    product.refresh_from_db()
    assert product.stock == 5 and not Allocation.objects.exists() and not Order.objects.exists()
    assert purchase(sku="phone-x", customer="ann", quantity=2).confirmed
    product.refresh_from_db()
    assert product.stock == 3 and list(Order.objects.values_list("customer", flat=True)) == ["ann"]


@pytest.mark.django_db(transaction=True)
def test_db_side_reads_see_what_the_rows_last_holder_committed(use_strategy, make_product):
    """``db`` reads the row FOR UPDATE and the customer's units in the same message: the units are
    read after the row's lock is granted, so they include what its last holder committed. Another
    connection holds the row, gives ``me`` their whole limit and commits while the purchase waits."""
    use_strategy("db")
    product = make_product(stock=5, limit=2)
    locked, answer = threading.Event(), {}

    def buy() -> None:
        try:
            locked.wait(5)
            answer["result"] = purchase(sku="phone-x", customer="me", quantity=1)
        finally:
            connections.close_all()

    buyer = threading.Thread(target=buy)
    buyer.start()
    with transaction.atomic():
        Product.objects.select_for_update().get(pk=product.pk)
        locked.set()
        _wait_for_a_row_lock_waiter()
        Allocation.objects.create(product=product, customer="me", units=2, cap=2)
        Order.objects.create(product=product, customer="me", quantity=2, strategy="db")
        Product.objects.filter(pk=product.pk).update(stock=3)
    buyer.join(10)
    # Refused by the rules on what it read, not by the units' CHECK after a stale read.
    assert answer["result"].outcome is Outcome.LIMIT_REACHED and answer["result"].constraint_hits == 0
    product.refresh_from_db()
    assert product.stock == 3 and Allocation.objects.get(customer="me").units == 2


def _wait_for_a_row_lock_waiter(timeout_s: float = 5.0) -> None:
    """Until another backend waits for a lock (the buyer's FOR UPDATE read behind ours)."""
    import time

    deadline = time.monotonic() + timeout_s
    with connections["default"].cursor() as cursor:
        while time.monotonic() < deadline:
            cursor.execute("SELECT count(*) FROM pg_locks WHERE NOT granted")
            if cursor.fetchone()[0]:
                return
            time.sleep(0.01)
    raise AssertionError("the purchase never waited for the row")


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("batch", [1, 8])
def test_redis_stock_reads_the_sale_and_the_keyed_orders_in_one_message(batch, use_strategy, make_product, settings):
    """Before its counter's script, ``redis-stock`` reads the product (its SKU names the counter)
    and the orders already placed under the purchase's key: one message of two statements, not
    two ORM queries."""
    use_strategy("redis-stock", OPTIONS={**settings.INVENTORY["OPTIONS"], "BATCH": batch})
    make_product(stock=5, limit=3)
    assert purchase(sku="phone-x", customer="first", quantity=1).confirmed
    with messages_sent() as sent:
        result = purchase(sku="phone-x", customer="me", quantity=1, idempotency_key="key-1")
    assert result.confirmed
    begin = next(i for i, message in enumerate(sent) if "BEGIN" in message.tags)
    reads = [message for message in sent[:begin] if message.sql.startswith("SELECT id, sku, stock")]
    assert len(reads) == 1 and reads[0].tags == ["SELECT", "SELECT"], sent[:begin]
    # Nothing else reads them before the section: no ORM query (the purchase's own plain read of the
    # shelf, when this process does not know it, is plain SQL on the product by SKU).
    assert not any(message.sql.startswith('SELECT "inventory_') for message in sent[:begin]), sent[:begin]
    again = purchase(sku="phone-x", customer="me", quantity=1, idempotency_key="key-1")
    assert again.order_id == result.order_id and Product.objects.get(sku="phone-x").stock == 3
