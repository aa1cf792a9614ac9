"""A report section that sets rows of the same strategy side by side, two at a time (batching, servers).

Each pair is two rows of one document; ``cells(run, first)`` gives a row's table cells (``first`` is
the pair's first run, None for that run itself) and ``sentence(first, second)`` the computed sentence,
or None when a figure it needs is missing. Every figure and label is escaped here.
"""

from __future__ import annotations

from typing import Callable

from django.utils.html import escape as esc

from .views import View


def pairs_section(
    found: list[tuple[View, View]],
    *,
    anchor: str,
    title: str,
    intro: str,
    head: list[str],
    cells: Callable[[dict, dict | None], list[str]],
    sentence: Callable[[dict, dict], str | None],
    first_label: Callable[[View], str] = lambda view: view.name,
) -> str:
    """The section's HTML, or nothing when no pair was found."""
    if not found:
        return ""
    rows, said = [], []
    for first, second in found:
        for view, against in ((first, None), (second, first.run)):
            label = first_label(view) if against is None else view.label
            values = "".join(f'<td class="num">{esc(value)}</td>' for value in cells(view.run, against))
            rows.append(f"<tr><th scope=row>{esc(label)}</th>{values}</tr>")
        text = sentence(first.run, second.run)
        if text:
            said.append(f"<li>{esc(text)}.</li>")
    columns = "".join(f"<th scope=col>{esc(name)}</th>" for name in head)
    return (
        f'<section aria-labelledby="{anchor}"><h2 id="{anchor}">{esc(title)}</h2>'
        f"<p>{esc(intro)}</p>"
        f'<ul class="sentences">{"".join(said)}</ul>'
        f'<table class="comparison"><thead><tr>{columns}</tr></thead><tbody>{"".join(rows)}</tbody></table></section>'
    )
