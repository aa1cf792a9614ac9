"""Configuration: production settings pass ``check --deploy``, need a SECRET_KEY, keep DEBUG off
under gunicorn, and static files are served by whitenoise from collectstatic's output."""

from __future__ import annotations

import os
import re
import secrets
import subprocess
import sys
from pathlib import Path

import pytest
from django.core.management import call_command
from django.test import Client, override_settings

ROOT = Path(__file__).resolve().parent.parent


def run(code_or_args: list[str], **env) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("DJANGO_", "FLASHSALE_"))}
    return subprocess.run(
        [sys.executable, *code_or_args],
        cwd=ROOT,
        env={**clean, **env},
        capture_output=True,
        text=True,
        timeout=60,
    )


def production_env(**extra) -> dict:
    return {"FLASHSALE_ENV": "production", "DJANGO_SECRET_KEY": secrets.token_urlsafe(50), **extra}


@pytest.mark.slow
def test_check_deploy_is_clean_with_production_settings():
    result = run(["manage.py", "check", "--deploy", "--fail-level", "WARNING"], **production_env())
    assert result.returncode == 0, result.stdout + result.stderr
    assert "System check identified no issues (0 silenced)." in result.stdout


@pytest.mark.parametrize("key", [None, "   "], ids=["unset", "blank"])
def test_production_refuses_to_start_without_a_secret_key(key):
    """Seen by a helper: a key of spaces (an env file's ``DJANGO_SECRET_KEY= `` and a stray space) was
    taken as the secret, and every session and CSRF token was signed with it."""
    env = {"FLASHSALE_ENV": "production", **({} if key is None else {"DJANGO_SECRET_KEY": key})}
    result = run(["manage.py", "check"], **env)
    assert result.returncode != 0
    assert "DJANGO_SECRET_KEY must be set when FLASHSALE_ENV=production" in result.stderr


@pytest.mark.slow  # waits out a connect timeout: make test runs it, make check does not
def test_preflight_tells_a_refused_login_from_a_server_that_does_not_answer():
    """Seen by a helper: a role that does not exist read "does not answer ... install and start it"."""
    result = run(
        ["manage.py", "preflight", "--no-nodes"], DATABASE_URL="postgres://nosuchrole@127.0.0.1:5432/flashsale"
    )
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "answered and refused the login" in lines[0] and "install" not in lines[0], lines


@pytest.mark.slow  # waits out a connect timeout in a subprocess: make test runs it, make check does not
@pytest.mark.parametrize("command", [["seed"], ["reconcile", "--dry-run"], ["createstaff", "--username", "x"]])
def test_a_database_that_does_not_answer_is_one_line(command):
    """Seen by a helper: each ended in an OperationalError traceback."""
    result = run(["manage.py", *command], DATABASE_URL="postgres://postgres@127.0.0.1:1/flashsale")
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("OperationalError: ") and "preflight" in lines[0], result.stderr


