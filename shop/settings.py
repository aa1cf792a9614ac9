"""Settings for the flash-sale shop.

Everything comes from the environment, with defaults that work on a developer's machine
(PostgreSQL and Redis on 127.0.0.1). Outside development (``FLASHSALE_ENV=production``)
``DJANGO_SECRET_KEY`` is required and ``DEBUG`` is off unless asked for.
"""

from __future__ import annotations

import os
from pathlib import Path
from urllib.parse import urlsplit

import dj_database_url
from django.core.exceptions import ImproperlyConfigured
from redis.connection import parse_url as parse_redis_url

from processes import ports
from shop.env import env_int

BASE_DIR = Path(__file__).resolve().parent.parent
RUN_DIR = Path(os.environ.get("FLASHSALE_RUN_DIR", BASE_DIR / ".run"))


# Two small readers rather than django-environ: its bool() reads any unknown word as False, and a
# typo in a setting should stop the process with the variable's name and what it accepts.
def env_first(*names: str, default: str) -> str:
    """The first of ``names`` set in the environment (a name, then its older aliases), else ``default``."""
    return next((os.environ[name] for name in names if os.environ.get(name)), default)


def env_bool(name: str, default: bool) -> bool:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    if raw.lower() in {"1", "true", "yes", "on"}:
        return True
    if raw.lower() in {"0", "false", "no", "off"}:
        return False
    raise ImproperlyConfigured(f"{name}={raw!r}: use 1 or 0")


ENVIRONMENT = os.environ.get("FLASHSALE_ENV", "development")
if ENVIRONMENT not in {"development", "production"}:
    raise ImproperlyConfigured(f"FLASHSALE_ENV={ENVIRONMENT!r}: use development or production")
DEVELOPMENT = ENVIRONMENT == "development"

SECRET_KEY = os.environ.get("DJANGO_SECRET_KEY", "")
if not SECRET_KEY.strip():  # a key of spaces is no secret: refused as a missing one
    if not DEVELOPMENT:
        raise ImproperlyConfigured("DJANGO_SECRET_KEY must be set when FLASHSALE_ENV=production")
    SECRET_KEY = "development-only-insecure-key-do-not-deploy"

# gunicorn.conf.py sets DJANGO_DEBUG=0, so DEBUG is off under gunicorn unless asked for.
DEBUG = env_bool("DJANGO_DEBUG", DEVELOPMENT)

ALLOWED_HOSTS = [h for h in os.environ.get("DJANGO_ALLOWED_HOSTS", "127.0.0.1,localhost").split(",") if h]
CSRF_TRUSTED_ORIGINS = [o for o in os.environ.get("DJANGO_CSRF_TRUSTED_ORIGINS", "").split(",") if o]

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "inventory",
    "processes",
    "faults",
    "loadtests",
    "shop",
]

# The server a pod runs (gunicorn.conf.py reads it too): ``wsgi``, gunicorn's threads and the sync
# views; ``asgi``, uvicorn workers under gunicorn, Django's ASGI handler and the purchase as an
# ``async def`` view holding the asyncio lock. Every middleware in the chain is async-capable on
# asgi, or Django would run the whole chain, and the view, in a thread per request.
SHOP_SERVER = os.environ.get("SHOP_SERVER", "wsgi")
if SHOP_SERVER not in {"wsgi", "asgi"}:
    raise ImproperlyConfigured(f"SHOP_SERVER={SHOP_SERVER!r}: use wsgi or asgi")
# Debugging aid (tests/test_asgi.py): every purchase answer says where its view ran (X-Served-On).
SHOP_SERVED_ON_HEADER = env_bool("SHOP_SERVED_ON_HEADER", False)
# Static files: WhiteNoise under WSGI; its fork ServeStatic under ASGI, whose middleware is
# async-only (under WSGI Django would run it through a new event loop per request).
STATIC_MIDDLEWARE = {
    "wsgi": "whitenoise.middleware.WhiteNoiseMiddleware",
    "asgi": "servestatic.middleware.ServeStaticMiddleware",
}[SHOP_SERVER]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    STATIC_MIDDLEWARE,
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "shop.middleware.PoolExhaustedMiddleware",
]
if SHOP_SERVER == "asgi":
    # The same middleware with its hooks inline on the event loop, not on a thread per request
    # (shop/loop_middleware.py says why and what keeps it safe).
    ON_LOOP = {
        "django.middleware.security.SecurityMiddleware": "SecurityOnLoop",
        "django.contrib.sessions.middleware.SessionMiddleware": "SessionOnLoop",
        "django.middleware.common.CommonMiddleware": "CommonOnLoop",
        "django.middleware.csrf.CsrfViewMiddleware": "CsrfOnLoop",
        "django.contrib.auth.middleware.AuthenticationMiddleware": "AuthenticationOnLoop",
        "django.contrib.messages.middleware.MessageMiddleware": "MessageOnLoop",
        "django.middleware.clickjacking.XFrameOptionsMiddleware": "XFrameOptionsOnLoop",
    }
    MIDDLEWARE = [f"shop.loop_middleware.{ON_LOOP[path]}" if path in ON_LOOP else path for path in MIDDLEWARE]

