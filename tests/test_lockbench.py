"""``lockbench`` with a tiny measuring time: the JSON has every row, each with positive figures."""

from __future__ import annotations

import json
from io import StringIO

import pytest
from django.core.management import call_command

from tests import slots

ROWS = [
    "floor-1node",
    "floor-5nodes",
    "ours-redis",
    "ours-redlock",
    "redis-py-lock",
    "python-redis-lock",
    "pottery-redlock",
    "redlock-py",
    "ours-redis-async",
    "ours-redlock-async",
    "redis-py-lock-async",
    "contended-polling",
    "contended-notified",
    "floor-etcd",
    "ours-etcd",
    "floor-zookeeper",
    "ours-zookeeper",
]  # the etcd rows: their own cluster on BASE_PORT+5..+10; the ZooKeeper rows on BASE_PORT+171..+193
# Inside the lock tests' range (7679-7690), clear of tests/locks (7679-7683).
BASE_PORT = slots.LOCKBENCH_BASE_PORT


@pytest.mark.slow
def test_lockbench_writes_every_row_with_positive_figures(tmp_path):
    path = tmp_path / "lockbench.json"
    out, err = StringIO(), StringIO()
    call_command("lockbench", json=str(path), seconds=0.3, base_port=BASE_PORT, stdout=out, stderr=err)
    rows = json.loads(path.read_text())["rows"]
    assert [row["name"] for row in rows] == ROWS
    for row in rows:
        assert row["ops_per_s"] > 0 and row["us_per_op"] > 0, row
        if row["name"].startswith("contended-"):
            assert row["p99_wait_ms"] > 0, row
    text = out.getvalue()
    assert "ours-redlock / pottery-redlock" in text and "ours-redis-async / redis-py-lock-async" in text
    assert "round" in err.getvalue()
