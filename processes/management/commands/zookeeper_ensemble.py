"""Start, stop or report the private 3-member ZooKeeper ensemble that the ``zookeeper`` strategy uses."""

from __future__ import annotations

import time

from django.core.management.base import BaseCommand, CommandError

from processes.needs import project_ensemble
from processes.zookeeper_ensemble import ZooKeeperError


def resident_mb(pid: int | None) -> float | None:
    """The process's resident memory in MB (from /proc), or None."""
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except (OSError, TypeError):
        return None
    return None


class Command(BaseCommand):
    requires_system_checks: list[str] = []  # runs before migrations exist
    help = "Start, stop or report the private 3-member ZooKeeper ensemble used by the zookeeper strategy (127.0.0.1)."

    def add_arguments(self, parser):
        parser.add_argument("action", choices=["start", "stop", "status"])

    def handle(self, *args, action: str, **options):
        started = time.monotonic()
        try:
            ensemble = project_ensemble()
            if action == "start":
                ensemble.start()
                self.stdout.write(f"serving {time.monotonic() - started:.2f} s after the start")
            elif action == "stop":
                ensemble.stop()
        except (ZooKeeperError, ValueError) as exc:
            raise CommandError(str(exc)) from exc
        down = 0
        for row in ensemble.status():
            memory = resident_mb(row["pid"])
            if row["mode"]:
                state = f"{row['mode']} (pid {row['pid']}, {memory:.0f} MB resident)"
            else:
                state = "up, not serving" if row["pid"] else "down"
            down += row["mode"] is None
            self.stdout.write(f"{row['address']:<18} {state}")
        if action == "status" and down:
            raise CommandError(
                f"{down} of {len(ensemble)} ZooKeeper members are not serving: "
                "run `python manage.py zookeeper_ensemble start`"
            )
