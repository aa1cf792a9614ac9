#!/usr/bin/env python
"""Django's command-line utility for the flash-sale shop."""

import os
import sys


def main() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "shop.settings")
    from django.core.exceptions import ImproperlyConfigured
    from django.core.management import execute_from_command_line
    from django.db.utils import OperationalError

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


if __name__ == "__main__":
    main()
