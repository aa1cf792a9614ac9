"""``make serve`` on a fresh clone: what its steps leave for gunicorn, and the order they run in.

Each step is read from ``make -n`` (what make would run; it runs nothing): the static target's
collect is then run for real into a folder of the test's own, never the checkout's."""

from __future__ import annotations

import json
import os
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
