"""Start, stop or report the private Redis nodes that the ``redlock`` backend uses."""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError

from processes.needs import project_nodes
from processes.nodes import NodeError


class Command(BaseCommand):
    requires_system_checks: list[str] = []  # runs before migrations exist
    help = "Start, stop or report the five private redis-server processes used by Redlock (127.0.0.1 only)."

    def add_arguments(self, parser):
        parser.add_argument("action", choices=["start", "stop", "status"])

    def handle(self, *args, action: str, **options):
        nodes = project_nodes()
        try:
            if action == "start":
                nodes.start()
            elif action == "stop":
                nodes.stop()
        except NodeError as exc:
            raise CommandError(str(exc)) from exc
        down, foreign = 0, []
        for row in nodes.status():
            if not row["answers"]:
                state = "down"
            elif row["pid"] is None:
                # Another checkout's node, or one started by hand: this one has no pid for it, and
                # stop acts through its own pidfiles only.
                state = f"up, not started from here (no live pid in {row['pidfile']})"
                foreign.append(row["port"])
            else:
                state = f"up (pid {row['pid']})"
            down += not row["answers"]
            self.stdout.write(f"{row['url']:<28} {state}")
        if action == "status" and down:
            raise CommandError(
                f"{down} of {len(nodes)} Redlock nodes are down: run `python manage.py redlock_nodes start`"
            )
        if action == "stop" and foreign:
            raise CommandError(
                f"{len(foreign)} of {len(nodes)} Redlock nodes still answer (ports {', '.join(map(str, foreign))}): "
                "not started from this checkout, so left running; stop them from the checkout that started them"
            )
