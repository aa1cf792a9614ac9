"""Browser tests: Playwright for Python driving Debian's Chromium against pytest-django's live server.

Playwright's own browser download does not work here, so the tests launch /usr/bin/chromium
(installed by ``make system`` / scripts/ensure-system.sh). A failing test leaves a screenshot
in artifacts/screenshots/.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

# Playwright's sync API runs an event loop in this thread; Django's ORM calls made by the test
# itself (fixtures, assertions) would otherwise raise SynchronousOnlyOperation.
os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
SCREENSHOTS = Path(__file__).resolve().parents[2] / "artifacts" / "screenshots"


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    report = yield
    setattr(item, f"report_{report.when}", report)
    return report


# Package scope: Playwright's event loop must be gone before later tests call asyncio.run().
@pytest.fixture(scope="package")
def browser():
    if not os.access(CHROMIUM, os.X_OK):
        pytest.fail(f"{CHROMIUM} is missing: run `make system` (Debian: apt-get install chromium)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield browser
        browser.close()


@pytest.fixture
def new_page(browser, request):
    """``new_page()`` opens a page in a fresh browser context (its own cookies: its own shopper)."""
    contexts = []

    def open_page(**options):
        context = browser.new_context(viewport={"width": 1280, "height": 900}, **options)
        context.set_default_timeout(10_000)
        contexts.append(context)
        return context.new_page()

    yield open_page
    failed = getattr(request.node, "report_call", None) is not None and request.node.report_call.failed
    if failed:
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        name = re.sub(r"[^\w.-]+", "_", request.node.nodeid.split("::", 1)[-1])
        for i, context in enumerate(contexts):
            for j, page in enumerate(context.pages):
                page.screenshot(path=str(SCREENSHOTS / f"FAILED-{name}-{i}{j}.png"), full_page=True)
    for context in contexts:
        context.close()


@pytest.fixture
def page(new_page):
    return new_page()


@pytest.fixture(autouse=True)
def static_from_app_directories(private_static_root):
    """The live server's WhiteNoise must not scan a staticfiles/ that collectstatic may be rewriting."""
