"""Shared fixtures: real PostgreSQL (pytest-django's test database), real Redis processes."""

from __future__ import annotations

import functools
from decimal import Decimal

import pytest
import redis
from django.conf import settings
from django.test import TransactionTestCase

from inventory.soldout_local import MARKS
from inventory.strategies import reset_strategy
from processes.needs import project_nodes
from tests.helpers import FENCED_STRATEGIES, WORKING_STRATEGIES


@pytest.fixture(scope="session")
def redlock_nodes():
    """The suite's five private Redlock nodes (ports 7579+), started once and stopped at the end."""
    nodes = project_nodes()  # tests/settings.py moves them to ports 7579+
    nodes.start()
    yield nodes
    nodes.stop()


@pytest.fixture(scope="session")
def etcd_project_cluster():
    """The suite's etcd cluster (ETCD_ENDPOINTS: the slot's ports +126..+128), started if down."""
    from processes.needs import project_cluster

    cluster = project_cluster()
    started = not cluster.running()
    cluster.start()
    yield cluster
    if started:
        cluster.stop()


@pytest.fixture(scope="session")
def zookeeper_project_ensemble():
    """The suite's ZooKeeper ensemble (ZOOKEEPER_HOSTS: the slot's ports +143..+145), started if down."""
    from processes.needs import project_ensemble

    ensemble = project_ensemble()
    started = not ensemble.running()
    ensemble.start()
    yield ensemble
    if started:
        ensemble.stop()


@pytest.fixture
def fresh_redlock_nodes(redlock_nodes):
    """The Redlock nodes, all up and empty, before and after the test."""
    redlock_nodes.reset()
    yield redlock_nodes
    redlock_nodes.reset()


@pytest.fixture
def redis_client():
    """The shop's Redis (database 9 of the machine's server), emptied before and after the test."""
    client = redis.Redis.from_url(settings.INVENTORY["REDIS_URL"])
    client.flushdb()
    MARKS.drop_all(subscribed=True)  # the process's own sold-out marks too: a rolled-back test sends no message
    yield client
    client.flushdb()
    MARKS.drop_all(subscribed=True)
    client.close()


@pytest.fixture(autouse=True)
def _sale_state_in_redis(request):
    """A test on the database also gets the shop's Redis emptied: the database is rolled back
    between tests but Redis is not, and the shop keeps sold-out marks and redis-stock counters
    there by sku. A test with no database (the lock library, figures, the report, the docs) needs
    no Redis and connects to none."""
    if request.node.get_closest_marker("django_db") or {"db", "transactional_db"} & set(request.fixturenames):
        request.getfixturevalue("redis_client")


@pytest.fixture
def use_strategy(settings, request):
    """``use_strategy("redis")`` switches the configured backend for one test."""

    def switch(name: str, **overrides):
        if name == "redlock":
            request.getfixturevalue("fresh_redlock_nodes")
        if name == "redis":
            request.getfixturevalue("redis_client")
        if name == "etcd":
            request.getfixturevalue("etcd_project_cluster")
        if name == "zookeeper":
            request.getfixturevalue("zookeeper_project_ensemble")
        settings.INVENTORY = {**settings.INVENTORY, "STRATEGY": name, **overrides}

    yield switch
    reset_strategy()


@pytest.fixture(params=WORKING_STRATEGIES)
def strategy(request, use_strategy) -> str:
    """Each strategy that must work, configured for the test in turn."""
    use_strategy(request.param)
    return request.param


@pytest.fixture(params=FENCED_STRATEGIES)
def fenced_strategy(request, use_strategy) -> str:
    """Each working strategy whose writes carry a fencing token, configured for the test in turn."""
    use_strategy(request.param)
    return request.param


@pytest.fixture
def make_product(db):
    from inventory.models import Product

    def make(sku: str = "phone-x", *, stock: int = 10, limit: int = 1, **fields) -> Product:
        return Product.objects.create(
            sku=sku,
            name=fields.pop("name", sku.replace("-", " ").title()),
            price=fields.pop("price", Decimal("9.99")),
            initial_stock=stock,
            stock=stock,
            per_customer_limit=limit,
            **fields,
        )

    return make


@pytest.fixture
def private_static_root(settings, tmp_path):
    """An empty STATIC_ROOT of the test's own: WhiteNoise scans STATIC_ROOT whenever a test client
    or live server starts, which is slow on a full folder and breaks if a concurrent collectstatic
    (the burst runner's) rewrites it. Static files then come from the app directories."""
    settings.STATIC_ROOT = tmp_path / "static"
    settings.STATIC_ROOT.mkdir()