ROOT_URLCONF = "shop.urls"
WSGI_APPLICATION = "shop.wsgi.application"
ASGI_APPLICATION = "shop.asgi.application"
# The most body a request may send under ASGI (shop/body_limit.py): past it, 413 before the rest is
# read. Django's ASGI handler would otherwise read any body whole before a view could refuse it.
REQUEST_BODY_MAX_BYTES = env_int("REQUEST_BODY_MAX_BYTES", 1 << 20, least=1024)

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
                "shop.context_processors.sale_guard",
            ],
        },
    },
]

# DATABASE_POOL_MAX_SIZE > 0 (gunicorn.conf.py sets it) gives each process a bounded psycopg pool:
# at most that many connections, and a request that waits DATABASE_POOL_TIMEOUT seconds for one
# gets 503 + Retry-After (shop/middleware.py) instead of queueing until PostgreSQL refuses it.
DATABASE_POOL_MAX_SIZE = env_int("DATABASE_POOL_MAX_SIZE", 0, least=0)
_DATABASE_URL = os.environ.get("DATABASE_URL") or "postgres://postgres@127.0.0.1:5432/flashsale"
try:
    _DATABASE = dj_database_url.parse(
        _DATABASE_URL,
        # A pooled connection goes back to the pool at the end of each request instead.
        conn_max_age=0 if DATABASE_POOL_MAX_SIZE else env_int("DATABASE_CONN_MAX_AGE", 60, least=0),
        # Pooled, the check is a round trip on every checkout: a quarter of a sold-out answer's time
        # under the spike (py-spy). Without it a connection that broke fails its one request and the
        # pool discards it.
        conn_health_checks=not DATABASE_POOL_MAX_SIZE,
    )
except (ValueError, dj_database_url.ParseError) as exc:
    raise ImproperlyConfigured(
        f"DATABASE_URL={_DATABASE_URL!r}: {exc}; e.g. postgres://postgres@127.0.0.1:5432/flashsale"
    ) from None
if not _DATABASE.get("NAME"):  # no path: preflight would send CREATE DATABASE "", check would pass
    raise ImproperlyConfigured(
        f"DATABASE_URL={_DATABASE_URL!r}: names no database; e.g. postgres://postgres@127.0.0.1:5432/flashsale"
    )
DATABASES = {"default": _DATABASE}
if DATABASE_POOL_MAX_SIZE:
    try:
        _pool_timeout = float(os.environ.get("DATABASE_POOL_TIMEOUT") or 1.0)
    except ValueError:
        raise ImproperlyConfigured("DATABASE_POOL_TIMEOUT: expected seconds, e.g. 1.0") from None
    if not 0 < _pool_timeout < float("inf"):  # 0 or less fails every query at once; nan compares false
        raise ImproperlyConfigured(f"DATABASE_POOL_TIMEOUT={_pool_timeout:g}: expected seconds above 0, e.g. 1.0")
    DATABASES["default"].setdefault("OPTIONS", {})["pool"] = {
        "min_size": 0,
        "max_size": DATABASE_POOL_MAX_SIZE,
        "timeout": _pool_timeout,
    }
