"""``make serve`` on a fresh clone: what its steps leave for gunicorn, and the order they run in.

Each step is read from ``make -n`` (what make would run; it runs nothing): the static target's
collect is then run for real into a folder of the test's own, never the checkout's."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def make_steps(target: str) -> list[str]:
    """The commands ``make target`` would run, in order."""
    result = subprocess.run(["make", "-n", target], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    return result.stdout.splitlines()


def run_step(step: str, **env) -> subprocess.CompletedProcess:
    """``step`` as make runs it, in a shell with none of this process's ``DJANGO_`` or ``FLASHSALE_``
    variables: a fresh shell's, not the suite's."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("DJANGO_", "FLASHSALE_"))}
    return subprocess.run(
        ["bash", "-c", step], cwd=ROOT, env={**clean, **env}, capture_output=True, text=True, timeout=120
    )


@pytest.mark.slow
def test_make_static_collects_the_manifest_gunicorn_serves_from(tmp_path):
    """Seen on a fresh clone: ``make serve`` answered 500 on every page (Missing staticfiles manifest
    entry for 'shop/shop.css'). The static target collected with DEBUG on, the development default,
    through the plain storage, which writes no manifest; gunicorn runs with DEBUG off, through the
    manifest storage. The checkout's folder hid it, holding a manifest from an earlier burst's collect."""
    [collect] = [step for step in make_steps("static") if "collectstatic" in step]
    root = tmp_path / "static"
    (tmp_path / "static_elsewhere.py").write_text(f"from shop.settings import *  # noqa\nSTATIC_ROOT = {str(root)!r}\n")
    result = run_step(collect, DJANGO_SETTINGS_MODULE="static_elsewhere", PYTHONPATH=str(tmp_path))
    assert result.returncode == 0, result.stderr
    manifest = root / "staticfiles.json"
    assert manifest.is_file(), f"{collect!r} wrote no manifest: gunicorn would answer 500 on every page"
    assert {"shop/shop.css", "shop/shop.js"} <= set(json.loads(manifest.read_text())["paths"])


#: What ``make serve`` changes as it goes: the machine's services started, the database created and
#: migrated, the Redlock nodes started (preflight), the demo products seeded, gunicorn started.
CHANGES = re.compile(r"ensure-services|manage\.py (preflight|migrate|seed)|gunicorn -c gunicorn\.conf\.py$")


def test_make_serve_refuses_a_bad_gunicorn_setting_before_it_changes_anything():
    """Seen: ``GUNICORN_WORKERS=abc make serve`` seeded first, deleting the demo sale's orders and
    resetting its stock, and only then did gunicorn refuse its settings. Every ``make serve`` also
    reset the demo products, which no page said."""
    steps = make_steps("serve")
    checks = [i for i, step in enumerate(steps) if "gunicorn" in step and "--check-config" in step]
    changes = [i for i, step in enumerate(steps) if CHANGES.search(step)]
    assert checks and checks[0] < changes[0], f"nothing checks gunicorn's settings before {steps[changes[0]]!r}"
    result = run_step(steps[checks[0]], GUNICORN_WORKERS="abc")
    assert result.returncode == 1
    assert result.stderr.strip().splitlines() == ["GUNICORN_WORKERS='abc': expected a whole number"], result.stderr
    seeds = [step for step in steps if "manage.py seed" in step]
    assert seeds and all(step.endswith("seed --missing-only") for step in seeds), seeds  # the orders are kept
