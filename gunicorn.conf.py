"""gunicorn settings for the shop. Every value can be overridden from the environment."""

import logging
import os
import sys

from django.core.exceptions import ImproperlyConfigured

from shop.env import env_int


def _count(name: str, default: int, least: int) -> int:
    """:func:`shop.env.env_int`, its refusal stopping gunicorn with that one line."""
    try:
        return env_int(name, default, least=least)
    except ImproperlyConfigured as exc:
        raise SystemExit(str(exc)) from None


def _choice(name: str, default: str, allowed: tuple[str, ...], said: str) -> str:
    raw = os.environ.get(name) or default
    if raw not in allowed:
        raise SystemExit(f"{name}={raw!r}: use {said}")
    return raw


# DEBUG is off under gunicorn unless DJANGO_DEBUG says otherwise; empty says nothing (the settings
# read it as unset, whose default in development is on), so it is filled in too.
if not os.environ.get("DJANGO_DEBUG"):
    os.environ["DJANGO_DEBUG"] = "0"
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "shop.settings")

# SHOP_SERVER (shop/settings.py): wsgi, gthread workers and the WSGI application; asgi, uvicorn
# workers (gunicorn still supervises: timeouts, restarts, signals) and the ASGI application.
server = os.environ.get("SHOP_SERVER", "wsgi")
if server not in ("wsgi", "asgi"):
    raise SystemExit(f"SHOP_SERVER={server!r}: use wsgi or asgi")
wsgi_app = f"shop.{server}:application"
bind = os.environ.get("GUNICORN_BIND") or "127.0.0.1:8000"
# Several processes, so the lock is contended across processes as in production, and a few
# threads each, so a worker blocked on a lock does not idle its whole process.
workers = _count("GUNICORN_WORKERS", 4, 1)
worker_class = "gthread" if server == "wsgi" else "uvicorn_worker.UvicornWorker"
# Load the app once in the arbiter and fork the workers from it: a pod is up in a fraction of the
# time when its workers need not each import Django (nothing connects or starts a thread at import).
preload_app = _choice("GUNICORN_PRELOAD", "1", ("1", "0"), "1 or 0") == "1"
threads = _count("GUNICORN_THREADS", 4, 1)
# Under ASGI one event loop per worker serves every request; its database work runs on this many
# threads (shop/settings.py ASGI_DB_THREADS), the same number gthread would run requests on.
os.environ.setdefault("ASGI_DB_THREADS", str(threads))
# Each worker process gets a bounded pool of at most one connection per thread (a thread holds one
# at a time), so one instance never holds more than workers × threads PostgreSQL connections.
os.environ.setdefault("DATABASE_POOL_MAX_SIZE", str(threads))
# A flash sale opens thousands of connections at once and keeps them open through the countdown:
# the listen queue (also bounded by the kernel's net.core.somaxconn), the idle keep-alive
# connections a worker may hold (gthread closes any beyond worker_connections - threads) and how
# long an idle one is kept all have to cover the shoppers waiting for the opening.
backlog = _count("GUNICORN_BACKLOG", 2048, 1)
worker_connections = _count("GUNICORN_WORKER_CONNECTIONS", 1000, 1)
keepalive = _count("GUNICORN_KEEPALIVE", 5, 0)
timeout = _count("GUNICORN_TIMEOUT", 30, 0)
graceful_timeout = 5
accesslog = os.environ.get("GUNICORN_ACCESSLOG") or None
errorlog = "-"
loglevel = _choice(
    "GUNICORN_LOGLEVEL",
    "warning",
    ("debug", "info", "warning", "error", "critical"),
    "debug, info, warning, error or critical",
)
proc_name = "flashsale"
# gunicorn 25+ opens a control socket (``gunicornc``: reload, shutdown, change the worker count) at
# one path per user, ~/.gunicorn/gunicorn.ctl, whatever the port: every pod of a burst, and every
# test worker's, took it over from the last, and the first to stop removed it. The shop never uses
# it, and nothing should answer beyond the HTTP port.
control_socket_disable = True


def worker_exit(server, worker) -> None:
    """A worker that stops cleanly leaves without tearing down its interpreter: it has answered
    every request and logged each (flushed below), and the finalisation of a process that loaded
    Django (collecting, then freeing, every module and object) took 0.25-0.4 s of a pod's stop
    with nothing left to do. Any other way out (a failed boot, an error) exits as usual, with its
    status. gunicorn also calls this hook in the arbiter for a worker found gone: not there."""
    leaving = sys.exc_info()[1]
    if os.getpid() == worker.pid and isinstance(leaving, SystemExit) and leaving.code in (0, None):
        logging.shutdown()
        os._exit(0)


def on_exit(server) -> None:
    """The same for the arbiter once its workers are gone, on a plain stop (SIGTERM, SIGINT: its
    main loop's StopIteration or KeyboardInterrupt). A halt for a reason (a worker that failed to
    boot) exits as usual, with that reason's status."""
    if isinstance(sys.exc_info()[1], (StopIteration, KeyboardInterrupt)):
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
