"""gunicorn settings for the shop. Every value can be overridden from the environment."""
import os

# DEBUG is off under gunicorn unless DJANGO_DEBUG says otherwise.
os.environ.setdefault("DJANGO_DEBUG", "0")
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "shop.settings")

wsgi_app = "shop.wsgi:application"
bind = os.environ.get("GUNICORN_BIND", "127.0.0.1:8000")
# Several processes, so the lock is contended across processes as in production, and a few
# threads each, so a worker blocked on a lock does not idle its whole process.
workers = int(os.environ.get("GUNICORN_WORKERS", "4"))
worker_class = "gthread"
threads = int(os.environ.get("GUNICORN_THREADS", "4"))
backlog = 2048
timeout = int(os.environ.get("GUNICORN_TIMEOUT", "30"))
graceful_timeout = 5
keepalive = 5
accesslog = os.environ.get("GUNICORN_ACCESSLOG") or None
errorlog = "-"
loglevel = os.environ.get("GUNICORN_LOGLEVEL", "warning")
proc_name = "flashsale"
