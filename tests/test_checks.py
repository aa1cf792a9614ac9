"""System checks for dangerous inventory configurations (``manage.py check``), and every strategy's
self-description."""

from __future__ import annotations

from io import StringIO

import pytest
from django.core import checks
from django.core.management import call_command
from django.core.management.base import CommandError

from inventory.checks import check_inventory_strategy
from inventory.strategies import STRATEGIES, load_strategy, strategy_class
from processes.management.commands.preflight import check_redlock_servers
from processes.relay import Relay
from tests.helpers import WORKING_STRATEGIES

CONTROLS = [name for name in STRATEGIES if strategy_class(name).control]


def ids(settings, **overrides) -> list[str]:
    settings.INVENTORY = {**settings.INVENTORY, **overrides}
    return [(m.id, m.level) for m in check_inventory_strategy()]


def urls(n: int) -> list[str]:
    return [f"redis://127.0.0.1:{7000 + i}/0" for i in range(n)]


@pytest.mark.parametrize("backend", WORKING_STRATEGIES)
def test_safe_backends_pass(settings, backend):
    assert ids(settings, STRATEGY=backend) == []


@pytest.mark.parametrize("backend", CONTROLS)
def test_controls_are_a_warning(settings, backend):
    assert set(CONTROLS) == {"unsafe", "local"}
    assert ids(settings, STRATEGY=backend, ALLOW_UNSAFE=True) == [("inventory.W001", checks.WARNING)]
    # Without ALLOW_UNSAFE_STRATEGY=1 the shop refuses to build it: an error, not only a warning.
    assert ids(settings, STRATEGY=backend, ALLOW_UNSAFE=False) == [
        ("inventory.W001", checks.WARNING),
        ("inventory.E004", checks.ERROR),
    ]


def test_an_option_no_strategy_reads_is_a_warning(settings):
    assert ids(settings, STRATEGY="db", OPTIONS={"FENCED": True, "FENCD": False}) == [
        ("inventory.W003", checks.WARNING)
    ]


# Seen by a helper: each passed `manage.py check` (and preflight), then every purchase failed when
# the strategy was built: check builds it.
@pytest.mark.parametrize(
    "overrides",
    [
        {"STRATEGY": "redis", "REDIS_URL": "garbage"},
        {"STRATEGY": "redlock", "REDLOCK_URLS": ["a", "b", "c"]},
        # Three databases of one server (two of them under another name for it): Redlock refuses them.
        {
            "STRATEGY": "redlock",
            "REDLOCK_URLS": ["redis://127.0.0.1:7000/0", "redis://127.0.0.1:7000/1", "redis://localhost:7000/2"],
        },
        {"STRATEGY": "optimistic", "OPTIONS": {"MAX_RETRIES": -5}},
    ],
)
def test_a_strategy_that_cannot_be_built_is_an_error(settings, overrides):
    assert ids(settings, **overrides) == [("inventory.E004", checks.ERROR)]


@pytest.mark.parametrize("backend", ["zookeeper", "etcd"])
def test_a_strategy_that_cannot_serve_on_an_event_loop_is_an_error_under_asgi(settings, backend):
    """Seen by a helper: SHOP_SERVER=asgi with zookeeper passed check; gunicorn then refused at start."""
    assert ids(settings, STRATEGY=backend) == []
    settings.SHOP_SERVER = "asgi"
    assert ids(settings, STRATEGY=backend) == [("inventory.E005", checks.ERROR)]


@pytest.mark.parametrize("nodes", [0, 1, 2])
def test_redlock_with_fewer_than_three_nodes_is_an_error(settings, nodes):
    assert ids(settings, STRATEGY="redlock", REDLOCK_URLS=urls(nodes)) == [("inventory.E002", checks.ERROR)]


@pytest.mark.parametrize("nodes", [4, 6])
def test_redlock_with_an_even_number_of_nodes_is_a_warning(settings, nodes):
    assert ids(settings, STRATEGY="redlock", REDLOCK_URLS=urls(nodes)) == [("inventory.W002", checks.WARNING)]


