"""How the page names and shows each run: empty cells, and one View per run."""

from __future__ import annotations

import re

from django.utils.html import escape as esc

from .base import MISSING, batched, count, row_label
from .sentences import sentence
from .svg import colour_for


def cell(value: float | None, formatter=count) -> str:
    return MISSING if value is None else formatter(value)


class View:
    """One run as the page shows it: its figures, a label unique on the page, its sentence, colour and anchor."""

    def __init__(self, run: dict, *, index: int, label: str, name: str | None = None):
        self.run, self.name, self.label = run, run["row"], label
        self.sentence = sentence(run, name=name)
        self.colour = colour_for(self.name, index)
        self.anchor = f"run-{index + 1}-{re.sub(r'[^a-z0-9]+', '-', self.name.lower()).strip('-')}"


def views(runs: list[dict]) -> list[View]:
    """A view per run; a strategy that ran more than once is labelled by its fault or scenario too.
    In a document with batched rows every strategy row names its BATCH size (``db ×1``)."""
    sized = batched(runs)
    seen: dict[str, int] = {}
    for run in runs:
        seen[row_label(run, with_batch_1=sized)] = seen.get(row_label(run, with_batch_1=sized), 0) + 1
    made = []
    for i, run in enumerate(runs):
        label = name = row_label(run, with_batch_1=sized)
        if seen[label] > 1:
            via = run.get("balancer")
            through = f"via {via}" if isinstance(via, str) and via != "none" else None
            through = "on ASGI" if run.get("server") == "asgi" else through
            detail = run.get("fault") or through or run.get("scenario")
            label += f" ({detail if isinstance(detail, str) and detail else f'run {i + 1}'})"
        made.append(View(run, index=i, label=label, name=name))
    return made


def paired_rows(found, cells, sentence) -> tuple[list[str], list[str]]:
    """A comparison section's table rows and sentences: for each pair (first, second) of views, a row
    each (``cells(run, None)``, then ``cells(run, first.run)``) and ``sentence(first.run, second.run)``
    as a list item when it says something (the batching and the servers sections)."""
    rows, said = [], []
    for first, second in found:
        rows.append(f"<tr><th scope=row>{esc(first.label)}</th>{cells(first.run, None)}</tr>")
        rows.append(f"<tr><th scope=row>{esc(second.label)}</th>{cells(second.run, first.run)}</tr>")
        text = sentence(first.run, second.run)
        if text:
            said.append(f"<li>{esc(text)}.</li>")
    return rows, said