# The section's statements run as named prepared statements, planned once per connection
# (inventory/strategies/prepared.py); DATABASE_PREPARED_STATEMENTS=0 sends their text as before,
# planned on every run, to measure the difference.
DATABASE_PREPARED_STATEMENTS = env_bool("DATABASE_PREPARED_STATEMENTS", True)
# Under ASGI the ORM (sync only in Django 5.2) runs on this many threads per worker process, the
# twin of gunicorn's threads under WSGI (gunicorn.conf.py sets it to GUNICORN_THREADS): a thread
# holds at most one connection at a time, so the pool and its fast 503 keep WSGI's meaning.
ASGI_DB_THREADS = env_int("ASGI_DB_THREADS", 4)
if ASGI_DB_THREADS < 1:
    raise ImproperlyConfigured(f"ASGI_DB_THREADS={ASGI_DB_THREADS}: use 1 or more")
if DATABASES["default"]["ENGINE"] != "django.db.backends.postgresql":
    raise ImproperlyConfigured("DATABASE_URL must point at PostgreSQL: row locks and CHECK constraints rely on it")

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# Shoppers are identified by their session. Signed-cookie sessions keep a 5,000-request burst
# from writing 5,000 session rows; the cookie is signed with SECRET_KEY and HttpOnly.
SESSION_ENGINE = "django.contrib.sessions.backends.signed_cookies"
# A signed cookie cannot be deleted server-side: a logout ends every session of that user by
# raising a generation their sessions' auth hash covers (inventory/sessions.py).
AUTHENTICATION_BACKENDS = ["inventory.sessions.RevocableSessionsBackend"]
SESSION_COOKIE_HTTPONLY = True
SESSION_COOKIE_SAMESITE = "Lax"
CSRF_COOKIE_SAMESITE = "Lax"

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

# Staff passwords (createstaff's FLASHSALE_ADMIN_PASSWORD, the admin's password forms): Django's
# four checks. Without them a superuser could be made with the password "short".
AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator", "OPTIONS": {"min_length": 12}},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]

STATIC_URL = "static/"
STATIC_ROOT = BASE_DIR / "staticfiles"
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {
        "BACKEND": "whitenoise.storage.CompressedManifestStaticFilesStorage"
        if not DEBUG
        else "django.contrib.staticfiles.storage.StaticFilesStorage"
    },
}
WHITENOISE_USE_FINDERS = DEBUG
SERVESTATIC_USE_FINDERS = DEBUG

# Production hardening; `manage.py check --deploy` is clean with FLASHSALE_ENV=production
# behind a TLS-terminating proxy (see README).
if not DEVELOPMENT:
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    SECURE_SSL_REDIRECT = env_bool("DJANGO_SECURE_SSL_REDIRECT", True)
    SESSION_COOKIE_SECURE = True
    CSRF_COOKIE_SECURE = True
    SECURE_HSTS_SECONDS = env_int("DJANGO_HSTS_SECONDS", 31536000, least=0)
    SECURE_HSTS_INCLUDE_SUBDOMAINS = True
    SECURE_HSTS_PRELOAD = True

# The purchase strategy. INVENTORY_STRATEGY (older name, still read: INVENTORY_BACKEND) is an alias
# (db, optimistic, redis, redlock, etcd, atomic, redis-stock, and the controls local and unsafe) or a
# dotted path to a Strategy subclass; OPTIONS holds what the strategies declare in their modules
# (``default_options``), as CACHES does per backend.
REDLOCK_BASE_PORT = env_int("REDLOCK_BASE_PORT", ports.REDLOCK_BASE_PORT, least=1)
REDLOCK_NODE_COUNT = env_int("REDLOCK_NODE_COUNT", 5, least=1)
if REDLOCK_BASE_PORT + REDLOCK_NODE_COUNT - 1 > 65535:
    raise ImproperlyConfigured(
        f"REDLOCK_BASE_PORT={REDLOCK_BASE_PORT} with REDLOCK_NODE_COUNT={REDLOCK_NODE_COUNT}: "
        "the nodes' ports would pass 65535"
    )


def redis_url(name: str, url: str) -> str:
    """``url`` if redis-py can parse it; else one line naming ``name`` (a bad REDIS_URL ended
    preflight, reconcile and the sold-out mark's reads in a ValueError traceback)."""
    try:
        parse_redis_url(url)
    except ValueError as exc:
        raise ImproperlyConfigured(f"{name}={url!r}: {exc}") from None
    return url


def etcd_endpoint(endpoint: str) -> str:
    """``endpoint`` if it is http(s)://host:port, else one line naming ETCD_ENDPOINTS."""
    try:
        parts = urlsplit(endpoint)
        ok = parts.scheme in ("http", "https") and bool(parts.hostname) and parts.port is not None
    except ValueError:  # a port past 65535
        ok = False
    if not ok:
        raise ImproperlyConfigured(f"ETCD_ENDPOINTS: {endpoint!r} is not http(s)://host:port")
    return endpoint


