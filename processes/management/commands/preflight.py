"""Check the machine's services the shop needs (PostgreSQL, Redis); create the database and start the
Redlock nodes (processes of the project)."""

from __future__ import annotations

import psycopg
from django.conf import settings
from django.core.management.base import BaseCommand, CommandError
from psycopg import sql

from processes.needs import project_nodes
from processes.nodes import NodeError, ping_error


def ensure_database() -> bool:
    """Create the configured database if it is missing; True when it was created."""
    db = settings.DATABASES["default"]
    params = {
        "host": db.get("HOST") or "127.0.0.1",
        "port": db.get("PORT") or 5432,
        "user": db.get("USER") or "postgres",
        "password": db.get("PASSWORD") or None,
        "dbname": "postgres",
        "connect_timeout": 5,
        "autocommit": True,
    }
    try:
        with psycopg.connect(**params) as conn:
            exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [db["NAME"]]).fetchone()
            if exists:
                return False
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(db["NAME"])))
            return True
    except psycopg.OperationalError as exc:
        reason = str(exc).strip().splitlines()[0]
        where = f"PostgreSQL at {params['host']}:{params['port']}"
        if "FATAL:" in str(exc):  # the server answered: a role, password or database it refused
            raise CommandError(
                f"{where} answered and refused the login ({reason}): check DATABASE_URL's user and password"
            ) from exc
        raise CommandError(
            f"{where} does not answer ({reason}): install and start it (Debian: apt-get install postgresql)"
        ) from exc


class Command(BaseCommand):
    requires_system_checks: list[str] = []  # runs before migrations exist
    help = "Check PostgreSQL and Redis, create the database if missing, start the private Redlock nodes."

    def add_arguments(self, parser):
        parser.add_argument("--no-nodes", action="store_true", help="do not start the Redlock nodes")

    def handle(self, *args, no_nodes: bool = False, **options):
        if ensure_database():
            self.stdout.write(f"created database {settings.DATABASES['default']['NAME']}")
        url = settings.INVENTORY["REDIS_URL"]
        error = ping_error(url, timeout_s=2)
        if error is not None:
            raise CommandError(
                f"Redis at {url} does not answer ({error}): install and start it (Debian: apt-get install redis-server)"
            ) from error
        if not no_nodes:
            try:
                project_nodes().start()
            except NodeError as exc:
                raise CommandError(str(exc)) from exc
        nodes = "" if no_nodes else ", 5 Redlock nodes (processes)"
        self.stdout.write(f"ready: PostgreSQL and Redis (services){nodes}")