@pytest.fixture
def unmigrated_database():
    """The URL of an empty database of this slot's own: created as preflight creates one, never migrated."""
    import psycopg

    from tests import slots

    name = f"flashsale_unmigrated_s{slots.SLOT}"
    with psycopg.connect("postgresql://postgres@127.0.0.1:5432/postgres", autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}"')
        conn.execute(f'CREATE DATABASE "{name}"')
    yield f"postgres://postgres@127.0.0.1:5432/{name}"
    with psycopg.connect("postgresql://postgres@127.0.0.1:5432/postgres", autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.mark.slow  # creates and drops a database per command: the full suite's
@pytest.mark.parametrize("command", [["seed"], ["reconcile", "--dry-run"], ["createstaff", "--username", "x"]])
def test_a_database_not_yet_migrated_is_one_line_saying_to_migrate(command, unmigrated_database):
    """Seen by a helper: after preflight created the database, seed (before migrate) ended in a
    ProgrammingError traceback: relation "inventory_product" does not exist."""
    result = run(["manage.py", *command], DATABASE_URL=unmigrated_database)
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("ProgrammingError: relation ") and "does not exist" in lines[0], lines
    assert lines[0].endswith("the database has not been migrated: run python manage.py migrate (make migrate)")


@pytest.mark.slow  # starts Django in a process of its own per case: make test runs it, make check does not
@pytest.mark.parametrize(
    "env, said",
    [
        ({"GUNICORN_WORKERS": "0"}, "GUNICORN_WORKERS='0': use 1 or more"),
        ({"GUNICORN_THREADS": "0"}, "GUNICORN_THREADS='0': use 1 or more"),
        ({"GUNICORN_TIMEOUT": "abc"}, "GUNICORN_TIMEOUT='abc': expected a whole number"),
        ({"GUNICORN_PRELOAD": "yes"}, "GUNICORN_PRELOAD='yes': use 1 or 0"),
        ({"GUNICORN_LOGLEVEL": "bogus"}, "GUNICORN_LOGLEVEL='bogus': use debug, info, warning, error or critical"),
    ],
)
def test_a_bad_gunicorn_setting_is_one_line(env, said):
    """Seen by a helper: GUNICORN_WORKERS=0 started a pod that answered nothing, GUNICORN_THREADS=0
    blamed ASGI_DB_THREADS, a word where a number belongs was int()'s ValueError naming no variable,
    and PRELOAD=yes or a bogus LOGLEVEL were silently something else."""
    result = run(["-c", "import runpy; runpy.run_path('gunicorn.conf.py')"], **env)
    assert result.returncode == 1
    assert result.stderr.strip().splitlines() == [said], result.stderr


@pytest.mark.slow  # starts Django in a process of its own per case: make test runs it, make check does not
@pytest.mark.parametrize(
    "env, said",
    [
        ({"FLASHSALE_ENV": "production"}, "DJANGO_SECRET_KEY must be set when FLASHSALE_ENV=production"),
        ({"INVENTORY_BATCH": "abc"}, "INVENTORY_BATCH='abc': expected a whole number"),
        # Seen by a helper: each passed `check`, then broke every query (or sent max-age=-1).
        ({"DATABASE_POOL_MAX_SIZE": "-1"}, "DATABASE_POOL_MAX_SIZE='-1': use 0 or more"),
        (
            {"DATABASE_POOL_MAX_SIZE": "4", "DATABASE_POOL_TIMEOUT": "0"},
            "DATABASE_POOL_TIMEOUT=0: expected seconds above 0, e.g. 1.0",
        ),
        (
            {"DATABASE_POOL_MAX_SIZE": "4", "DATABASE_POOL_TIMEOUT": "nan"},
            "DATABASE_POOL_TIMEOUT=nan: expected seconds above 0, e.g. 1.0",
        ),
        ({"DATABASE_CONN_MAX_AGE": "-5"}, "DATABASE_CONN_MAX_AGE='-5': use 0 or more"),
        ({"REDLOCK_NODE_COUNT": "0"}, "REDLOCK_NODE_COUNT='0': use 1 or more"),
        ({"REQUEST_BODY_MAX_BYTES": "100"}, "REQUEST_BODY_MAX_BYTES='100': use 1024 or more"),
        (
            {"REDIS_URL": "garbage"},
            "REDIS_URL='garbage': Redis URL must specify one of the following schemes (redis://, rediss://, unix://)",
        ),
        ({"ETCD_ENDPOINTS": "garbage"}, "ETCD_ENDPOINTS: 'garbage' is not http(s)://host:port"),
        (
            {"ETCD_ENDPOINTS": "http://127.0.0.1:99999"},
            "ETCD_ENDPOINTS: 'http://127.0.0.1:99999' is not http(s)://host:port",
        ),
        ({"ZOOKEEPER_HOSTS": "garbage"}, "ZOOKEEPER_HOSTS: 'garbage' is not host:port"),
        ({"DJANGO_LOG_LEVEL": "bogus"}, "DJANGO_LOG_LEVEL='bogus': use DEBUG, INFO, WARNING, ERROR or CRITICAL"),
        (
            {"REDLOCK_BASE_PORT": "70000"},
            "REDLOCK_BASE_PORT=70000 with REDLOCK_NODE_COUNT=5: the nodes' ports would pass 65535",
        ),
        (
            {"FLASHSALE_ENV": "production", "DJANGO_SECRET_KEY": "k" * 60, "DJANGO_HSTS_SECONDS": "-1"},
            "DJANGO_HSTS_SECONDS='-1': use 0 or more",
        ),
    ],
)
def test_a_bad_setting_is_one_line_saying_what_to_fix(env, said):
    """Seen by a helper: every bad setting printed a 45-line traceback before its one true line."""
    result = run(["manage.py", "check"], **env)
    assert result.returncode == 1
    assert result.stderr.strip().splitlines() == [f"ImproperlyConfigured: {said}"], result.stderr


@pytest.mark.slow  # starts Django in a process of its own per case: make test runs it, make check does not
@pytest.mark.parametrize("url", ["garbage", "postgres://postgres@127.0.0.1:99999/flashsale"])
def test_a_database_url_that_does_not_parse_names_the_variable(url):
    """Seen by a helper: UnknownSchemeError and ParseError tracebacks that named no variable."""
    result = run(["manage.py", "check"], DATABASE_URL=url)
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"ImproperlyConfigured: DATABASE_URL={url!r}: "), result.stderr


