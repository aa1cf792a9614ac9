"""Start, stop or report the private 3-member etcd cluster that the ``etcd`` strategy uses."""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError

from processes.etcd_cluster import EtcdClusterError
from processes.needs import project_cluster


class Command(BaseCommand):
    requires_system_checks: list[str] = []  # runs before migrations exist
    help = "Start, stop or report the private 3-member etcd cluster used by the etcd strategy (127.0.0.1 only)."

    def add_arguments(self, parser):
        parser.add_argument("action", choices=["start", "stop", "status"])

    def handle(self, *args, action: str, **options):
        try:
            cluster = project_cluster()
            if action == "start":
                cluster.start()
            elif action == "stop":
                cluster.stop()
        except (EtcdClusterError, ValueError) as exc:
            raise CommandError(str(exc)) from exc
        down = 0
        for row in cluster.status():
            state = f"healthy (pid {row['pid']})" if row["healthy"] else ("up, not healthy" if row["pid"] else "down")
            down += not row["healthy"]
            self.stdout.write(f"{row['endpoint']:<28} {state}")
        if action == "status" and down:
            raise CommandError(
                f"{down} of {len(cluster)} etcd members are not healthy: run `python manage.py etcd_cluster start`"
            )
