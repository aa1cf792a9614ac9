"""The report's batching section: each strategy alone in its section (BATCH=1) beside its batched rows,
where their purchases' time went, and the hot-row limit they are read against.

A row's ``sections`` is the number of guard acquisitions (or, unguarded, transactions) that served
its purchases; ``rps`` its purchases per second; ``breakdown`` the means of its purchases' server
time, part by part. Each sentence is computed from the rows of the same document, never written
by hand.
"""

from __future__ import annotations

from django.utils.html import escape as esc

from .. import cpu
from ..targets import tally, verdicts
from . import svg
from .base import breakdown_of, count, figure, ms, ratio, timing
from .charts import breakdown_chart
from .sentences import time_sentence
from .views import View, paired_rows

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
    rows, said = paired_rows(found, _cells, batching_sentence)
    head = "".join(f"<th scope=col>{esc(title)}</th>" for title in HEAD)
    return (
        '<section aria-labelledby="batching"><h2 id="batching">Batching: many purchases per section</h2>'
        "<p>Each strategy alone in its section (BATCH=1) and with purchases of one worker sharing a section "
        "(one guard, one read, one stock write, one commit). Sections are guard acquisitions, or transactions "
        "for the unguarded strategies.</p>"
        f'<ul class="sentences">{"".join(said)}</ul>'
        f'<div class="table-scroll"><table class="comparison"><thead><tr>{head}</tr></thead>'
        f"<tbody>{''.join(rows)}</tbody></table></div>"
        f"{where_time_went([view for pair in found for view in pair])}"
        f"{what_a_request_cost([view for pair in found for view in pair])}"
        f"{targets_list([view.run for view in shown])}</section>"
    )


def targets_list(runs: list[dict]) -> str:
    """Issue 28's targets whose rows ran, each with its figure, met or not (:mod:`loadtests.targets`,
    as ``flashsale`` prints them); nothing when none of their rows ran."""
    found = verdicts(runs)
    if not found:
        return ""
    items = "".join(f"<li>{esc(verdict.line().strip())}</li>" for verdict in found)
    charts = "".join(
        f'<figure class="card overview">{chart}</figure>'
        for chart in (
            _reach([v for v in found if v.target.what in ("alone", "batched")], unit="× the floor"),
            _reach([v for v in found if v.target.what == "own"], unit="× its own BATCH 1"),
        )
        if chart
    )
    return (
        '<h3 id="targets">Against issue 28\'s targets</h3>'
        f"<p>Read off this run's rows: {esc(tally(found))}. A ratio to the floor belongs to the "
        "machine it was measured on: read it from a quiet one. In the charts each bar is a figure (green "
        "met, red not), the solid mark its target, and each dashed mark the most the row's own measurements "
        "allow it: its CPU a purchase, and for a row alone behind a lock, one holder at a time for its mean "
        "hold. A target beyond every dashed mark asks a cheaper purchase or a shorter hold, not a luckier run. "
        "With <code>--repeat</code>, a whisker spans the figure's rounds: one that crosses the target is a "
        "figure another run may read on its other side.</p>"
        f'<ul class="sentences">{items}</ul>{charts}'
    )


def _reach(found: list, *, unit: str) -> str:
    """The verdicts' figures against their targets and bounds (:func:`svg.reach_chart`); nothing without any."""
    if not found:
        return ""
    rows = [
        svg.Reach(
            label=f"{v.target.strategy} {'alone' if v.target.what == 'alone' else 'batched'}",
            value=v.value,
            target=v.target.minimum,
            met=v.met,
            bounds=[(bound.short, bound.value, bound.said) for bound in v.bounds],
            shown=v.shown,
            spread=v.spread,
        )
        for v in found
    ]
    said = "; ".join(verdict.line().strip() for verdict in found)
    return svg.reach_chart(rows, unit=unit, title=f"Issue 28's targets, {unit}", desc=said)


def where_time_went(shown: list[View]) -> str:
    """A sentence per row on where its purchases' server time went and one stacked bar each (queue,
    acquire, hold with its commit, outside); nothing when no row has a breakdown."""
    found = [v for v in shown if breakdown_of(v.run) is not None]
    if not found:
        return ""
    said = "".join(f"<li>{esc(time_sentence(v.run, name=v.label))}.</li>" for v in found)
    chart = breakdown_chart([(v.label, v.run) for v in found], title="Where a purchase's server time went")
    return (
        '<h3 id="time-went">Where a purchase\'s time went</h3>'
        "<p>Means over the purchases whose section ran: queued for a batch, waiting for the guard (acquire), "
        "holding it (without a lock: the section's transaction, BEGIN to COMMIT, which holds db's row lock "
        "and so contains its wait; its COMMIT drawn inside), and the rest of the request outside the section. "
        "The four add up to the purchase's server time.</p>"
        f'<ul class="sentences">{said}</ul><figure class="card overview">{chart}</figure>'
    )


#: The CPU chart's parts: the groups of :mod:`loadtests.cpu`, in its order, each with its colour.
_GROUP_COLOURS = {
    "pods": "#2563eb",
    "postgres": "#0f766e",
    "redis": "#dc2626",
    "lock service": "#f59e0b",
    "balancer": "#a855f7",
    "locust": "#64748b",
}
CPU_COLOURS = [(group, _GROUP_COLOURS[group]) for group in cpu.ORDER]


