"""Locust's web UI kept from freezing at STOPPING when a sale ends by itself.

The UI of Locust 2.47 asks the master for its state every 2 s only while it reads "spawning" or
"running" (its ``useFetchStats`` hook; the same in its bundle). A poll answered in the moment
between the runner's stop and its workers' answer reads "stopping" (a lone process's stop passes
through "cleanup" the same way), and the page stops asking: it shows STOPPING until someone reloads
it, the runner long stopped (upstream: locustio/locust#2046 and #2400). A sale stops its runner by
itself when it ends (``locustfile.FlashSale.end_sale``), so anyone watching the page could meet it;
a fresh clone's ``make test`` met it four times in the UI test (the master's own state "stopped",
the page "stopping").

:func:`hold_passing_polls` holds a state poll that comes while the runner is between running and
stopped, until it has left that state or :data:`HOLD_S` has passed, and then lets Locust answer it
with the state the runner is in by then. Nothing else waits, and a poll at any other moment is
answered at once.
"""

from __future__ import annotations

import time

import gevent
from flask import request
from locust.runners import STATE_CLEANUP, STATE_STOPPING

#: The states a runner passes through on its way to "stopped": a poll that reads one ends the UI's polling.
PASSING = (STATE_STOPPING, STATE_CLEANUP)
#: The longest a state poll is held (a stop whose workers do not answer goes on in Locust's own time).
HOLD_S = 5.0
#: The route the UI polls for the runner's state (under the UI's base path, if it has one).
STATE_ROUTE = "/stats/requests"
#: How often a held poll looks at the runner's state again.
LOOK_EVERY_S = 0.02


def hold_passing_polls(web_ui, runner, *, hold_s: float = HOLD_S) -> None:
    """Make ``web_ui`` (Locust's ``WebUI``) hold a state poll while ``runner`` is stopping."""

    @web_ui.app.before_request
    def wait_out_a_stop() -> None:
        if not request.path.endswith(STATE_ROUTE) or runner.state not in PASSING:
            return
        deadline = time.monotonic() + hold_s
        while runner.state in PASSING and time.monotonic() < deadline:
            gevent.sleep(LOOK_EVERY_S)
