"""Staff edit or delete a product while purchases of it run, for every strategy, on real threads.

Each test holds the product's row the way a staff save holds it (its transaction's row lock), lets
shoppers in behind it, then changes the product and commits. Afterwards the database is the judge:
every confirmed answer has its order, every refusal left nothing, no customer holds past the
limit, and the stock plus the units sold is the initial stock. No shopper's answer is a 500.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections import Counter
from unittest import mock

import pytest
from django.conf import settings
from django.contrib.admin.models import DELETION, LogEntry
from django.contrib.messages import get_messages
from django.db import connections, transaction
from django.test import Client

from inventory import services
from inventory.errors import ProductNotFound
from inventory.models import Order, Product
from inventory.services import prepare, purchase
from inventory.soldout_local import MARKS
from tests.helpers import run_threads

SHOPPERS = 6


def buy_behind(change, *, sku: str = "hot", quantity: int = 1, buy=None, readers: int = SHOPPERS) -> Counter[str]:
    """SHOPPERS threads each buy ``quantity`` while a staff thread holds the row of ``sku`` (locked
    in its transaction), then, once ``readers`` of them are past the plain read, runs
    ``change(product)`` inside that transaction and commits. Every answer's outcome, counted
    (``not_found`` for a 404, and ``raised <exception>`` for what would be a shopper's 500).
    ``buy(index)``: another way to buy, returning the answer to count (on one event loop only the
    purchases it admits read the shelf while the row is held: ``readers=0`` waits 0.5 s instead)."""
    outcomes: Counter[str] = Counter()
    guard = threading.Lock()
    held = threading.Event()
    read = threading.Semaphore(0)  # released once per shopper past its plain read (services.prepare)

    def staff() -> None:
        try:
            with transaction.atomic():
                product = Product.objects.select_for_update().get(sku=sku)
                held.set()
                # ``readers`` shoppers have read the shelf as it was (under load that took longer than
                # the 0.5 s this waited once, and six read the change instead); then they wait on the row.
                deadline = time.monotonic() + 10
                for _ in range(readers):
                    read.acquire(timeout=max(0.0, deadline - time.monotonic()))
                time.sleep(0.2 if readers else 0.5)
                change(product)
        finally:
            connections.close_all()

    def prepared(*args, **kwargs):
        try:
            return prepare(*args, **kwargs)
        finally:
            read.release()

    def shopper(index: int) -> None:
        held.wait(10)
        try:
            try:
                answer = buy(index) if buy else purchase(sku=sku, customer=f"c{index}", quantity=quantity).outcome.value
            except ProductNotFound:
                answer = "not_found"
            except Exception as exc:  # noqa: BLE001 - a shopper's 500, counted and shown
                answer = f"raised {exc!r}"
            with guard:
                outcomes[answer] += 1
        finally:
            connections.close_all()

    changing = threading.Thread(target=staff)
    changing.start()
    with mock.patch.object(services, "prepare", prepared):
        run_threads(SHOPPERS, shopper, timeout_s=60)
    changing.join(30)
    assert not changing.is_alive()
    return outcomes


@pytest.mark.slow  # every strategy, waits on the row or a sale's end: the full suite's
@pytest.mark.django_db(transaction=True)
def test_a_product_deleted_while_purchases_wait_for_it_answers_404(strategy, make_product):
    """A product with no orders yet is deleted while shoppers are between the plain read and the
    write: each of them is told the product is gone (404), none gets a 500, and nothing is left."""
    make_product("hot", stock=5, limit=1)
    outcomes = buy_behind(lambda product: product.delete())
    assert set(outcomes) <= {"not_found", "busy", "sold_out"}, outcomes  # sold out: redis-stock's counter
    assert not Product.objects.filter(sku="hot").exists()
    assert not Order.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_the_buy_form_of_a_product_deleted_while_it_waits_is_a_404_page(use_strategy, make_product):
    """The form's purchase of a product deleted under it: the "No such product" page (404), as for a
    sku that never was, not "Check your order" (400) nor a 500 from reading the product again."""
    use_strategy("db")
    make_product("hot", stock=5, limit=1)

    def buy(index: int) -> str:
        client = Client(raise_request_exception=False)
        response = client.post("/products/hot/buy", {"quantity": "1"})
        return str(response.status_code)

    outcomes = buy_behind(lambda product: product.delete(), buy=buy)
    assert set(outcomes) <= {"404", "503"}, outcomes
    assert not Order.objects.exists()


BATCHED = ["db", "optimistic", "redis", "redlock", "etcd", "atomic", "redis-stock"]


def keyed_buying_while(change, *, threads: int = 8, rounds: int = 4, buy=purchase) -> tuple[Counter[str], list[int]]:
    """``threads`` threads each buy for ``rounds`` customers of their own (limit 2), each purchase
    sent twice under one Idempotency-Key (a retry), while a staff thread calls ``change()`` three
    times; the outcomes, and the order ids the confirmed answers named."""
    outcomes: Counter[str] = Counter()
    confirmed: list[int] = []
    guard = threading.Lock()
    start = threading.Barrier(threads + 1)

    def shopper(index: int) -> None:
        start.wait()
        try:
            for k in range(rounds):
                for _ in range(2):
                    try:
                        result = buy(sku="hot", customer=f"t{index}-c{k}", quantity=1, idempotency_key=f"t{index}-k{k}")
                        answer = result.outcome.value
                    except ProductNotFound:  # renamed away for a moment: 404
                        answer, result = "not_found", None
                    except Exception as exc:  # noqa: BLE001 - a shopper's 500, counted and shown
                        answer, result = f"raised {exc!r}", None
                    with guard:
                        outcomes[answer] += 1
                        if result is not None and result.confirmed:
                            confirmed.append(result.order_id)
        finally:
            connections.close_all()

    def staff() -> None:
        start.wait()
        try:
            for _ in range(3):
                change()
                time.sleep(0.02)
        finally:
            connections.close_all()

    changing = threading.Thread(target=staff)
    changing.start()
    run_threads(threads, shopper, timeout_s=120)
    changing.join(30)
    assert not changing.is_alive()
    return outcomes, confirmed


def assert_the_sale_adds_up(sku: str = "hot") -> None:
    from django.db.models import Sum

    from inventory.audit import audit
    from inventory.models import Allocation

    report = audit(sku=sku)
    assert report.stock >= 0 and report.oversold == 0 and report.over_limit_customers == 0, report
    assert report.repeated_keys == 0, report
    assert report.orders == report.ordered == report.initial - report.stock, report
    per_customer = dict(
        Order.objects.filter(product__sku=sku)
        .values("customer")
        .annotate(units=Sum("quantity"))
        .values_list("customer", "units")
    )
    held = dict(Allocation.objects.filter(product__sku=sku).values_list("customer", "units"))
    assert {c: u for c, u in held.items() if u} == per_customer, (held, per_customer)


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    ("backend", "batch"), [(name, 1) for name in [*BATCHED, "zookeeper"]] + [(name, 4) for name in BATCHED]
)
@pytest.mark.parametrize("change", ["restock", "reset"])
def test_keyed_purchases_racing_restocks_and_resets_add_up(
    backend, batch, change, use_strategy, settings, make_product
):
    """Keyed purchases and their retries (alone, and with BATCH=4 sharing sections) while staff
    restock or reset the sale. Afterwards one order per key, every customer's units equal their orders, nobody past the
    limit, stock plus units sold is the initial stock; after restocks every confirmed answer's
    order exists (a reset deletes orders by design)."""
    from inventory.services import reset_sale, restock

    use_strategy(backend, OPTIONS={**settings.INVENTORY["OPTIONS"], "BATCH": batch})
    make_product("hot", stock=12, limit=2)
    act = (lambda: restock(sku="hot", quantity=3)) if change == "restock" else (lambda: reset_sale(sku="hot", stock=12))
    outcomes, confirmed = keyed_buying_while(act)
    assert not [answer for answer in outcomes if answer.startswith("raised")], outcomes
    assert_the_sale_adds_up()
    if change == "restock":
        assert set(confirmed) == set(Order.objects.values_list("id", flat=True)), outcomes


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_keyed_retries_racing_resets_never_fail(strategy, make_product):
    """A keyed retry reads its order's id, then the order: a reset that commits in between deletes
    it. The retry is then a purchase on the new sale (its key has no order there), never a 500."""
    from inventory.services import reset_sale

    make_product("hot", stock=1000, limit=5)
    outcomes: Counter[str] = Counter()
    guard, stop = threading.Lock(), threading.Event()

    def shopper(index: int) -> None:
        try:
            while not stop.is_set():
                try:
                    answer = purchase(
                        sku="hot", customer=f"c{index}", quantity=1, idempotency_key=f"c{index}-k"
                    ).outcome
                    answer = answer.value
                except Exception as exc:  # noqa: BLE001 - a shopper's 500, counted and shown
                    answer = f"raised {exc!r}"
                with guard:
                    outcomes[answer] += 1
        finally:
            connections.close_all()

    def staff(_: int) -> None:
        try:
            for _ in range(40):
                reset_sale(sku="hot", stock=1000)
                time.sleep(0.02)
        finally:
            stop.set()
            connections.close_all()

    run_threads(5, lambda i: staff(i) if i == 4 else shopper(i), timeout_s=60)
    assert not [answer for answer in outcomes if answer.startswith("raised")], outcomes
    assert_the_sale_adds_up()


ON_LOOP = ["db", "optimistic", "redis", "redlock", "atomic", "redis-stock"]


@contextlib.contextmanager
def one_loop():
    """One event loop on a thread of its own, as a uvicorn worker runs one: yields ``buy(**kwargs)``,
    which awaits ``apurchase`` there from any thread (a loop per shopper thread would share the
    strategy's asyncio clients across loops, which no worker does)."""
    import asyncio

    from inventory.async_purchase import aclose_loop, apurchase

    loop = asyncio.new_event_loop()
    runner = threading.Thread(target=loop.run_forever, daemon=True)
    runner.start()
    try:
        yield lambda **kwargs: asyncio.run_coroutine_threadsafe(apurchase(**kwargs), loop).result(60)
    finally:
        asyncio.run_coroutine_threadsafe(aclose_loop(), loop).result(10)  # as the worker's lifespan shutdown
        loop.call_soon_threadsafe(loop.stop)
        runner.join(10)
        loop.close()


@pytest.mark.slow  # every strategy on the loop, each waiting on the row: the full suite's
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("name", ON_LOOP)
def test_on_the_loop_a_product_deleted_while_purchases_wait_for_it_answers_404(name, use_strategy, make_product):
    """The same under ASGI's purchase (``apurchase``, the shoppers' purchases awaited on one loop)."""
    use_strategy(name)
    make_product("hot", stock=5, limit=1)
    with one_loop() as apurchase:
        outcomes = buy_behind(
            lambda product: product.delete(),
            buy=lambda index: apurchase(sku="hot", customer=f"c{index}", quantity=1).outcome.value,
            readers=0,
        )
    assert set(outcomes) <= {"not_found", "busy", "sold_out"}, outcomes
    assert not Order.objects.exists()


SLOW_ORDER = (
    """
CREATE FUNCTION slow_order() RETURNS trigger AS $$ BEGIN PERFORM pg_sleep(1); RETURN NEW; END $$ LANGUAGE plpgsql;
CREATE TRIGGER slow_order AFTER INSERT ON inventory_order FOR EACH ROW EXECUTE FUNCTION slow_order();
""",
    "DROP TRIGGER slow_order ON inventory_order; DROP FUNCTION slow_order();",
)


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("private_static_root")
@pytest.mark.parametrize("how", ["delete view", "delete action"])
def test_staff_deleting_a_product_whose_first_order_is_being_written_is_told_it_cannot(
    use_strategy, make_product, client, admin_user, how
):
    """Staff delete a product with no orders while its first purchase is writing (its order's
    INSERT slow): the delete must not go through (an order refers to the product) and staff are
    told so, not answered 500; the purchase keeps its order."""
    from django.db import connection

    use_strategy("db")
    product = make_product("hot", stock=5, limit=1)
    client.force_login(admin_user)
    create, drop = SLOW_ORDER
    with connection.cursor() as cursor:
        cursor.execute(create)
    answers = {}
    try:

        def buy() -> None:
            try:
                answers["purchase"] = purchase(sku="hot", customer="ann", quantity=1)
            finally:
                connections.close_all()

        buying = threading.Thread(target=buy)
        buying.start()
        time.sleep(0.4)  # the purchase's statement is in its order's trigger, the row updated
        if how == "delete view":
            response = client.post(f"/admin/inventory/product/{product.pk}/delete/", {"post": "yes"})
        else:
            form = {"action": "delete_selected", "_selected_action": [str(product.pk)], "post": "yes"}
            response = client.post("/admin/inventory/product/", form)
        buying.join(10)
    finally:
        with connection.cursor() as cursor:
            cursor.execute(drop)
    assert answers["purchase"].confirmed
    assert response.status_code == 302, response.status_code
    said = [str(message) for message in get_messages(response.wsgi_request)]
    assert said == [
        "Not deleted: hot has orders now (a purchase committed while the delete was being confirmed). "
        "Reset the sale first."
    ], said
    assert not LogEntry.objects.filter(action_flag=DELETION).exists()
    assert Product.objects.filter(pk=product.pk).exists()
    assert Order.objects.filter(product=product).count() == 1


def _rename(product: Product) -> None:
    product.sku = "hot-renamed"
    product.save(update_fields=["sku"])


def _close(product: Product) -> None:
    from django.utils import timezone

    product.sale_ends_at = timezone.now()
    product.save(update_fields=["sale_ends_at"])


def _lower_limit(product: Product) -> None:
    product.per_customer_limit = 1
    product.save(update_fields=["per_customer_limit"])


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("change", [_rename, _close, _lower_limit], ids=["rename", "close", "lower limit"])
@pytest.mark.parametrize("batch", [1, 4])
def test_a_product_edited_while_purchases_wait_for_it_keeps_every_unit(
    strategy, make_product, change, batch, use_strategy, settings
):
    """Staff rename the product, close its sale or lower its limit while shoppers (2 units each)
    wait on its row, alone or queued for shared sections: every confirmed answer is an order, the
    stock adds up, and no order was placed after the sale's end."""
    if batch > 1:
        if strategy == "zookeeper":
            pytest.skip("zookeeper does not batch")
        use_strategy(strategy, OPTIONS={**settings.INVENTORY["OPTIONS"], "BATCH": batch})
    make_product("hot", stock=20, limit=3)
    outcomes = buy_behind(change, quantity=2)
    assert not [answer for answer in outcomes if answer.startswith("raised")], outcomes
    product = Product.objects.get()
    orders = Order.objects.filter(product=product)
    assert outcomes["confirmed"] == orders.count(), outcomes
    assert product.stock == 20 - 2 * orders.count() >= 0
    if product.sale_ends_at is not None:
        assert not orders.filter(created_at__gte=product.sale_ends_at).exists()


@pytest.mark.slow  # the helper's own check: its shoppers start late on purpose
@pytest.mark.django_db(transaction=True)
def test_shoppers_slow_to_reach_the_shelf_still_read_it_before_the_edit(use_strategy, make_product):
    """The tests above need every shopper past its plain read before staff change the product. A
    fresh clone's run on a loaded machine once had all six read it after (six "quantity must be 1"
    under a lowered limit): the edit waits for their reads, here each 0.7 s late."""
    use_strategy("db")
    make_product("hot", stock=20, limit=3)

    def late(index: int) -> str:
        time.sleep(0.7)
        return purchase(sku="hot", customer=f"c{index}", quantity=2).outcome.value

    outcomes = buy_behind(_lower_limit, quantity=2, buy=late)
    assert not [answer for answer in outcomes if answer.startswith("raised")], outcomes
    assert sum(outcomes.values()) == SHOPPERS


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("batch", [1, 4])
def test_first_purchases_past_a_limit_lowered_while_they_wait_are_refused_by_the_strategy(
    strategy, make_product, batch, use_strategy, settings
):
    """Shoppers' first purchases (2 units each) pass the plain read under a limit of 3 and wait on
    the row; staff lower the limit to 1. Each is told "limit reached" by the strategy's own check
    (but a section that read the row before the change, which sells as before it), none by the
    database's allocation constraint: a burst's judge reads a constraint's refusal as a
    strategy that let a bad write through (seen: ``atomic`` and ``redis-stock`` inserted the new
    customer's units past the new limit, and the CHECK refused them)."""
    if batch > 1:
        if strategy == "zookeeper":
            pytest.skip("zookeeper does not batch")
        use_strategy(strategy, OPTIONS={**settings.INVENTORY["OPTIONS"], "BATCH": batch})
    make_product("hot", stock=20, limit=3)

    def buy(index: int) -> str:
        result = purchase(sku="hot", customer=f"c{index}", quantity=2)
        return result.outcome.value + (" by a constraint" if result.constraint_hits else "")

    outcomes = buy_behind(_lower_limit, quantity=2, buy=buy)
    assert not [answer for answer in outcomes if "by a constraint" in answer or answer.startswith("raised")], outcomes
    assert set(outcomes) <= {"confirmed", "limit_reached"}, outcomes  # confirmed: a section that read the old row
    sold = outcomes["confirmed"]
    assert sold == Order.objects.count() and Product.objects.get().stock == 20 - 2 * sold


@pytest.mark.django_db(transaction=True)
def test_a_keyed_retry_after_the_limit_was_lowered_gets_its_order(strategy, make_product):
    """A shopper bought 3 under the key (limit 3); staff lower the limit to 2; the shopper's retry of
    that same request (its answer lost) gets its order back, not "quantity must be between 1 and 2"
    (which says the purchase failed). A new key for 3 is still refused as bad input."""
    from inventory.errors import InvalidQuantity

    product = make_product("hot", stock=10, limit=3)
    first = purchase(sku="hot", customer="ann", quantity=3, idempotency_key="k1")
    assert first.confirmed
    product.per_customer_limit = 2
    product.save(update_fields=["per_customer_limit"])
    # The edit's message drops the row this process kept (limit 3); its listener thread can be late
    # on a loaded machine (seen: bob bought from the kept row, and k2's 3 was refused by the section,
    # "limit reached", not as bad input). Until it arrives, the section's own read still decides.
    url = settings.INVENTORY["REDIS_URL"]
    deadline = time.monotonic() + 5
    while MARKS.clear("hot", url=url) is not None:
        assert time.monotonic() < deadline, "the edit's message never dropped the kept row"
        time.sleep(0.01)
    again = purchase(sku="hot", customer="ann", quantity=3, idempotency_key="k1")
    assert again.confirmed and again.order_id == first.order_id, again
    # The process now keeps the row (limit 2) it read for another shopper: the retry still gets its order.
    assert purchase(sku="hot", customer="bob", quantity=1).confirmed
    again = purchase(sku="hot", customer="ann", quantity=3, idempotency_key="k1")
    assert again.confirmed and again.order_id == first.order_id, again
    with pytest.raises(InvalidQuantity):
        purchase(sku="hot", customer="ann", quantity=3, idempotency_key="k2")
    assert Order.objects.count() == 2 and Product.objects.get().stock == 6


@pytest.mark.slow  # every strategy, waits on the row or a sale's end: the full suite's
@pytest.mark.django_db(transaction=True)
def test_a_keyed_retry_just_after_the_sale_ended_gets_its_order(strategy, make_product):
    """The sale ends while the process still keeps the row it read (its memory lasts up to 2 s):
    the keyed retry of an order placed before the end gets that order, not "not on sale"."""
    from datetime import timedelta

    from django.utils import timezone

    make_product("hot", stock=10, limit=3, sale_ends_at=timezone.now() + timedelta(seconds=0.6))
    assert purchase(sku="hot", customer="bob", quantity=1).confirmed  # the process keeps the row
    first = purchase(sku="hot", customer="ann", quantity=2, idempotency_key="k1")
    assert first.confirmed
    time.sleep(max(0.0, (Product.objects.get().sale_ends_at - timezone.now()).total_seconds()) + 0.05)
    again = purchase(sku="hot", customer="ann", quantity=2, idempotency_key="k1")
    assert again.confirmed and again.order_id == first.order_id, again
    assert purchase(sku="hot", customer="cat", quantity=1).outcome.value == "not_on_sale"
    assert Order.objects.count() == 2


SLOW_ORDER_DELETE = (
    """
CREATE FUNCTION slow_order_delete() RETURNS trigger AS $$ BEGIN PERFORM pg_sleep(0.8); RETURN OLD; END $$
LANGUAGE plpgsql;
CREATE TRIGGER slow_order_delete BEFORE DELETE ON inventory_order FOR EACH ROW EXECUTE FUNCTION slow_order_delete();
""",
    "DROP TRIGGER slow_order_delete ON inventory_order; DROP FUNCTION slow_order_delete();",
)


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("name", ["atomic", "redis-stock", "db", "optimistic", "redis"])
def test_a_reset_while_a_holder_of_units_buys_again_neither_fails(name, use_strategy, make_product):
    """Ann holds a unit; staff reset the sale (its order deletes slow) while Ann buys again. The
    reset deletes the units after locking the row; a purchase that upserts Ann's units before it
    waits for the row would hold her units' row while the reset waits for it: a deadlock, one of
    the two failing. Both must finish: the reset done, Ann's answer true to the database."""
    from django.db import connection

    from inventory.models import Allocation
    from inventory.services import reset_sale

    use_strategy(name)
    make_product("hot", stock=10, limit=5)
    assert purchase(sku="hot", customer="ann", quantity=1).confirmed
    create, drop = SLOW_ORDER_DELETE
    with connection.cursor() as cursor:
        cursor.execute(create)
    answers = {}

    def reset() -> None:
        try:
            answers["reset"] = reset_sale(sku="hot", stock=10)
        except Exception as exc:  # noqa: BLE001 - staff's 500, shown
            answers["reset"] = exc
        finally:
            connections.close_all()

    def buy() -> None:
        try:
            answers["ann"] = purchase(sku="hot", customer="ann", quantity=1)
        except Exception as exc:  # noqa: BLE001 - a shopper's 500, shown
            answers["ann"] = exc
        finally:
            connections.close_all()

    try:
        resetting = threading.Thread(target=reset)
        resetting.start()
        time.sleep(0.3)  # the reset holds the row and is deleting the orders
        buying = threading.Thread(target=buy)
        buying.start()
        resetting.join(30)
        buying.join(30)
    finally:
        with connection.cursor() as cursor:
            cursor.execute(drop)
    assert not isinstance(answers["reset"], Exception), answers
    assert not isinstance(answers["ann"], Exception), answers
    orders = list(Order.objects.values_list("customer", "quantity"))
    held = list(Allocation.objects.values_list("customer", "units"))
    assert Product.objects.get().stock == 10 - sum(q for _, q in orders)
    if answers["ann"].confirmed:
        assert orders == [("ann", 1)] and held == [("ann", 1)], (orders, held)
    else:
        assert orders == [] and held == [], (answers, orders, held)


SLOW_REFUSE_BOB = (
    """
CREATE FUNCTION slow_refuse_bob() RETURNS trigger AS $$
BEGIN
  IF NEW.customer = 'bob' THEN
    PERFORM pg_sleep(0.5);
    RAISE EXCEPTION 'bob refused' USING ERRCODE = 'check_violation', CONSTRAINT = 'allocation_within_limit';
  END IF;
  RETURN NEW;
END $$ LANGUAGE plpgsql;
CREATE TRIGGER slow_refuse_bob BEFORE INSERT OR UPDATE ON inventory_allocation
FOR EACH ROW EXECUTE FUNCTION slow_refuse_bob();
""",
    "DROP TRIGGER slow_refuse_bob ON inventory_allocation; DROP FUNCTION slow_refuse_bob();",
)


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("name", ["optimistic", "atomic"])
def test_a_reset_during_a_batch_written_one_by_one_fails_neither(name, use_strategy, make_product):
    """A batch whose bulk write a constraint refused (bob's units) is written again one purchase per
    savepoint: ann's units first, then the stock. A reset that took the row meanwhile waits for
    ann's units to delete them while the batch waits for the row: both must finish."""
    from django.db import connection

    from inventory.batched import run_batch
    from inventory.results import Timings
    from inventory.services import reset_sale
    from inventory.strategies import get_strategy
    from inventory.strategies.batch import Ask
    from inventory.strategies.contract import NO_GRANT

    use_strategy(name)
    product = make_product("hot", stock=10, limit=5)
    assert purchase(sku="hot", customer="ann", quantity=1).confirmed
    answers = {}
    with connection.cursor() as cursor:
        cursor.execute(SLOW_REFUSE_BOB[0] + SLOW_ORDER_DELETE[0])

    def batch() -> None:
        try:
            asks = [Ask("ann", 1), Ask("bob", 1)]
            answers["batch"] = run_batch(get_strategy(), NO_GRANT, product_id=product.pk, asks=asks, timings=Timings())
        except Exception as exc:  # noqa: BLE001 - the shoppers' 500, shown
            answers["batch"] = exc
        finally:
            connections.close_all()

    def reset() -> None:
        try:
            answers["reset"] = reset_sale(sku="hot", stock=10)
        except Exception as exc:  # noqa: BLE001 - staff's 500, shown
            answers["reset"] = exc
        finally:
            connections.close_all()

    try:
        batching = threading.Thread(target=batch)
        batching.start()
        time.sleep(0.7)  # the bulk write was refused; ann's units are being written alone
        resetting = threading.Thread(target=reset)
        resetting.start()
        batching.join(30)
        resetting.join(30)
    finally:
        with connection.cursor() as cursor:
            cursor.execute(SLOW_REFUSE_BOB[1] + SLOW_ORDER_DELETE[1])
    assert not isinstance(answers["reset"], Exception), answers
    assert not isinstance(answers["batch"], Exception), answers
    assert_the_sale_adds_up()


def _staff_churn() -> None:
    """One round of everything staff do to a live sale: restock, lower and raise the limit, close and
    reopen the window, rename and rename back, start the sale over."""
    from datetime import timedelta

    from django.utils import timezone

    from inventory.services import reset_sale, restock

    restock(sku="hot", quantity=2)
    for fields in (
        {"per_customer_limit": 1},
        {"per_customer_limit": 2},
        {"sale_ends_at": timezone.now()},
        {"sale_ends_at": timezone.now() + timedelta(days=1)},
        {"sku": "hot-renamed"},
    ):
        product = Product.objects.get(sku="hot")
        for name, value in fields.items():
            setattr(product, name, value)
        product.save(update_fields=list(fields))
        time.sleep(0.01)
        if "sku" in fields:
            product.sku = "hot"
            product.save(update_fields=["sku"])
    reset_sale(sku="hot", stock=12)


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("batch", [1, 4])
def test_keyed_purchases_through_every_staff_change_add_up(strategy, batch, use_strategy, settings, make_product):
    """Keyed purchases and their retries while staff restock, edit the limit and the window, rename
    the product and back, and reset: no shopper's 500, and the sale adds up afterwards."""
    if batch > 1:
        if strategy == "zookeeper":
            pytest.skip("zookeeper does not batch")
        use_strategy(strategy, OPTIONS={**settings.INVENTORY["OPTIONS"], "BATCH": batch})
    make_product("hot", stock=12, limit=2)
    outcomes, _ = keyed_buying_while(_staff_churn)
    assert not [answer for answer in outcomes if answer.startswith("raised")], outcomes
    assert_the_sale_adds_up()


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("name", ON_LOOP)
def test_on_the_loop_keyed_purchases_through_every_staff_change_add_up(name, use_strategy, make_product):
    """The same under ASGI's purchase (``apurchase``, awaited on one event loop)."""
    use_strategy(name)
    make_product("hot", stock=12, limit=2)
    with one_loop() as apurchase:
        outcomes, _ = keyed_buying_while(_staff_churn, buy=apurchase)
    assert not [answer for answer in outcomes if answer.startswith("raised")], outcomes
    assert_the_sale_adds_up()