@pytest.mark.parametrize("nodes", [3, 5, 7])
def test_redlock_with_an_odd_number_of_three_or_more_passes(settings, nodes):
    assert ids(settings, STRATEGY="redlock", REDLOCK_URLS=urls(nodes)) == []


def test_unknown_backend_is_an_error(settings):
    assert ids(settings, STRATEGY="postgres") == [("inventory.E001", checks.ERROR)]


def test_dotted_path_is_accepted(settings):
    assert ids(settings, STRATEGY="inventory.strategies.db.RowLockStrategy") == []


def test_dotted_path_that_does_not_import_is_an_error(settings):
    assert ids(settings, STRATEGY="inventory.strategies.db.Nowhere") == [("inventory.E001", checks.ERROR)]


@pytest.mark.parametrize("overrides", [{"LOCK_TTL_MS": 0}, {"ACQUIRE_TIMEOUT_MS": -1}])
def test_bad_timings_are_an_error(settings, overrides):
    assert ids(settings, STRATEGY="db", **overrides) == [("inventory.E003", checks.ERROR)]


def test_registered_with_django(settings):
    settings.INVENTORY = {**settings.INVENTORY, "STRATEGY": "redlock", "REDLOCK_URLS": urls(2)}
    assert "inventory.E002" in [m.id for m in checks.run_checks()]


def test_every_strategy_describes_itself(settings):
    for name in STRATEGIES:
        cls = strategy_class(name)
        assert cls.name == name and cls.guard_label and cls.check_label
        assert isinstance(cls.needs(settings.INVENTORY), list)
        assert isinstance(cls.server_env(settings.INVENTORY), dict)
        if not cls.control:
            assert load_strategy(name).name == name


def test_preflight_refuses_redlock_urls_that_reach_one_server_twice(redlock_nodes):
    """REDLOCK_URLS naming node 0 directly and through a port forward pass ``manage.py check``
    (five hosts and ports) and gave Redlock a majority of which two were one process; preflight
    now asks the servers and stops with one line naming both URLs. The nodes as configured pass."""
    urls = redlock_nodes.urls
    check_redlock_servers(urls)
    relay = Relay(target_port=redlock_nodes[0].port)
    try:
        aliased = [urls[0], relay.url, *urls[1:4]]
        with pytest.raises(CommandError, match=rf"^REDLOCK_URLS: .*127\.0\.0\.1:{relay.port}.* are one server"):
            check_redlock_servers(aliased)
    finally:
        relay.close()
    with pytest.raises(CommandError, match="REDLOCK_URLS: .*given more than once"):
        check_redlock_servers([urls[0], urls[0], urls[1]])


def test_redlock_nodes_stop_leaves_another_checkouts_nodes_and_says_so(redlock_nodes, settings, tmp_path):
    """A fresh clone's ``make nodes-stop`` beside a checkout whose nodes ran printed five lines of
    "up (pid None)" and exited 0: it had stopped nothing, and said nothing of why. Seen from a
    checkout of its own (another run dir), the suite's nodes are another checkout's."""
    own_run_dir, settings.RUN_DIR = settings.RUN_DIR, tmp_path
    out = StringIO()
    refusal = r"^5 of 5 Redlock nodes still answer \(ports .*\): not started from this checkout, so left running"
    with pytest.raises(CommandError, match=refusal):
        call_command("redlock_nodes", "stop", stdout=out)
    assert out.getvalue().count("up, not started from here (no live pid in ") == 5, out.getvalue()
    assert all(node.ping() for node in redlock_nodes), "left running"
    call_command("redlock_nodes", "status", stdout=out)  # they answer: a status is not an error
    settings.RUN_DIR = own_run_dir
    status = StringIO()
    call_command("redlock_nodes", "status", stdout=status)
    assert status.getvalue().count("up (pid ") == 5, status.getvalue()
