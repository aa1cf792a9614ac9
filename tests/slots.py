"""Where the suite's private resources live, so that several checkouts can run it at once.

``FLASHSALE_TEST_SLOT=k`` (0 to 6, default 0) moves every private port by ``k × 1000``, picks
other databases on the machine's Redis, another PostgreSQL database and another ``RUN_DIR``. Slot 0
is the first worker of ``make test`` (and CI): Redlock nodes on 7579+, the lock tests' nodes on
7679+, Redis databases 9 and 11; its second to fourth xdist workers take slots 1 to 3.
"""

from __future__ import annotations

import os

from processes.ports import TEST_SUITE_BASE_PORT

#: Under pytest-xdist each worker takes the next slot: ``make test`` runs four, in slots 0 to 3.
WORKER = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw") or 0)
SLOT = int(os.environ.get("FLASHSALE_TEST_SLOT", "0")) + WORKER
if not 0 <= SLOT <= 6:
    raise SystemExit(f"FLASHSALE_TEST_SLOT={SLOT - WORKER} with xdist worker {WORKER}: slots 0 to 6 in all")

#: First port of the suite's range; each user of the range takes its own block inside it.
PORT_BASE = TEST_SUITE_BASE_PORT + 1000 * SLOT
REDLOCK_BASE_PORT = PORT_BASE  # the shop's five Redlock nodes (tests/conftest.py)
LOCK_TEST_BASE_PORT = PORT_BASE + 100  # tests/locks: five nodes
LOCKBENCH_BASE_PORT = PORT_BASE + 105  # tests/test_lockbench.py: five nodes; its ZooKeeper at +276..+298
LOCK_ETCD_BASE_PORT = PORT_BASE + 120  # tests/locks/test_etcd.py: three etcd members
ETCD_COMMAND_BASE_PORT = PORT_BASE + 123  # tests/test_etcd_cluster_command.py: three etcd members
ETCD_BASE_PORT = PORT_BASE + 126  # the shop's etcd cluster (tests/settings.py, tests/test_etcd_strategy.py)
# ZooKeeper members use their client port, +10 (quorum) and +20 (election).
LOCK_ZOOKEEPER_BASE_PORT = PORT_BASE + 140  # tests/locks/test_zookeeper.py: +140..+142, +150..+152, +160..+162
ZOOKEEPER_BASE_PORT = PORT_BASE + 143  # the shop's ensemble (tests/settings.py): +143..+145, +153..+155, +163..+165
SIMULATE_FAILOVER_BASE_PORT = PORT_BASE + 300  # tests/test_simulate_failover.py: eight ports
SIMULATE_CLOCK_JUMP_BASE_PORT = PORT_BASE + 310  # tests/test_simulate_clock_jump.py: five nodes
FAULTS_BASE_PORT = PORT_BASE + 320  # tests/test_fault_injectors.py: five nodes, then a master + replica
REPLICATION_BASE_PORT = PORT_BASE + 330  # tests/test_replication.py: a master + replica, then a foreign node
SIMULATE_PAUSE_BASE_PORT = PORT_BASE + 334  # tests/test_simulate_pause.py: five ports, one held busy
LOCUST_MASTER_PORT = PORT_BASE + 166  # the burst tests' Locust master (+340 put the web UI on 7920, ZooKeeper's)
LOCUST_WEB_PORT = PORT_BASE + 167  # tests/browser/test_locust_ui.py: the master's web UI

# (shop's single-lock Redis database, lock tests' database) on 127.0.0.1:6379, per slot.
_REDIS_DATABASES = [(9, 11), (1, 2), (3, 4), (5, 6), (7, 8), (12, 13), (14, 15)]
SHOP_REDIS_URL = f"redis://127.0.0.1:6379/{_REDIS_DATABASES[SLOT][0]}"
LOCK_TEST_REDIS_URL = f"redis://127.0.0.1:6379/{_REDIS_DATABASES[SLOT][1]}"
DATABASE_URL = "postgres://postgres@127.0.0.1:5432/flashsale" + (f"_s{SLOT}" if SLOT else "")
RUN_DIR_NAME = f"tests-{SLOT}"  # under the project's .run/: the slot's private processes' files
