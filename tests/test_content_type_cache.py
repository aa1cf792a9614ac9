"""A test that logs an admin change after a transactional test's flush names a content type that
exists. Seen in make test once pytest-xdist grouped again: the burst group's transactional tests
ran before the admin's, and the restock test's admin log failed at teardown with a foreign-key
error on a content type id that Django had cached before the flush emptied the table
(``tests/conftest.py``: ``_content_types_read_afresh``).

pytest-django runs transactional tests after the others and tests without the database last, so
the second test here is one without the database that opens it itself, in one xdist group with
the first: it runs after the flush, in the same process."""

from __future__ import annotations

import pytest
from django.contrib.admin.models import CHANGE, LogEntry
from django.contrib.auth import get_user_model
from django.contrib.contenttypes.models import ContentType
from django.db import connection, transaction

from inventory.models import Product

pytestmark = pytest.mark.xdist_group("content-type-cache")


@pytest.mark.django_db(transaction=True)
def test_a_transactional_test_reads_a_content_type_then_its_tables_are_emptied():
    assert ContentType.objects.get_for_model(Product).pk  # cached in the process; the flush follows


def test_an_admin_log_after_the_flush_names_a_content_type_that_exists(django_db_blocker):
    with django_db_blocker.unblock(), transaction.atomic():
        user = get_user_model().objects.create_user("after-flush")
        product = Product.objects.create(sku="after-flush", name="After flush", price="1.00", stock=1, initial_stock=1)
        LogEntry.objects.log_actions(user.pk, [product], CHANGE, change_message="restocked")
        with connection.cursor() as cursor:
            cursor.execute("SET CONSTRAINTS ALL IMMEDIATE")  # what a test's teardown checks; raises here
        transaction.set_rollback(True)
