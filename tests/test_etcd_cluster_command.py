"""``etcd_cluster start|status|stop`` on the slot's ports: real etcd processes, data under a temporary RUN_DIR."""

from __future__ import annotations

from io import StringIO

import pytest
from django.core.management import CommandError, call_command

from processes.etcd_cluster import EtcdCluster
from tests import slots

# Inside tests/locks/test_etcd.py's block (+120..+139), clear of its cluster (+120..+122, peers +130..+132).
ENDPOINTS = [f"http://127.0.0.1:{slots.ETCD_COMMAND_BASE_PORT + i}" for i in range(3)]


@pytest.fixture
def etcd_settings(settings, tmp_path):
    settings.INVENTORY = {**settings.INVENTORY, "ETCD_ENDPOINTS": ENDPOINTS}
    settings.RUN_DIR = tmp_path
    yield settings
    EtcdCluster.from_endpoints(ENDPOINTS, run_dir=tmp_path / "etcd").stop()


@pytest.mark.slow
def test_start_status_stop(etcd_settings, tmp_path):
    with pytest.raises(CommandError, match="3 of 3 etcd members are not healthy: run `python manage.py etcd_cluster"):
        call_command("etcd_cluster", "status", stdout=StringIO())
    out = StringIO()
    call_command("etcd_cluster", "start", stdout=out)
    assert out.getvalue().count("healthy (pid") == 3, out.getvalue()
    assert sorted(path.name for path in (tmp_path / "etcd").glob("*.etcd")) == [
        f"etcd-{slots.ETCD_COMMAND_BASE_PORT + i}.etcd" for i in range(3)
    ]
    call_command("etcd_cluster", "status", stdout=StringIO())
    out = StringIO()
    call_command("etcd_cluster", "stop", stdout=out)
    assert out.getvalue().count(" down") == 3, out.getvalue()
    # The data stays, so the restarted cluster continues its revisions (the lock's fences).
    assert len(list((tmp_path / "etcd").glob("*.etcd"))) == 3


def test_endpoints_that_are_not_local_ports_are_refused_in_one_line(etcd_settings):
    etcd_settings.INVENTORY = {**etcd_settings.INVENTORY, "ETCD_ENDPOINTS": ["http://10.0.0.1:2379"]}
    with pytest.raises(CommandError, match="the project's own etcd members are http://127.0.0.1:<port>"):
        call_command("etcd_cluster", "start", stdout=StringIO())
