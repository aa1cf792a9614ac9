"""How the page names and shows each run: empty cells, and one View per run."""

from __future__ import annotations

import re

from .base import MISSING, count
from .sentences import sentence
from .svg import colour_for


def cell(value: float | None, formatter=count) -> str:
    return MISSING if value is None else formatter(value)


class View:
    """One run as the page shows it: its figures, a label unique on the page, its sentence, colour and anchor."""

    def __init__(self, run: dict, *, index: int, label: str):
        self.run, self.name, self.label = run, run["row"], label
        self.sentence = sentence(run)
        self.colour = colour_for(self.name, index)
        self.anchor = f"run-{index + 1}-{re.sub(r'[^a-z0-9]+', '-', self.name.lower()).strip('-')}"


def batch_label(run: dict) -> str:
    """The row's name (a strategy, or floor), with its BATCH size when purchases shared sections (``redis ×64``)."""
    batch = run.get("batch")
    return run["row"] + (f" ×{batch}" if isinstance(batch, int) and batch > 1 else "")


def views(runs: list[dict]) -> list[View]:
    """A view per run; a strategy that ran more than once is labelled by its fault or scenario too."""
    seen: dict[str, int] = {}
    for run in runs:
        seen[batch_label(run)] = seen.get(batch_label(run), 0) + 1
    made = []
    for i, run in enumerate(runs):
        label = batch_label(run)
        if seen[label] > 1:
            via = run.get("balancer")
            through = f"via {via}" if isinstance(via, str) and via != "none" else None
            through = "on ASGI" if run.get("server") == "asgi" else through
            detail = run.get("fault") or through or run.get("scenario")
            label += f" ({detail if isinstance(detail, str) and detail else f'run {i + 1}'})"
        made.append(View(run, index=i, label=label))
    return made
