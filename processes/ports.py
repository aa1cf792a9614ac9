"""Where the project's own processes listen: every default port in one place.

The project starts its own redis-server, etcd and ZooKeeper processes on 127.0.0.1 (never the machine's Redis
on 6379, which it only uses). Each user below takes its own block, so a running demo, a command
and the test suite do not meet (one shared port is marked); the suite moves its blocks per checkout.

===========  ===========================================================================================
7379-7383    the shop's five Redlock nodes (``REDLOCK_BASE_PORT``)
7390         ``flashsale``'s Locust master (its workers connect here; ``--master-port`` moves it)
7479-7481    the shop's etcd cluster, peers 10 above (``ETCD_ENDPOINTS``)
7579-7917    the test suite, slot 0: the blocks named in tests/slots.py, between the commands' ports
             (7579-7583, 7679-7746, 7879-7917); slot k moves them all by k × 1000
7779-7789    ``lockbench``: five nodes, then its etcd members (clients 7784-7786, peers 7787-7789)
7789-7793    ``simulate_pause``'s five nodes (7789 is also lockbench's last etcd peer: run one at a time)
7800-7807    ``simulate_failover``'s nodes and its master + replica
7810-7814    ``simulate_clock_jump``'s five nodes
7920-7942    the shop's ZooKeeper ensemble: clients 7920-7922, quorum +10, election +20 (``ZOOKEEPER_HOSTS``)
7950-7972    ``lockbench``'s ZooKeeper ensemble: clients 7950-7952, quorum +10, election +20 (moves with
             ``--base-port``, 171 above it)
20000-29999  ports chosen at run time (a burst's pods and balancer, the tests' own pods): any free one
             of the block, less any the machine gives out as source ports (``RUN_TIME_PORTS``)
===========  ===========================================================================================

Ports chosen at run time are never the kernel's pick (``bind`` to port 0): it picks from the ephemeral
range (``/proc/sys/net/ipv4/ip_local_port_range``, 32768-60999 by default), the same range every client
connection of the machine takes its source port from. A pod killed by the kill-pod fault lets go of its
port; a client connection (Locust's, a test worker's to PostgreSQL) may then take it as its source port
and hold it, even in TIME_WAIT, for a minute: the pod could not start on its port again.
"""

from __future__ import annotations

REDLOCK_BASE_PORT = 7379
LOCUST_MASTER_PORT = 7390
ETCD_BASE_PORT = 7479
TEST_SUITE_BASE_PORT = 7579
LOCKBENCH_BASE_PORT = 7779
SIMULATE_PAUSE_BASE_PORT = 7789
SIMULATE_FAILOVER_BASE_PORT = 7800
SIMULATE_CLOCK_JUMP_BASE_PORT = 7810
ZOOKEEPER_BASE_PORT = 7920
LOCKBENCH_ZOOKEEPER_BASE_PORT = LOCKBENCH_BASE_PORT + 171
RUN_TIME_PORTS = range(20000, 30000)
