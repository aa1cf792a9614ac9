"""The report's batching section: each strategy alone in its section (BATCH=1) beside its batched rows.

A row's ``sections`` is the number of guard acquisitions (or, unguarded, transactions) that served
its purchases; ``rps`` its purchases per second. Each sentence is computed from the two rows of
one strategy in the same document, never written by hand.
"""

from __future__ import annotations

from django.utils.html import escape as esc

from .base import count, figure, ms, ratio, timing
from .views import View

HEAD = ["strategy", "BATCH", "purchases/s", "sections/s", "purchases per section", "batch p50", "p99 ms", "× alone"]


def pairs(shown: list[View]) -> list[tuple[View, View]]:
    """(the strategy at BATCH=1, the same strategy batched) for every batched row with a BATCH=1 twin."""
    alone = {v.name: v for v in shown if v.run.get("batch") == 1 and v.name != "floor"}
    return [
        (alone[v.name], v)
        for v in shown
        if isinstance(v.run.get("batch"), int) and v.run["batch"] > 1 and v.name in alone
    ]


def per_section(run: dict) -> float | None:
    sections, requests = figure(run, "sections"), figure(run, "requests")
    return requests / sections if sections and requests is not None else None


def sections_per_s(run: dict) -> float | None:
    sections, drain = figure(run, "sections"), figure(run, "drain_s")
    return sections / drain if sections is not None and drain else None


def batching_sentence(alone: dict, batched: dict) -> str | None:
    """``redis ×64: 41 purchases per lock acquisition, 6.2× the same lock one purchase at a time``."""
    shared, rps, rps_alone = per_section(batched), figure(batched, "rps"), figure(alone, "rps")
    if shared is None or not rps or not rps_alone:
        return None
    unit = "lock acquisition" if timing(batched, "lock_wait_ms", "p50") is not None else "transaction"
    name = f"{batched['row']} ×{batched['batch']}"
    return (
        f"{name}: {shared:.0f} purchases per {unit}, {ratio(rps / rps_alone)} the same "
        f"{'lock' if unit == 'lock acquisition' else 'strategy'} one purchase at a time"
    )


def _cells(run: dict, alone: dict | None) -> str:
    shared, per_s = per_section(run), sections_per_s(run)
    rps, rps_alone = figure(run, "rps"), figure(alone, "rps") if alone else None
    values = [
        str(run.get("batch", "–")),
        count(rps) if rps is not None else "–",
        count(per_s) if per_s is not None else "–",
        f"{shared:.1f}" if shared is not None else "–",
        f"{figure(run, 'batch_p50'):g}" if figure(run, "batch_p50") is not None else "–",
        ms(figure(run, "p99_ms")) if figure(run, "p99_ms") is not None else "–",
        ratio(rps / rps_alone) if alone and rps and rps_alone else "–",
    ]
    return "".join(f'<td class="num">{esc(value)}</td>' for value in values)


def batching_section(shown: list[View]) -> str:
    """The section, or nothing when no strategy ran both alone and batched."""
    found = pairs(shown)
    if not found:
        return ""
    rows, said = [], []
    for alone, batched in found:
        rows.append(f"<tr><th scope=row>{esc(alone.name)}</th>{_cells(alone.run, None)}</tr>")
        rows.append(f"<tr><th scope=row>{esc(batched.label)}</th>{_cells(batched.run, alone.run)}</tr>")
        text = batching_sentence(alone.run, batched.run)
        if text:
            said.append(f"<li>{esc(text)}.</li>")
    head = "".join(f"<th scope=col>{esc(title)}</th>" for title in HEAD)
    return (
        '<section aria-labelledby="batching"><h2 id="batching">Batching: many purchases per section</h2>'
        "<p>Each strategy alone in its section (BATCH=1) and with purchases of one worker sharing a section "
        "(one guard, one read, one stock write, one commit). Sections are guard acquisitions, or transactions "
        "for the unguarded strategies.</p>"
        f'<ul class="sentences">{"".join(said)}</ul>'
        f'<table class="comparison"><thead><tr>{head}</tr></thead><tbody>{"".join(rows)}</tbody></table></section>'
    )
