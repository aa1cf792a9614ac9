"""Two collects of static files at once (a burst row beside the ASGI browser test, in two xdist
workers) must both succeed, and a server must not start while a collect rewrites the folder: both
seen in make test as a FileNotFoundError on a hashed file a collect had replaced.

The tests here run one at a time, in one xdist worker: the first empties the folder's mark so that
a collect is real, which, beside the third, made CI's run see a collect where it expected none."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from django.conf import settings
from django.contrib.staticfiles.storage import ManifestFilesMixin

from loadtests.pods import COLLECTED_MARK, collect_static, static_sources_fingerprint
from shop.settings import STATIC_ROOT
from shop.static_lock import static_files

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("static-collect")]


def collect_into(errors: list[BaseException]) -> None:
    try:
        collect_static()
    except BaseException as error:  # noqa: BLE001 - reported by the test, with the other thread's
        errors.append(error)


def test_two_collects_at_once_both_succeed():
    for _ in range(3):
        (Path(STATIC_ROOT) / COLLECTED_MARK).unlink(missing_ok=True)  # one of the two collects for real
        errors: list[BaseException] = []
        threads = [threading.Thread(target=collect_into, args=(errors,)) for _ in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(120)
        assert not errors, errors


def test_a_server_starting_during_a_collect_waits_for_it():
    """A pod's WSGI application loads (WhiteNoise scans STATIC_ROOT) only outside a collect: seen in
    make test as a gunicorn pod exiting with FileNotFoundError on a hashed file a collect replaced."""
    script = "import time, shop.wsgi; print(time.monotonic())"  # loads the application under the shared lock
    with static_files(writing=True):
        child = subprocess.Popen(
            [sys.executable, "-c", script],
            cwd=settings.BASE_DIR,
            env={**os.environ, "DJANGO_SETTINGS_MODULE": "shop.settings"},
            stdout=subprocess.PIPE,
            text=True,
        )
        time.sleep(2)  # far longer than the application takes to load
        released = time.monotonic()
        assert child.poll() is None, "the application loaded while a collect held the lock"
    out, _ = child.communicate(timeout=60)
    assert child.returncode == 0 and float(out.split()[-1]) >= released


def test_a_collect_of_the_same_sources_is_skipped_and_a_changed_source_collects_again():
    """A collect costs seconds (every file hashed and compressed) and each ``flashsale`` run asks for
    one: the folder keeps what its last collect was of. ``collect_static`` says whether it collected;
    every real collect also writes the manifest anew."""
    manifest = Path(STATIC_ROOT) / ManifestFilesMixin.manifest_name
    mark = Path(STATIC_ROOT) / COLLECTED_MARK
    collect_static()
    written = manifest.stat().st_mtime_ns
    assert collect_static() is False, "nothing changed, yet the files were collected again"
    assert manifest.stat().st_mtime_ns == written, "a skipped collect rewrote the manifest"

    # From here a burst in the other worker may collect the edited sources first: the test reads
    # what the folder holds afterwards, not which process collected it.
    source = Path(settings.BASE_DIR) / "shop" / "static" / "shop" / "shop.css"
    was = source.stat()
    os.utime(source, ns=(was.st_atime_ns, was.st_mtime_ns + 1_000_000_000))  # an edit, as make sees one
    try:
        collect_static()
        assert manifest.stat().st_mtime_ns > written, "an edited stylesheet was not collected"
        assert mark.read_text() == static_sources_fingerprint(), "the folder does not say it holds the edit"
    finally:
        os.utime(source, ns=(was.st_atime_ns, was.st_mtime_ns))

    manifest.unlink()  # a folder emptied by hand
    collect_static()
    assert manifest.is_file(), "a folder without its manifest was taken for collected"
    collected = manifest.stat().st_mtime_ns
    assert collect_static(force=True) is True
    assert manifest.stat().st_mtime_ns > collected, "force did not collect"
