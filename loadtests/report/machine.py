"""The machine a burst ran on: measured once, completed with what the report can still ask."""

from __future__ import annotations

import os
import platform
import re
import subprocess


def machine_info() -> dict:
    """Cores, memory and the versions of what the burst ran on, measured now.

    PostgreSQL answers ``SELECT version()`` on Django's default connection, Redis ``INFO server``
    and ``CONFIG GET`` on the shop's ``REDIS_URL``, etcd ``etcd --version``. A part that cannot be
    asked says why instead of a version; this function does not raise for an unreachable service.
    """
    import django
    import redis
    from django.conf import settings
    from django.db import DatabaseError, connection

    info: dict = {
        "cores": os.cpu_count(),
        "memory_bytes": _memory_bytes(),
        "os": platform.platform(terse=True),
        "python": platform.python_version(),
        "django": django.get_version(),
    }
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT version()")
            info["postgresql"] = cursor.fetchone()[0]
    except DatabaseError as exc:
        info["postgresql"] = f"unknown ({str(exc).strip().splitlines()[0] if str(exc).strip() else 'no answer'})"
    url = settings.INVENTORY["REDIS_URL"]
    try:
        with redis.Redis.from_url(url, socket_timeout=2, socket_connect_timeout=2) as client:
            info["redis"] = client.info("server")["redis_version"]
            try:
                info["redis_persistence"] = {
                    **client.config_get("save"),
                    **client.config_get("appendonly"),
                    **client.config_get("appendfsync"),
                }
            except redis.ResponseError:  # CONFIG renamed or disabled on this server
                info["redis_persistence"] = "not readable (CONFIG is disabled)"
    except redis.RedisError as exc:
        info["redis"] = f"unknown ({exc})"
    info["etcd"] = _etcd_version()
    return info


#: What :func:`machine_info` measures (``redis_persistence`` only when Redis answers), as the page names it.
MACHINE_LABELS = {
    "cores": "CPU cores",
    "memory_bytes": "Memory",
    "os": "OS",
    "python": "Python",
    "django": "Django",
    "postgresql": "PostgreSQL",
    "redis": "Redis",
    "redis_persistence": "Redis persistence",
    "etcd": "etcd",
}


MACHINE_KEYS = tuple(MACHINE_LABELS)


#: Names the burst runner may use for what :func:`machine_info` calls otherwise.
MACHINE_ALIASES = {"cpus": "cores", "platform": "os"}


def complete_machine(recorded: object) -> dict:
    """The machine as recorded in the JSON, with what it lacks of :func:`machine_info` measured now
    (and a ``measured`` entry naming those parts); recorded values are kept as they are."""
    known = {MACHINE_ALIASES.get(k, k): v for k, v in recorded.items()} if isinstance(recorded, dict) else {}
    if all(key in known for key in MACHINE_KEYS):
        return known
    measured = machine_info()
    missing = [key for key in MACHINE_KEYS if key not in known and key in measured]
    return {
        **known,
        **{key: measured[key] for key in missing},
        "measured": f"when the report was written: {', '.join(MACHINE_LABELS[key] for key in missing)}",
    }


def _memory_bytes() -> int | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def _etcd_version() -> str:
    try:
        result = subprocess.run(["etcd", "--version"], capture_output=True, text=True, timeout=10)
    except FileNotFoundError:
        return "not installed"
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"unknown ({exc})"
    found = re.search(r"etcd Version:\s*(\S+)", result.stdout)
    return found.group(1) if found else f"unknown (etcd --version exited {result.returncode})"
