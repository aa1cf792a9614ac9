"""Locust's web UI kept from freezing at STOPPING when a sale stops its runner (loadtests/webui.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from django.conf import settings

from tests.slots import LOCUST_MASTER_PORT


def poll(*, hold: bool, state: str) -> dict:
    """One poll of a real master's web UI in a child (tests/locust_poll.py): what it read, how long it took."""
    done = subprocess.run(
        [sys.executable, "tests/locust_poll.py", str(LOCUST_MASTER_PORT), "1" if hold else "0", state],
        cwd=settings.BASE_DIR,
        env={**os.environ, "PYTHONPATH": str(settings.BASE_DIR)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.splitlines()[-1])


def test_a_state_poll_while_the_runner_stops_is_answered_once_it_has_stopped():
    # Seen four times in fresh clones' make test (tests/browser/test_locust_ui.py): the master's own
    # state "stopped", the page "stopping" for 20 s. Locust's page stops polling once it reads a
    # passing state; a poll in that moment now waits for the stop to end.
    assert poll(hold=False, state="stopping")["state"] == "stopping", "Locust's UI answers the passing state"
    held = poll(hold=True, state="stopping")
    assert held["state"] == "stopped" and held["took_s"] >= 0.25, held


def test_a_state_poll_at_any_other_moment_is_answered_at_once():
    answered = poll(hold=True, state="running")
    assert answered["state"] == "running" and answered["took_s"] < 0.25, answered
