"""The report's text, pinned: ``tests/burst_fixture.json`` rendered now must read as it read when
``tests/report_golden.json`` was captured (sentences, headings, captions, every table cell, the
number of charts), whatever renders the HTML. Regenerate the golden file only for a change that
means to alter the text: ``python -m tests.test_report_golden``.
"""

from __future__ import annotations

import json
import re
from html.parser import HTMLParser
from pathlib import Path

FIXTURE = Path(__file__).with_name("burst_fixture.json")
GOLDEN = Path(__file__).with_name("report_golden.json")

#: Elements whose text is pinned, keyed by what they are.
_PINNED = {"h1": "headings", "h2": "headings", "h3": "headings", "caption": "captions", "figcaption": "captions"}
_CELLS = {"td", "th", "dt", "dd"}


class _Text(HTMLParser):
    def __init__(self):
        super().__init__()
        self.found: dict[str, list[str]] = {"sentences": [], "headings": [], "captions": [], "cells": [], "lede": []}
        self.charts = 0
        self._open: list[tuple[str, str, list[str]]] = []

    def handle_starttag(self, tag, attrs):
        classes = (dict(attrs).get("class") or "").split()
        if tag == "svg":
            self.charts += 1
        kind = _PINNED.get(tag) or ("cells" if tag in _CELLS else None)
        if "sentence" in classes:
            kind = "sentences"
        elif "lede" in classes:
            kind = "lede"
        if kind:
            self._open.append((tag, kind, []))

    def handle_endtag(self, tag):
        if self._open and self._open[-1][0] == tag:
            _, kind, parts = self._open.pop()
            self.found[kind].append(re.sub(r"\s+", " ", "".join(parts)).strip())

    def handle_data(self, data):
        for _, _, parts in self._open:
            parts.append(data)


def report_text(html: str) -> dict:
    """What a reader of the page sees, in order, without markup or the time it was written."""
    parser = _Text()
    parser.feed(html)
    return {**parser.found, "charts": parser.charts}


def rendered() -> dict:
    from loadtests.report.page import render_report

    return report_text(render_report(json.loads(FIXTURE.read_text())))


def test_the_report_reads_as_it_did():
    golden = json.loads(GOLDEN.read_text())
    now = rendered()
    assert now["charts"] == golden["charts"] > 0
    for kind in ("sentences", "lede", "headings", "captions", "cells"):
        assert now[kind] == golden[kind], kind


if __name__ == "__main__":
    import os

    import django

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
    django.setup()
    GOLDEN.write_text(json.dumps(rendered(), indent=1, ensure_ascii=False) + "\n")