@pytest.mark.slow  # starts Django in a process of its own per case: make test runs it, make check does not
@pytest.mark.parametrize("url", ["postgres://postgres@127.0.0.1:5432/", "postgres://postgres@127.0.0.1:5432"])
@pytest.mark.parametrize("command", [["preflight", "--no-nodes"], ["check"]])
def test_a_database_url_without_a_database_name_is_one_line(url, command):
    """Seen by a helper: preflight ended in psycopg's SyntaxError traceback (zero-length delimited
    identifier: CREATE DATABASE ""), and check passed."""
    result = run(["manage.py", *command], DATABASE_URL=url)
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert lines == [
        f"ImproperlyConfigured: DATABASE_URL={url!r}: names no database; e.g. postgres://postgres@127.0.0.1:5432/flashsale"
    ], result.stderr


@pytest.mark.slow
def test_check_deploy_flags_a_weak_secret_key():
    result = run(["manage.py", "check", "--deploy"], **production_env(DJANGO_SECRET_KEY="short"))
    assert "security.W009" in result.stdout + result.stderr


@pytest.mark.slow
@pytest.mark.parametrize("env", [{}, {"DJANGO_DEBUG": ""}], ids=["unset", "empty"])
def test_debug_is_off_under_gunicorn_even_in_development(env):
    """Seen by a helper: ``DJANGO_DEBUG=`` (empty, as an env file's blank line leaves it) kept DEBUG
    on under gunicorn: the config only filled the variable in when it was absent, and the settings
    read empty as unset, the development default (on)."""
    code = (
        "import runpy, os; runpy.run_path('gunicorn.conf.py');"
        "import django; django.setup(); from django.conf import settings; print('DEBUG', settings.DEBUG)"
    )
    result = run(["-c", code], **env)
    assert result.returncode == 0, result.stderr
    assert "DEBUG False" in result.stdout


@pytest.mark.slow
@pytest.mark.django_db
def test_static_files_served_by_whitenoise_with_debug_off(tmp_path, settings, make_product):
    """What gunicorn does with DEBUG=0: hashed names from the manifest, files from STATIC_ROOT."""
    make_product()
    storages = {
        **settings.STORAGES,
        "staticfiles": {"BACKEND": "whitenoise.storage.CompressedManifestStaticFilesStorage"},
    }
    with override_settings(
        DEBUG=False, STATIC_ROOT=tmp_path, STORAGES=storages, WHITENOISE_USE_FINDERS=False, WHITENOISE_AUTOREFRESH=False
    ):
        call_command("collectstatic", "--noinput", verbosity=0)
        client = Client()
        html = client.get("/products/phone-x/").content.decode()
        css = re.search(r'href="(/static/shop/shop\.[0-9a-f]{12}\.css)"', html).group(1)
        js = re.search(r'src="(/static/shop/shop\.[0-9a-f]{12}\.js)"', html).group(1)
        for url in (css, js):
            response = client.get(url)
            assert response.status_code == 200
            assert "max-age=315360000" in response["Cache-Control"]  # hashed name: cache forever
        assert client.get(css, HTTP_ACCEPT_ENCODING="gzip")["Content-Encoding"] == "gzip"


@pytest.mark.django_db
def test_a_staff_session_copied_before_logout_is_refused_after_it():
    # Sessions are signed cookies, kept by the browser alone: logging out only dropped this browser's
    # copy, and a copy taken before (a shared machine, a proxy's log) stayed a staff session until it
    # expired. Logging out now ends every session of that staff user.
    from django.contrib.auth.models import User

    User.objects.create_superuser("boss", "boss@example.com", "pw-for-tests-only")
    browser = Client()
    assert browser.login(username="boss", password="pw-for-tests-only")
    assert browser.get("/admin/").status_code == 200
    copied = browser.cookies["sessionid"].value
    browser.post("/admin/logout/")
    thief = Client()
    thief.cookies["sessionid"] = copied
    answer = thief.get("/admin/")
    assert answer.status_code == 302 and "/admin/login/" in answer["Location"]
    # Logging in again works, and that new session is a staff session.
    again = Client()
    assert again.login(username="boss", password="pw-for-tests-only")
    assert again.get("/admin/").status_code == 200