#: Test files that start ZooKeeper ensembles of their own or use the shop's.
ZOOKEEPER_FILES = ("test_zookeeper.py", "test_zookeeper_strategy.py", "test_zookeeper_ensemble_command.py")


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items):
    """A test that needs the etcd cluster is ``slow`` (:func:`_needs_etcd`). Every test that needs a
    ZooKeeper ensemble runs on one pytest-xdist worker (``xdist_group``):
    each ensemble is three JVMs, and a worker that starts its own pays their start-up CPU again.
    They are ``slow`` too, so ``make check`` starts no JVM (``make test`` runs them all)."""
    for item in items:
        params = getattr(getattr(item, "callspec", None), "params", {})
        if _needs_etcd(item, params):
            item.add_marker(pytest.mark.slow)
        if not (item.path.name in ZOOKEEPER_FILES or "zookeeper" in params.values()):
            continue
        item.add_marker(pytest.mark.slow)
        if not item.get_closest_marker("xdist_group"):
            item.add_marker(pytest.mark.xdist_group("zookeeper"))


def _needs_etcd(item, params) -> bool:
    """A test that starts its worker's etcd cluster (the fixture, or the ``etcd`` strategy) is
    ``slow`` too: each of ``make check``'s four workers paid three etcd members' start for a few
    tests (2.7 s of set-up each, 12 s of tests in all on 2026-12-06), in a lane over its minute."""
    fixtures = getattr(item, "fixturenames", ())
    return "etcd_project_cluster" in fixtures or "etcd_cluster" in fixtures or "etcd" in params.values()


#: Rows that ``migrate`` writes once and no test changes: kept when a transactional test's tables are emptied.
KEPT_TABLES = frozenset({"django_content_type", "auth_permission"})


def _empty_the_tables_that_hold_rows(test_case) -> None:
    """After a transactional test: ``TRUNCATE`` only the tables that hold rows, keeping content types
    and permissions. Django's flush truncated all 14 tables (38 ms on this PostgreSQL, each table
    new files) and then made every content type and permission again, one app at a time (58 ms,
    ``post_migrate``), for each of about 860 transactional tests; this takes 10 ms after a purchase
    test (an ``EXISTS`` per table in one query, then the three tables it wrote). It replaces
    ``TransactionTestCase._fixture_teardown``, as pytest-django builds its test cases from that class."""
    from django.db import connections

    for alias in test_case._databases_names(include_mirrors=False):
        connection = connections[alias]
        quoted = _emptied_tables(alias)
        with connection.cursor() as cursor:
            cursor.execute("SELECT " + ", ".join(f"EXISTS (SELECT 1 FROM {table})" for table in quoted))
            holding = [table for table, has_rows in zip(quoted, cursor.fetchone(), strict=True) if has_rows]
            if holding:  # CASCADE: also the empty tables that point at these (none holds a row)
                cursor.execute(f"TRUNCATE {', '.join(holding)} CASCADE")


@functools.cache
def _emptied_tables(alias: str) -> list[str]:
    """The quoted names of the tables a teardown may empty: the models' tables that exist, less
    :data:`KEPT_TABLES`; read from the catalogue once per database, not once per test."""
    from django.db import connections

    connection = connections[alias]
    tables = sorted(set(connection.introspection.django_table_names(only_existing=True)) - KEPT_TABLES)
    return [connection.ops.quote_name(table) for table in tables]


TransactionTestCase._fixture_teardown = _empty_the_tables_that_hold_rows


@pytest.fixture(autouse=True)
def _content_types_read_afresh():
    """Django caches each model's content type id in the process. When a transactional test's flush
    emptied the table, a test that then logged an admin change created the row inside its own
    transaction, which was rolled back: the next test logged against a cached id that no row had (a
    foreign-key error at teardown; seen in make test once pytest-xdist grouped again). The tables
    are kept now (:data:`KEPT_TABLES`); every test still starts with the cache empty, so an id read
    inside a transaction that is rolled back never outlives it."""
    from django.contrib.contenttypes.models import ContentType

    ContentType.objects.clear_cache()


#: What each rerun test failed on, for the summary: pytest-rerunfailures names a rerun test and
#: nothing more, and a failure seen only in a full run is otherwise lost.
RERUN_REASONS: list[tuple[str, str]] = []
#: The most of one rerun's message the summary prints: the whole of it, unless a test appended a long
#: log (the Locust UI test's master log, whose runner state comes last in its message, was cut off
#: when only the first three lines were kept).
RERUN_REASON_CHARS = 4_000


def pytest_runtest_logreport(report):
    if report.outcome == "rerun" and report.longrepr is not None:
        lines = [line[1:].strip() for line in str(report.longreprtext).splitlines() if line.startswith("E ")]
        RERUN_REASONS.append((report.nodeid, " / ".join(line for line in lines if line) or "(no message)"))


def pytest_terminal_summary(terminalreporter):
    if RERUN_REASONS:
        terminalreporter.section("what each rerun failed on")
        for nodeid, reason in RERUN_REASONS:
            cut = (
                f" … ({len(reason) - RERUN_REASON_CHARS:,} more characters)" if len(reason) > RERUN_REASON_CHARS else ""
            )
            terminalreporter.write_line(f"{nodeid}: {reason[:RERUN_REASON_CHARS]}{cut}")
