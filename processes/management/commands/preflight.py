"""Check the machine's services the shop needs (PostgreSQL, Redis); create the database and start the
Redlock nodes (processes of the project)."""

from __future__ import annotations

import psycopg
import redis
from django.conf import settings
from django.core.management.base import BaseCommand, CommandError
from psycopg import sql

from locks import Redlock
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


def check_redlock_servers(urls: list[str]) -> None:
    """Refuse REDLOCK_URLS that reach one Redis server under two names (its run_id answered twice:
    ``Redlock.check_servers``), which settings cannot tell from the URLs: Redlock's majority would
    be one process. A node that does not answer is not compared (the nodes are not started yet
    with --no-nodes); the strategy's own check refuses one host and port named twice."""
    if not urls:
        return
    clients = [redis.Redis.from_url(url, socket_connect_timeout=1.0, socket_timeout=1.0) for url in urls]
    try:
        Redlock(clients, "flashsale:lock:nodes").check_servers()
    except ValueError as exc:
        raise CommandError(f"REDLOCK_URLS: {exc}; give each node its own Redis process") from exc
    finally:
        for client in clients:
            client.close()


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
        check_redlock_servers(settings.INVENTORY["REDLOCK_URLS"])
        nodes = "" if no_nodes else ", 5 Redlock nodes (processes)"
        self.stdout.write(f"ready: PostgreSQL and Redis (services){nodes}")