def zookeeper_host(host: str) -> str:
    """``host`` if it is host:port with a port from 1 to 65535, else one line naming ZOOKEEPER_HOSTS."""
    name, _, port = host.rpartition(":")
    if not name or not port.isdigit() or not 1 <= int(port) <= 65535:
        raise ImproperlyConfigured(f"ZOOKEEPER_HOSTS: {host!r} is not host:port")
    return host


INVENTORY = {
    "STRATEGY": env_first("INVENTORY_STRATEGY", "INVENTORY_BACKEND", default="db"),
    "REDIS_URL": redis_url("REDIS_URL", os.environ.get("REDIS_URL") or "redis://127.0.0.1:6379/0"),
    "REDLOCK_URLS": [
        redis_url("REDLOCK_URLS", u.strip())
        for u in os.environ.get(
            "REDLOCK_URLS",
            ",".join(f"redis://127.0.0.1:{REDLOCK_BASE_PORT + i}/0" for i in range(REDLOCK_NODE_COUNT)),
        ).split(",")
        if u.strip()
    ],
    "LOCK_TTL_MS": env_int("LOCK_TTL_MS", 10_000),
    "ACQUIRE_TIMEOUT_MS": env_int("ACQUIRE_TIMEOUT_MS", 5_000),
    # How long a section's statement waits for a row lock held elsewhere (PostgreSQL's lock_timeout,
    # set for the section's transaction only) before the shopper is told busy.
    "ROW_LOCK_TIMEOUT_MS": env_int("ROW_LOCK_TIMEOUT_MS", 5_000),
    "ALLOW_UNSAFE": env_bool("ALLOW_UNSAFE_STRATEGY", env_bool("ALLOW_UNSAFE_BACKEND", False)),
    "ETCD_ENDPOINTS": [
        etcd_endpoint(u.strip())
        for u in os.environ.get(
            "ETCD_ENDPOINTS", ",".join(f"http://127.0.0.1:{ports.ETCD_BASE_PORT + i}" for i in range(3))
        ).split(",")
        if u.strip()
    ],
    "ZOOKEEPER_HOSTS": [
        zookeeper_host(h.strip())
        for h in os.environ.get(
            "ZOOKEEPER_HOSTS", ",".join(f"127.0.0.1:{ports.ZOOKEEPER_BASE_PORT + i}" for i in range(3))
        ).split(",")
        if h.strip()
    ],
    "OPTIONS": {
        # Distributed locks: check the fence and the row's version at the write (off shows why).
        "FENCED": env_bool("INVENTORY_FENCED", True),
        # optimistic: re-runs of the section after a conflict before the shopper is told busy.
        "MAX_RETRIES": env_int("OPTIMISTIC_MAX_RETRIES", 8),
        # Every strategy: purchases of one SKU one section may serve (1: each alone; docs/batching.md).
        "BATCH": env_int("INVENTORY_BATCH", 1),
        # Every strategy, with BATCH > 1: where purchases queue for a section: local (one queue per
        # process, in memory) or shared (one Redis list per SKU on REDIS_URL, every pod's; docs/batching.md).
        "QUEUE": os.environ.get("INVENTORY_QUEUE", "local"),
        # Strategies without a lock, with BATCH > 1: how long a leader whose last batch had company
        # waits for more purchases before its section (group commit; 0: never; docs/batching.md).
        "BATCH_LINGER_MS": env_int("INVENTORY_BATCH_LINGER_MS", 20),
    },
}

LOG_LEVEL = (os.environ.get("DJANGO_LOG_LEVEL") or "WARNING").upper()
if LOG_LEVEL not in {"DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"}:
    raise ImproperlyConfigured(f"DJANGO_LOG_LEVEL={LOG_LEVEL.lower()!r}: use DEBUG, INFO, WARNING, ERROR or CRITICAL")
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "root": {"handlers": ["console"], "level": LOG_LEVEL},
    # A flash sale answers thousands of 409s (sold out) by design: log only server errors.
    "loggers": {"django.request": {"level": "ERROR"}},
}

CSRF_FAILURE_VIEW = "shop.views.csrf_failure"