def what_a_request_cost(shown: list[View]) -> str:
    """A sentence per row on the CPU a purchase cost against its floor round's, and a stacked bar
    each (the row's, then its floor round's): on cores both rounds keep busy, ×floor is about one
    over that ratio. Nothing when no row measured it (``cpu_ms``)."""
    found = [v for v in shown if _cpu_figures(v.run.get("cpu_ms"))]
    if not found:
        return ""
    stacks, said = [], []
    for v in found:
        cost, floor = _cpu_figures(v.run["cpu_ms"]), _cpu_figures((v.run.get("floor") or {}).get("cpu_ms"))
        stacks.append(svg.Stack(v.label, [cost.get(group, 0.0) for group, _ in CPU_COLOURS]))
        sentence = f"{v.label}: {_cpu(cost['total'])} ms of CPU a purchase"
        if floor:
            stacks.append(svg.Stack("its floor", [floor.get(group, 0.0) for group, _ in CPU_COLOURS]))
            sentence += f", {ratio(cost['total'] / floor['total'])} its floor round's {_cpu(floor['total'])} ms"
        said.append(sentence)
    chart = svg.stacked_bar_chart(
        stacks,
        parts=CPU_COLOURS,
        unit="CPU ms per request",
        title="What a request cost in CPU, by who spent it",
        desc="; ".join(said),
        value_format=_cpu,
    )
    return (
        '<h3 id="cpu-cost">What a request cost in CPU</h3>'
        "<p>CPU time of every process that served or drove a round (the pods, PostgreSQL, Redis, the lock "
        "service, HAProxy, Locust; read from /proc as the round opened and ended) over its answered requests, "
        "each row's purchase round beside the floor round on its own pods. Where the two cores are the bound, "
        "a row's ×floor is about one over the ratio of the two.</p>"
        f'<ul class="sentences">{"".join(f"<li>{esc(one)}.</li>" for one in said)}</ul>'
        f'<figure class="card overview">{chart}</figure>'
    )


def _cpu_figures(measured: object) -> dict[str, float] | None:
    """A ``cpu_ms`` document's figures (each a number of 0 or more: another value, from a hand-edited
    file, counts as not measured), or None when its total is not above 0."""
    if not isinstance(measured, dict):
        return None
    found = {key: value for key in measured if (value := figure(measured, key)) is not None}
    return found if found.get("total") else None


def _cpu(value: float) -> str:
    """CPU ms to the hundredth: a purchase and its floor round differ by tenths."""
    return f"{value:.2f}"


#: The hot-row table: (heading, key of a shape, format).
HOT_ROW_COLUMNS = [
    ("connections", "connections", count),
    ("purchases per commit", "batch", count),
    ("sold", "sold", count),
    ("seconds", "seconds", lambda value: f"{value:.2f}"),
    ("purchases/s", "rps", count),
    ("commits", "commits", count),
]


def hot_row_section(shapes: object, shown: list[View]) -> str:
    """The hot-row limit (``flashsale --hot-row``): each shape's row, and each strategy row's
    purchases/s as a share of the shape of its BATCH; nothing when the document has none."""
    shapes = [s for s in shapes if isinstance(s, dict)] if isinstance(shapes, list) else []
    if not shapes:
        return ""
    head = "".join(f"<th scope=col>{esc(title)}</th>" for title in ["shape", *(c[0] for c in HOT_ROW_COLUMNS), "audit"])
    rows = []
    for shape in shapes:
        cells = "".join(
            f'<td class="num">{esc(fmt(figure(shape, key)) if figure(shape, key) is not None else "–")}</td>'
            for _, key, fmt in HOT_ROW_COLUMNS
        )
        audit = "ok" if shape.get("ok") is True else "broke" if shape.get("ok") is False else "–"
        rows.append(f"<tr><th scope=row>{esc(shape.get('name', '–'))}</th>{cells}<td>{esc(audit)}</td></tr>")
    read = [
        f"{v.label} {ratio(figure(v.run, 'hot_row_ratio'))} {_shape_of(v.run, shapes)}"
        for v in shown
        if figure(v.run, "hot_row_ratio") is not None
    ]
    against = f"<p>Each strategy row's purchases/s against the shape of its BATCH: {esc(', '.join(read))}.</p>"
    return (
        '<section aria-labelledby="hot-row"><h2 id="hot-row">The hot-row limit</h2>'
        "<p>What this machine's PostgreSQL gives the sale's product row with no shop around it: plain psycopg, "
        "no Django, no HTTP; each connection's transaction is a conditional UPDATE, the orders' INSERT and a "
        "COMMIT, for one purchase or for many. No strategy row can beat the shape of its BATCH.</p>"
        f'<div class="table-scroll"><table class="comparison"><thead><tr>{head}</tr></thead>'
        f"<tbody>{''.join(rows)}</tbody></table></div>{against if read else ''}</section>"
    )


def _shape_of(run: dict, shapes: list[dict]) -> str:
    """The name of the hot-row shape a row is read against: many purchases per commit for a batched row."""
    batched = isinstance(run.get("batch"), int) and run["batch"] > 1
    found = (s for s in shapes if isinstance(s.get("batch"), int) and (s["batch"] > 1) == batched)
    return str(next(found, {}).get("name", "its shape"))
