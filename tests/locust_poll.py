"""Run alone: ``python tests/locust_poll.py PORT HOLD STATE``. A real Locust master runner (bound
to 127.0.0.1:PORT) and its web UI's Flask app; the runner is put in ``STATE`` ("stopping", or
"running"), and in "stopped" 0.3 s later, as a sale's end does (the workers' answer in between).
One poll of the UI's state route is made at once, as the page makes every 2 s; prints one JSON line:
the state it read and how long it took. ``HOLD`` 1 applies ``loadtests.webui.hold_passing_polls``
first, 0 leaves Locust's UI as it is. In a process of its own: importing Locust patches the
standard library for gevent."""

import json
import os
import sys
import time

import gevent
from locust import User, events, task
from locust.env import Environment
from locust.runners import STATE_STOPPED

from loadtests.webui import STATE_ROUTE, hold_passing_polls

STOPPED_AFTER_S = 0.3


class Idle(User):
    @task
    def nothing(self) -> None:
        pass


def main(port: int, hold: bool, state: str) -> None:
    environment = Environment(user_classes=[Idle], events=events)
    runner = environment.create_master_runner("127.0.0.1", port)
    web_ui = environment.create_web_ui("127.0.0.1", 0, delayed_start=True)
    if hold:
        hold_passing_polls(web_ui, runner)
    runner.update_state(state)
    gevent.spawn_later(STOPPED_AFTER_S, runner.update_state, STATE_STOPPED)
    started = time.monotonic()
    state = web_ui.app.test_client().get(STATE_ROUTE).get_json()["state"]
    print(json.dumps({"state": state, "took_s": round(time.monotonic() - started, 3)}), flush=True)
    os._exit(0)  # the runner's greenlets would keep the process up


if __name__ == "__main__":
    main(int(sys.argv[1]), sys.argv[2] == "1", sys.argv[3])
