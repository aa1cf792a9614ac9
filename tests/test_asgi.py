"""The ASGI pod (``SHOP_SERVER=asgi``): gunicorn with uvicorn workers, Django's ASGI handler, and no
sync middleware in the chain, so the purchase view runs on the event loop."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# Builds Django's ASGI handler in a fresh process (as a uvicorn worker does) and prints what Django
# logged while it loaded the middleware: with DEBUG on it logs every handler it had to adapt.
LOAD_CHAIN = """
import json, logging, django
django.setup()
messages = []
class Keep(logging.Handler):
    def emit(self, record):
        messages.append(record.getMessage())
logger = logging.getLogger("django.request")
logger.addHandler(Keep())
logger.setLevel(logging.DEBUG)
from django.conf import settings
from django.core.handlers.asgi import ASGIHandler
ASGIHandler()
print(json.dumps({"middleware": settings.MIDDLEWARE, "logged": messages}))
"""


def fresh_process(code: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env={**os.environ, "DJANGO_SETTINGS_MODULE": "shop.settings", **env},
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_the_asgi_chain_adapts_no_middleware():
    """Every middleware of the ASGI pod is async-capable: Django adapts none to a thread, so an
    ``async def`` view is awaited on the worker's event loop (a sync one would put the chain, and
    the view, in a thread per request)."""
    result = fresh_process(LOAD_CHAIN, SHOP_SERVER="asgi", DJANGO_DEBUG="1")
    assert result.returncode == 0, result.stderr
    loaded = json.loads(result.stdout)
    assert "servestatic.middleware.ServeStaticMiddleware" in loaded["middleware"]
    assert "shop.middleware.PoolExhaustedMiddleware" in loaded["middleware"]
    assert not [message for message in loaded["logged"] if "adapted" in message], loaded["logged"]


def test_the_wsgi_chain_is_left_as_it_was():
    result = fresh_process(LOAD_CHAIN.replace("ASGIHandler", "WSGIHandler").replace(".asgi", ".wsgi"))
    assert result.returncode == 0, result.stderr
    assert "whitenoise.middleware.WhiteNoiseMiddleware" in json.loads(result.stdout)["middleware"]


@pytest.mark.parametrize("where", ["settings", "gunicorn.conf.py"])
def test_an_unknown_server_is_refused_in_one_line(where):
    read_config = "import runpy; runpy.run_path('gunicorn.conf.py')"
    code = "import django; django.setup()" if where == "settings" else read_config
    result = fresh_process(code, SHOP_SERVER="tornado")
    assert result.returncode != 0
    assert "SHOP_SERVER='tornado': use wsgi or asgi" in result.stderr


def test_gunicorn_runs_uvicorn_workers_for_asgi():
    code = "import runpy, json; c = runpy.run_path('gunicorn.conf.py'); print(json.dumps([c[k] for k in KEYS]))"
    code = code.replace("KEYS", "('wsgi_app', 'worker_class')")
    asgi = json.loads(fresh_process(code, SHOP_SERVER="asgi").stdout)
    wsgi = json.loads(fresh_process(code, SHOP_SERVER="wsgi").stdout)
    assert asgi == ["shop.asgi:application", "uvicorn_worker.UvicornWorker"]
    assert wsgi == ["shop.wsgi:application", "gthread"]
