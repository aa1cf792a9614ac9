"""One lock object taken from two threads at once, for the misuse tests of every lock."""

from __future__ import annotations

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
