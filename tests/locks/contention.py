"""Misuse shared by every lock's tests: one lock object taken from two threads at once, and an
acquire interrupted by a signal handler's exception."""

from __future__ import annotations

import signal
import threading
import time


def shared_object_taken_by_two_threads(holder, shared, *, held_s: float) -> list[tuple[str, object]]:
    """While ``holder`` holds the lock, two threads acquire the one object ``shared`` at once; after
    ``held_s`` the holder releases. Each thread's outcome, in the order they came: ``("granted",
    lease)``, or the exception's class name and message."""
    outcomes: list[tuple[str, object]] = []

    def take() -> None:
        try:
            outcomes.append(("granted", shared.acquire()))
        except Exception as error:  # noqa: BLE001 - every outcome is the caller's to check
            outcomes.append((type(error).__name__, str(error)))

    threads = [threading.Thread(target=take) for _ in range(2)]
    for thread in threads:
        thread.start()
    time.sleep(held_s)
    holder.release()
    for thread in threads:
        thread.join(10)
    return outcomes


class Interrupted(Exception):
    """What a signal handler raises: a script's own time limit (``signal.alarm``), or Ctrl-C."""


def interrupted_in(seconds: float) -> None:
    """In this process (a child of the test), raise :class:`Interrupted` from a SIGALRM handler
    ``seconds`` from now, wherever the main thread is then."""

    def interrupt(signum, frame):
        raise Interrupted()

    signal.signal(signal.SIGALRM, interrupt)
    signal.setitimer(signal.ITIMER_REAL, seconds)
