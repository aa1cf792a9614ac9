"""Where the project's own processes listen: every default port in one place.

The project starts its own redis-server and etcd processes on 127.0.0.1 (never the machine's Redis
on 6379, which it only uses). Each user below takes its own block, so a running demo, a command
and the test suite never meet; the test suite moves its whole range per checkout (tests/slots.py).

=========  ===========================================================================================
7379-7383  the shop's five Redlock nodes (``REDLOCK_BASE_PORT``)
7479-7481  the shop's etcd cluster, peers 10 above (``ETCD_ENDPOINTS``)
7579-8578  the test suite, slot 0 (each slot moves it by 1000)
7779-7789  ``lockbench``: five nodes, then its etcd members (clients 7784-7786, peers 7787-7789)
7789-7793  ``simulate_pause``'s five nodes (7789 is also lockbench's last etcd peer: run one at a time)
7800-7807  ``simulate_failover``'s nodes and its master + replica
7810-7814  ``simulate_clock_jump``'s five nodes
=========  ===========================================================================================
"""

from __future__ import annotations

REDLOCK_BASE_PORT = 7379
ETCD_BASE_PORT = 7479
TEST_SUITE_BASE_PORT = 7579
LOCKBENCH_BASE_PORT = 7779
SIMULATE_PAUSE_BASE_PORT = 7789
SIMULATE_FAILOVER_BASE_PORT = 7800
SIMULATE_CLOCK_JUMP_BASE_PORT = 7810
