#!/usr/bin/env python
"""Django's command-line utility for the flash-sale shop."""

import os
import sys

#: PostgreSQL's SQLSTATE for a relation that does not exist.
UNDEFINED_TABLE = "42P01"


def main() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "shop.settings")
    from django.core.exceptions import ImproperlyConfigured
    from django.core.management import execute_from_command_line
    from django.db.utils import OperationalError, ProgrammingError

    try:
        execute_from_command_line(sys.argv)
    except ImproperlyConfigured as exc:
        if "--traceback" in sys.argv:
            raise
        # A bad setting (shop/settings.py reads them from the environment) says what to fix in
        # one line, as a command's own errors do, not under a traceback of Django's startup.
        sys.exit(f"ImproperlyConfigured: {exc}")
    except OperationalError as exc:
        if "--traceback" in sys.argv:
            raise
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        sys.exit(f"OperationalError: {reason} (manage.py preflight checks the database)")
    except ProgrammingError as exc:
        # A table that is not there (a database preflight created, never migrated); any other is a traceback.
        if "--traceback" in sys.argv or getattr(exc.__cause__, "sqlstate", None) != UNDEFINED_TABLE:
            raise
        reason = str(exc).strip().splitlines()[0]
        fix = "the database has not been migrated: run python manage.py migrate (make migrate)"
        sys.exit(f"ProgrammingError: {reason}: {fix}")


if __name__ == "__main__":
    main()
