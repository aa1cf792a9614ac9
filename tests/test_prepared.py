"""The section's statements run as named prepared statements (inventory/strategies/prepared.py):
prepared once per connection, sent as ``EXECUTE`` after that, and prepared again, without failing
the purchase, when they are gone or a migration changed a column they return."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.db import connection

from inventory.models import Order, Product
from inventory.services import purchase
from inventory.strategies.prepared import prepared_here
from tests.test_short_hold import messages_sent

STRATEGIES = ["db", "redis", "atomic", "redis-stock"]


def server_prepared() -> set[str]:
    """The prepared statements PostgreSQL holds for this thread's connection."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT name FROM pg_prepared_statements")
        return {name for (name,) in cursor.fetchall()}


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("name", STRATEGIES)
def test_a_connection_prepares_each_statement_once(name, use_strategy, make_product):
    use_strategy(name)
    make_product(stock=10, limit=3)
    assert purchase(sku="phone-x", customer="first", quantity=1, idempotency_key="k1").confirmed
    mine = prepared_here()
    assert mine and mine <= server_prepared()
    with messages_sent() as sent:
        assert purchase(sku="phone-x", customer="second", quantity=1, idempotency_key="k2").confirmed
    assert not [message for message in sent if message.sql.startswith("PREPARE")], sent
    assert prepared_here() == mine
    assert Product.objects.get(sku="phone-x").stock == 8 and Order.objects.count() == 2


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("name", ["db", "redis"])
def test_statements_gone_from_the_connection_are_prepared_again(name, use_strategy, make_product, caplog):
    """``DEALLOCATE ALL`` behind the module's back: the next section's EXECUTE fails, rolls back,
    and runs again with its statements prepared anew; the shopper sees one confirmed purchase."""
    use_strategy(name)
    make_product(stock=10, limit=3)
    assert purchase(sku="phone-x", customer="first", quantity=1).confirmed
    connection.connection.execute("DEALLOCATE ALL")
    assert not server_prepared()
    with caplog.at_level(logging.WARNING, logger="inventory.strategies.prepared"):
        result = purchase(sku="phone-x", customer="second", quantity=2)
    assert result.confirmed
    assert "prepares them anew" in caplog.text  # the stale path ran
    assert prepared_here() <= server_prepared() and prepared_here()
    assert Product.objects.get(sku="phone-x").stock == 7
    assert sorted(Order.objects.values_list("customer", "quantity")) == [("first", 1), ("second", 2)]


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("name", ["db", "atomic"])
def test_a_batch_whose_statements_are_gone_runs_again(name, use_strategy, make_product, settings, caplog):
    """The same with BATCH 8: the leader's section fails inside its transaction and the batch runs
    once more, prepared anew, instead of answering busy."""
    use_strategy(name, OPTIONS={**settings.INVENTORY["OPTIONS"], "BATCH": 8})
    make_product(stock=10, limit=3)
    assert purchase(sku="phone-x", customer="first", quantity=1).confirmed
    connection.connection.execute("DEALLOCATE ALL")
    with caplog.at_level(logging.WARNING, logger="inventory.strategies.prepared"):
        result = purchase(sku="phone-x", customer="second", quantity=2)
    assert result.confirmed, result
    assert "prepares them anew" in caplog.text
    assert Product.objects.get(sku="phone-x").stock == 7 and Order.objects.count() == 2


@pytest.mark.django_db(transaction=True)
def test_a_migrated_column_type_does_not_fail_a_purchase(use_strategy, make_product, caplog):
    """A column the first read returns changes type (as a migration would): PostgreSQL refuses the
    cached plan ("cached plan must not change result type"); the section runs again, prepared anew."""
    use_strategy("redis")
    make_product(stock=10, limit=3)
    assert purchase(sku="phone-x", customer="first", quantity=1).confirmed
    table = Product._meta.db_table
    with connection.cursor() as cursor:
        cursor.execute(f"ALTER TABLE {table} ALTER COLUMN per_customer_limit TYPE bigint")
    try:
        with caplog.at_level(logging.WARNING, logger="inventory.strategies.prepared"):
            result = purchase(sku="phone-x", customer="second", quantity=1)
        assert result.confirmed
        assert "prepares them anew" in caplog.text
        assert Product.objects.get(sku="phone-x").stock == 8 and Order.objects.count() == 2
    finally:
        with connection.cursor() as cursor:
            cursor.execute(f"ALTER TABLE {table} ALTER COLUMN per_customer_limit TYPE integer")


@pytest.mark.django_db(transaction=True)
def test_without_prepared_statements_the_text_is_sent(use_strategy, make_product, settings):
    settings.DATABASE_PREPARED_STATEMENTS = False
    use_strategy("redis")
    make_product(stock=10, limit=3)
    with messages_sent() as sent:
        assert purchase(sku="phone-x", customer="me", quantity=1).confirmed
    assert sent and not [message for message in sent if "EXECUTE fs_" in message.sql or "PREPARE" in message.sql]
    assert any(message.sql.startswith("BEGIN; SELECT set_config") for message in sent)


@pytest.mark.slow  # starts Django in a process of its own per case: make test runs it, make check does not
@pytest.mark.parametrize("value, expected", [("0", "False"), ("1", "True"), ("", "True")])
def test_the_setting_reads_the_environment(value, expected):
    """Read in a fresh process, as gunicorn reads the settings; unset or empty keeps the default."""
    assert settings_in_a_fresh_process(value).stdout.split() == [expected]


@pytest.mark.slow  # starts Django in a process of its own per case: make test runs it, make check does not
def test_a_bad_setting_stops_the_process_and_says_what_to_write():
    done = settings_in_a_fresh_process("maybe")
    assert done.returncode != 0
    assert done.stderr.strip().splitlines()[-1].endswith("DATABASE_PREPARED_STATEMENTS='maybe': use 1 or 0")


def settings_in_a_fresh_process(value: str) -> subprocess.CompletedProcess:
    show = "from django.conf import settings as s; print(s.DATABASE_PREPARED_STATEMENTS)"
    return subprocess.run(
        [sys.executable, "-c", f"import django; django.setup(); {show}"],
        cwd=Path(__file__).resolve().parents[1],
        env={**os.environ, "DJANGO_SETTINGS_MODULE": "shop.settings", "DATABASE_PREPARED_STATEMENTS": value},
        capture_output=True,
        text=True,
        check=False,
    )
