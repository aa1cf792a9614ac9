"""``zookeeper_ensemble start|status|stop`` on the slot's ports: real ZooKeeper JVMs, data under a temporary RUN_DIR."""

from __future__ import annotations

import re
from io import StringIO

import pytest
from django.core.management import CommandError, call_command

from processes.zookeeper_ensemble import ZooKeeperEnsemble
from tests import slots

# The lock tests' block (+140..+142, quorum +150.., election +160..): run here with their own
# data directory, after or before tests/locks/test_zookeeper.py, never at the same time.
HOSTS = [f"127.0.0.1:{slots.LOCK_ZOOKEEPER_BASE_PORT + i}" for i in range(3)]


#: Slow lane: starts and stops ZooKeeper ensembles.
pytestmark = pytest.mark.slow


@pytest.fixture
def zookeeper_settings(settings, tmp_path):
    settings.INVENTORY = {**settings.INVENTORY, "ZOOKEEPER_HOSTS": HOSTS}
    settings.RUN_DIR = tmp_path
    yield settings
    ZooKeeperEnsemble.from_hosts(HOSTS, run_dir=tmp_path / "zookeeper").stop()


@pytest.mark.slow
def test_start_status_stop(zookeeper_settings, tmp_path):
    with pytest.raises(CommandError, match="3 of 3 ZooKeeper members are not serving: run `python manage.py zookeep"):
        call_command("zookeeper_ensemble", "status", stdout=StringIO())
    out = StringIO()
    call_command("zookeeper_ensemble", "start", stdout=out)
    text = out.getvalue()
    assert re.search(r"serving \d+\.\d+ s after the start", text)
    assert text.count("leader (pid") == 1 and text.count("follower (pid") == 2 and "MB resident" in text
    config = (tmp_path / "zookeeper" / f"zk-{slots.LOCK_ZOOKEEPER_BASE_PORT}.cfg").read_text()
    assert "admin.enableServer=false" in config and f"clientPort={slots.LOCK_ZOOKEEPER_BASE_PORT}" in config
    call_command("zookeeper_ensemble", "stop", stdout=StringIO())
    assert len(list((tmp_path / "zookeeper").glob("*.data/version-2"))) == 3, "data kept across a stop"


def test_hosts_that_are_not_local_ports_are_refused_in_one_line(zookeeper_settings):
    zookeeper_settings.INVENTORY = {**zookeeper_settings.INVENTORY, "ZOOKEEPER_HOSTS": ["10.0.0.1:2181"]}
    with pytest.raises(CommandError, match="the project's own ZooKeeper members are 127.0.0.1:<port>"):
        call_command("zookeeper_ensemble", "start", stdout=StringIO())
