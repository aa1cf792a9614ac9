"""The suite's ports never meet a port a command of the project listens on by default.

A running demo (its Redlock nodes, etcd, ZooKeeper, Locust master) or a command left running must
not make the suite fail, in any slot: processes/ports.py lays the blocks out, tests/slots.py places
the suite's inside them.
"""

from __future__ import annotations

import pytest

from processes import ports
from tests import slots

# The commands' default ports: (first, last) inclusive, as processes/ports.py's table gives them.
COMMAND_PORTS = [
    (ports.REDLOCK_BASE_PORT, ports.REDLOCK_BASE_PORT + 4),
    (ports.LOCUST_MASTER_PORT, ports.LOCUST_MASTER_PORT),
    (ports.ETCD_BASE_PORT, ports.ETCD_BASE_PORT + 12),
    (ports.LOCKBENCH_BASE_PORT, ports.LOCKBENCH_BASE_PORT + 10),
    (ports.SIMULATE_PAUSE_BASE_PORT, ports.SIMULATE_PAUSE_BASE_PORT + 4),
    (ports.SIMULATE_FAILOVER_BASE_PORT, ports.SIMULATE_FAILOVER_BASE_PORT + 7),
    (ports.SIMULATE_CLOCK_JUMP_BASE_PORT, ports.SIMULATE_CLOCK_JUMP_BASE_PORT + 4),
    (ports.ZOOKEEPER_BASE_PORT, ports.ZOOKEEPER_BASE_PORT + 22),
    (ports.LOCKBENCH_ZOOKEEPER_BASE_PORT, ports.LOCKBENCH_ZOOKEEPER_BASE_PORT + 22),
]
# Every single port the suite names (a block's first port; the blocks' extents are checked by the
# tests that start them), as an offset from its slot's base.
OFFSETS = {
    name: value - slots.PORT_BASE
    for name, value in vars(slots).items()
    if name.endswith("_PORT") and name != "PORT_BASE" and isinstance(value, int)
}


@pytest.mark.parametrize("slot", range(7))
def test_no_port_of_the_suite_is_a_command_s_default(slot):
    base = ports.TEST_SUITE_BASE_PORT + 1000 * slot
    met = [
        f"{name} = {base + offset}"
        for name, offset in sorted(OFFSETS.items())
        if any(first <= base + offset <= last for first, last in COMMAND_PORTS)
    ]
    assert not met, f"slot {slot}: the suite's ports meet a command's default: {', '.join(met)}"
