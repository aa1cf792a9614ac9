"""The project's SVG charts, for the burst report and the admin dashboard: no script, no external
file, no font download.

Every function returns one ``<svg>`` element sized by its ``viewBox`` only, so it scales to the
width of its container (a phone's screen included). Each has ``role="img"``, a ``<title>`` and
a ``<desc>`` naming the figures it draws, linked by ``aria-labelledby``. Every piece of text
passes through :func:`esc`, so labels taken from the JSON or the database are inert.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from html import escape

#: One colour per backend, readable on white and distinguishable in greyscale order.
BACKEND_COLOURS = {
    "floor": "#64748b",
    "db": "#2563eb",
    "optimistic": "#0891b2",
    "redis": "#dc2626",
    "redlock": "#7c3aed",
    "etcd": "#059669",
    "zookeeper": "#0d9488",
    "atomic": "#65a30d",
    "redis-stock": "#db2777",
    "local": "#c2410c",
    "unsafe": "#d97706",
}
FALLBACK_COLOURS = ["#0f766e", "#be185d", "#4d7c0f", "#475569"]
#: viewBox width of every chart; about a phone's CSS width, so 12-unit text stays readable there.
WIDTH = 360
#: Row labels (12 units, right-aligned left of their bars): the plot starts far enough right for
#: the longest ("redis-stock ×64" is 15 characters), within these bounds; a label longer than the
#: widest margin is squeezed into it (``textLength``) rather than cut at the chart's edge.
ROW_LABEL_SIZE, ROW_LABEL_EM = 12, 0.6  # a generous average advance of a sans-serif character
LABEL_LEFT_MIN, LABEL_LEFT_MAX = 84, 150
_ids = itertools.count(1)


def label_left(labels: Sequence[str]) -> int:
    """The plot's left edge for ``labels`` drawn right-aligned before it (:func:`row_label`)."""
    widest = max((_label_width(label) for label in labels), default=0)
    return round(min(LABEL_LEFT_MAX, max(LABEL_LEFT_MIN, widest + 8)))


def row_label(label: str, *, left: float, y: float) -> str:
    """A row's name ending 6 units left of the plot at ``left``; squeezed to fit if it is wider."""
    room = left - 8
    fit = f' textLength="{num(room)}" lengthAdjust="spacingAndGlyphs"' if _label_width(label) > room else ""
    return f'<text class="tick row-label" x="{num(left - 6)}" y="{num(y)}" text-anchor="end"{fit}>{esc(label)}</text>'


def _label_width(label: str) -> float:
    return len(label) * ROW_LABEL_SIZE * ROW_LABEL_EM


def colour_for(name: str, index: int = 0) -> str:
    return BACKEND_COLOURS.get(name, FALLBACK_COLOURS[index % len(FALLBACK_COLOURS)])


@dataclass(frozen=True)
class Series:
    label: str
    points: Sequence[tuple[float, float]]
    colour: str


def nice_ticks(maximum: float, count: int = 5) -> list[float]:
    """Round tick values from 0 to at least ``maximum`` (1, 2 or 5 times a power of ten apart)."""
    if maximum <= 0 or not math.isfinite(maximum):
        return [0.0, 1.0]
    raw = maximum / count
    magnitude = 10 ** math.floor(math.log10(raw))
    step = next(m * magnitude for m in (1, 2, 5, 10) if m * magnitude >= raw)
    top = math.ceil(maximum / step) * step
    return [i * step for i in range(int(round(top / step)) + 1)]


def fmt(value: float) -> str:
    if abs(value) >= 10_000:
        return f"{value / 1000:.0f}k"
    if abs(value) >= 1000:
        return f"{value / 1000:.1f}k".replace(".0k", "k")
    if value == int(value):
        return f"{int(value)}"
    return f"{value:.1f}"


def esc(value: object) -> str:
    """``value`` as text safe inside an element or a double-quoted attribute."""
    return escape(str(value), quote=True)


def num(value: float) -> str:
    """A coordinate with one decimal."""
    return f"{value:.1f}"


def _svg(*, height: int, title: str, desc: str, body: list[str], css_class: str) -> str:
    ident = f"chart{next(_ids)}"
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" class="chart {css_class}" viewBox="0 0 {WIDTH} {height}" '
        f'role="img" aria-labelledby="{ident}-t {ident}-d">'
        f'<title id="{ident}-t">{esc(title)}</title><desc id="{ident}-d">{esc(desc)}</desc>{"".join(body)}</svg>'
    )


class Plot:
    """The plot area of a chart and the linear scales from data to viewBox units."""

    def __init__(
        self,
        *,
        height: int,
        x_max: float,
        y_max: float,
        left: int = 44,
        right: int = 12,
        top: int = 22,
        bottom: int = 34,
    ):
        self.height, self.left, self.right, self.top, self.bottom = height, left, right, top, bottom
        self.x_ticks, self.y_ticks = nice_ticks(x_max), nice_ticks(y_max)
        self.x_max, self.y_max = self.x_ticks[-1], self.y_ticks[-1]

    @property
    def base(self) -> float:
        return self.height - self.bottom

    def x(self, value: float) -> float:
        return self.left + (WIDTH - self.left - self.right) * (value / self.x_max if self.x_max else 0)

    def y(self, value: float) -> float:
        return self.base - (self.base - self.top) * (value / self.y_max if self.y_max else 0)

    def y_axis(self, label: str) -> list[str]:
        parts = []
        for tick in self.y_ticks:
            y = num(self.y(tick))
            parts.append(f'<line class="grid" x1="{self.left}" x2="{WIDTH - self.right}" y1="{y}" y2="{y}"/>')
            parts.append(
                f'<text class="tick" x="{self.left - 5}" y="{num(self.y(tick) + 4)}" text-anchor="end">'
                f"{fmt(tick)}</text>"
            )
        parts.append(f'<text class="axis-label" x="{self.left}" y="12">{esc(label)}</text>')
        return parts

    def x_axis(self, label: str) -> list[str]:
        parts = [f'<line class="axis" x1="{self.left}" x2="{WIDTH - self.right}" y1="{self.base}" y2="{self.base}"/>']
        for tick in self.x_ticks:
            parts.append(
                f'<text class="tick" x="{num(self.x(tick))}" y="{self.base + 14}" text-anchor="middle">'
                f"{fmt(tick)}</text>"
            )
        parts.append(
            f'<text class="axis-label" x="{WIDTH - self.right}" y="{self.height - 3}" text-anchor="end">'
            f"{esc(label)}</text>"
        )
        return parts


def timeline_chart(
    points: Sequence[tuple[float, float]], *, phases: Sequence[dict], colour: str, title: str, y_label: str, desc: str
) -> str:
    """One line over time (seconds) through ``points`` (at least one), with the fault phases as
    labelled bands behind it. ``phases`` are ``{"name", "start_s", "end_s"}`` with numeric bounds already checked.
    """
    x_max = max([x for x, _ in points] + [p["end_s"] for p in phases], default=1) or 1
    plot = Plot(height=210, x_max=x_max, y_max=max((y for _, y in points), default=1) or 1)
    body = []
    for phase in phases:
        x1, x2 = plot.x(phase["start_s"]), plot.x(phase["end_s"])
        body.append(
            f'<rect class="phase phase-{esc(phase["name"])}" x="{num(x1)}" y="{plot.top}" '
            f'width="{num(max(x2 - x1, 0.5))}" height="{num(plot.base - plot.top)}">'
            f"<title>{esc(phase['name'])}: {fmt(phase['start_s'])}–{fmt(phase['end_s'])} s</title></rect>"
        )
        body.append(
            f'<text class="phase-label" x="{num((x1 + x2) / 2)}" y="{plot.top + 11}" text-anchor="middle">'
            f"{esc(phase['name'])}</text>"
        )
    body += plot.y_axis(y_label) + plot.x_axis("seconds")
    path = " ".join(f"{num(plot.x(x))},{num(plot.y(y))}" for x, y in points)
    body.append(
        f'<polyline class="line" points="{path}" fill="none" stroke="{esc(colour)}" stroke-width="2.5" '
        'stroke-linejoin="round"/>'
    )
    return _svg(height=210, title=title, desc=desc, body=body, css_class="chart-timeline")


def line_chart(series: Sequence[Series], *, title: str, y_label: str) -> str:
    """Lines over time (seconds), one per series, on shared axes from zero; a dot marks each end."""
    points = [point for line in series for point in line.points]
    plot = Plot(
        height=210, x_max=max((x for x, _ in points), default=1) or 1, y_max=max((y for _, y in points), default=1) or 1
    )
    body = plot.y_axis(y_label) + plot.x_axis("seconds")
    for line in (line for line in series if line.points):
        path = " ".join(f"{num(plot.x(x))},{num(plot.y(y))}" for x, y in line.points)
        body.append(
            f'<polyline class="line" points="{path}" fill="none" stroke="{esc(line.colour)}" stroke-width="2.5" '
            f'stroke-linejoin="round"><title>{esc(line.label)}</title></polyline>'
        )
        end_x, end_y = line.points[-1]
        body.append(f'<circle cx="{num(plot.x(end_x))}" cy="{num(plot.y(end_y))}" r="3.5" fill="{esc(line.colour)}"/>')
    desc = "; ".join(
        f"{line.label}: from {fmt(line.points[0][1])} to {fmt(line.points[-1][1])} over {fmt(line.points[-1][0])} s"
        for line in series
        if line.points
    )
    return _svg(height=210, title=title, desc=desc or "no data", body=body, css_class="chart-line")


def _marker_x(value: float, bounds: Sequence[float], lower: float, slot: float, left: float) -> float | None:
    """Where ``value`` falls on equal-width buckets with upper ``bounds`` starting at ``lower``
    (log interpolation inside a bucket, linear in one starting at 0); None when beyond the last."""
    for i, upper in enumerate(bounds):
        if value <= upper:
            if lower > 0 and upper > lower:
                share = math.log(max(value, lower) / lower) / math.log(upper / lower)
            else:
                share = value / upper if upper else 0
            return left + slot * (i + share)
        lower = upper
    return None


def histogram_chart(
    buckets: Sequence[tuple[float, int]], *, colour: str, percentiles: dict[str, float], title: str, desc: str
) -> str:
    """Counts per latency bucket (``(upper bound ms, count)``, ascending), one equal-width bar per
    bucket, with the percentiles drawn as labelled lines where they fall. Empty buckets below the
    first filled one but one are left out; the axis starts at the bound below the first bar."""
    first = next((i for i, (_, count) in enumerate(buckets) if count), 0)
    start = max(0, first - 1)
    lower = buckets[start - 1][0] if start else 0.0
    buckets = list(buckets[start:])
    height = 220
    plot = Plot(height=height, x_max=1, y_max=max((c for _, c in buckets), default=1) or 1, bottom=38)
    body = plot.y_axis("requests")
    body.append(f'<line class="axis" x1="{plot.left}" x2="{WIDTH - plot.right}" y1="{plot.base}" y2="{plot.base}"/>')
    slot = (WIDTH - plot.left - plot.right) / max(len(buckets), 1)
    every = max(1, math.ceil(len(buckets) / 7))  # at most about seven labels under the bars
    body.append(f'<text class="tick" x="{plot.left}" y="{plot.base + 14}" text-anchor="middle">{fmt(lower)}</text>')
    bucket_lower = lower
    for i, (upper, count) in enumerate(buckets):
        x, top = plot.left + slot * i, plot.y(count)
        body.append(
            f'<rect x="{num(x + 0.5)}" y="{num(top)}" width="{num(max(slot - 1, 0.5))}" '
            f'height="{num(plot.base - top)}" fill="{esc(colour)}">'
            f"<title>{fmt(bucket_lower)}–{fmt(upper)} ms: {count} requests</title></rect>"
        )
        if (i + 1) % every == 0 or i == len(buckets) - 1:
            body.append(
                f'<text class="tick" x="{num(x + slot)}" y="{plot.base + 14}" text-anchor="middle">{fmt(upper)}</text>'
            )
        bucket_lower = upper
    body.append(
        f'<text class="axis-label" x="{WIDTH - plot.right}" y="{height - 3}" text-anchor="end">'
        "ms (bucket bounds)</text>"
    )
    bounds = [upper for upper, _ in buckets]
    for k, (name, value) in enumerate(percentiles.items()):
        x = _marker_x(value, bounds, lower, slot, plot.left)
        if x is None:
            continue
        # A label that would run past the right edge goes on the left of its line.
        label_x, anchor = (x + 3, "start") if x < WIDTH - plot.right - 26 else (x - 3, "end")
        body.append(f'<line class="marker" x1="{num(x)}" x2="{num(x)}" y1="{plot.top}" y2="{plot.base}"/>')
        body.append(
            f'<text class="marker-label" x="{num(label_x)}" y="{plot.top + 10 + 11 * k}" '
            f'text-anchor="{anchor}">{esc(name)}</text>'
        )
    return _svg(height=height, title=title, desc=desc, body=body, css_class="chart-histogram")


def hbar_chart(
    rows: Sequence[tuple[str, Sequence[tuple[str, float]]]],
    *,
    colours: Sequence[str],
    unit: str,
    title: str,
    desc: str,
    reference: tuple[str, float] | None = None,
    value_format: Callable[[float], str] = fmt,
) -> str:
    """Horizontal bars: per row label, one bar per (series name, value), values printed at the end.

    ``colours`` go by series position (or by row when every row has one bar and there are as many
    colours as rows); ``reference`` draws a labelled vertical line (e.g. the floor at 1.0×).
    """
    per_row = max((len(bars) for _, bars in rows), default=1)
    bar_h, gap = 13, 9
    height = 24 + 30 + len(rows) * (per_row * bar_h + gap)
    values = [v for _, bars in rows for _, v in bars] + ([reference[1]] if reference else [])
    left = label_left([label for label, _ in rows])
    x_max = max(values, default=1) * 1.15 or 1
    plot = Plot(height=height, x_max=x_max, y_max=1, left=left, right=14, top=20, bottom=30)
    body = []
    for tick in plot.x_ticks:
        x = num(plot.x(tick))
        body.append(f'<line class="grid" x1="{x}" x2="{x}" y1="{plot.top}" y2="{plot.base}"/>')
    body += plot.x_axis(unit)
    by_row = per_row == 1 and len(colours) == len(rows)

    def colour(i: int, j: int) -> str:
        return colours[i if by_row else j % len(colours)]

    y = plot.top + gap / 2
    for i, (label, bars) in enumerate(rows):
        body.append(row_label(label, left=plot.left, y=y + per_row * bar_h / 2 + 4))
        for j, (series, value) in enumerate(bars):
            width = plot.x(value) - plot.left
            body.append(
                f'<rect x="{plot.left}" y="{num(y + j * bar_h)}" width="{num(max(width, 1))}" '
                f'height="{bar_h - 2}" fill="{esc(colour(i, j))}" rx="2">'
                f"<title>{esc(' '.join(filter(None, (label, series))))}: "
                f"{value_format(value)} {esc(unit)}</title></rect>"
            )
            body.append(
                f'<text class="value" x="{num(plot.left + max(width, 1) + 4)}" '
                f'y="{num(y + j * bar_h + bar_h - 4)}">{value_format(value)}{esc(_suffix(series, per_row))}'
                "</text>"
            )
        y += per_row * bar_h + gap
    if reference:
        x = num(plot.x(reference[1]))
        body.append(f'<line class="reference" x1="{x}" x2="{x}" y1="{plot.top - 4}" y2="{plot.base}"/>')
        body.append(
            f'<text class="marker-label" x="{x}" y="{plot.top - 7}" text-anchor="middle">{esc(reference[0])}</text>'
        )
    return _svg(height=height, title=title, desc=desc, body=body, css_class="chart-bars")


@dataclass(frozen=True)
class Reach:
    """One figure against its target and what its row's own measurements allow it (``bounds``:
    (short name, value, what a hover says))."""

    label: str
    value: float
    target: float
    met: bool
    bounds: Sequence[tuple[str, float, str]] = ()
    #: The figure as its verdict prints it (more places when two would round it onto its target).
    shown: str = ""
    #: The lowest and highest of its rounds (a ``--repeat`` run), drawn as a whisker through the bar.
    spread: tuple[float, float] | None = None

    def marks(self) -> list[float]:
        """Where its marks stand: the target, each bound, the whisker's ends."""
        return [self.target, *(bound[1] for bound in self.bounds), *(self.spread or ())]


def reach_chart(rows: Sequence[Reach], *, unit: str, title: str, desc: str) -> str:
    """Horizontal bars, one a figure (green when met, red when not), its target a solid mark across
    it, each bound a dashed one named above it and, for a ``--repeat`` run, a whisker from its lowest
    round to its highest: how far a figure is from its target, whether what the row measured leaves
    room to get there, and whether its rounds agree on which side of the target it lies."""
    bar_h, gap, names_h = 12, 26, 11
    height = 24 + 30 + len(rows) * (bar_h + gap)
    left = label_left([row.label for row in rows])
    x_max = max([value for row in rows for value in (row.value, *row.marks())], default=1) * 1.1
    plot = Plot(height=height, x_max=x_max or 1, y_max=1, left=left, right=14, top=20, bottom=30)
    body = [
        f'<line class="grid" x1="{num(plot.x(t))}" x2="{num(plot.x(t))}" y1="{plot.top}" y2="{plot.base}"/>'
        for t in plot.x_ticks
    ]
    body += plot.x_axis(unit)
    y = plot.top + names_h + 2
    for row in rows:
        width = max(plot.x(row.value) - plot.left, 1)
        state = "met" if row.met else "not met"
        shown = esc(row.shown or f"{row.value:.2f}")
        body.append(row_label(row.label, left=plot.left, y=y + bar_h - 2))
        body.append(
            f'<rect class="{"reach-met" if row.met else "reach-short"}" x="{plot.left}" y="{num(y)}" '
            f'width="{num(width)}" height="{bar_h}" rx="2"><title>{esc(row.label)}: {shown} {esc(unit)}, '
            f"{state} (target {row.target:g})</title></rect>"
        )
        if row.spread is not None:
            body.append(_whisker(plot, row.spread, y=y + bar_h / 2, label=row.label, unit=unit))
        # The figure's value right of the bar and of every mark across it, so no mark covers it.
        end = max([plot.left + width, *(plot.x(mark) for mark in row.marks())])
        body.append(f'<text class="value" x="{num(end + 5)}" y="{num(y + bar_h - 2)}">{shown}</text>')
        x = num(plot.x(row.target))
        body.append(
            f'<line class="target-mark" x1="{x}" x2="{x}" y1="{num(y - 3)}" y2="{num(y + bar_h + 3)}">'
            f"<title>target {row.target:g}</title></line>"
        )
        for index, (name, value, said) in enumerate(row.bounds):
            x = num(plot.x(value))
            # Names alternate above and below the bar, so two bounds close together stay readable.
            name_y = y - 4 if index % 2 == 0 else y + bar_h + names_h
            body.append(
                f'<line class="bound-mark" x1="{x}" x2="{x}" y1="{num(y - 3)}" y2="{num(y + bar_h + 3)}">'
                f"<title>{esc(said)}</title></line>"
                f'<text class="mark-name" x="{x}" y="{num(name_y)}" text-anchor="middle">{esc(name)}</text>'
            )
        y += bar_h + gap
    return _svg(height=height, title=title, desc=desc, body=body, css_class="chart-bars")


def _whisker(plot: Plot, spread: tuple[float, float], *, y: float, label: str, unit: str) -> str:
    """A line from a figure's lowest round to its highest, capped at both ends."""
    low, high = (num(plot.x(value)) for value in spread)
    caps = "".join(f'<line x1="{x}" x2="{x}" y1="{num(y - 3)}" y2="{num(y + 3)}"/>' for x in (low, high))
    return (
        f'<g class="spread-mark"><title>{esc(label)}: its rounds {spread[0]:.2f}–{spread[1]:.2f} {esc(unit)}</title>'
        f'<line x1="{low}" x2="{high}" y1="{num(y)}" y2="{num(y)}"/>{caps}</g>'
    )


def _suffix(series: str, per_row: int) -> str:
    return f" {series}" if per_row > 1 else ""


@dataclass(frozen=True)
class Stack:
    """One bar of :func:`stacked_bar_chart`: its label, a value per part (in the chart's part
    order), and the share of part ``inset_of`` that the inset takes (drawn at that part's end)."""

    label: str
    values: Sequence[float]
    inset: float = 0.0


def _legend(entries: Sequence[tuple[str, str]], *, left: int, y: int) -> tuple[list[str], int]:
    """Swatches with names, wrapped onto more lines as they fill the width; returns the parts and
    the y below the last line."""
    parts, x = [], left
    for name, colour in entries:
        width = 14 + 5.8 * len(name) + 10  # about 5.8 units per character at 11 px
        if x + width > WIDTH and x > left:
            x, y = left, y + 15
        parts.append(f'<rect x="{num(x)}" y="{y - 9}" width="10" height="10" rx="2" fill="{esc(colour)}"/>')
        parts.append(f'<text class="tick legend" x="{num(x + 14)}" y="{y}">{esc(name)}</text>')
        x += width
    return parts, y + 10


def stacked_bar_chart(
    stacks: Sequence[Stack],
    *,
    parts: Sequence[tuple[str, str]],
    inset: tuple[int, str, str] | None = None,
    unit: str,
    title: str,
    desc: str,
    value_format: Callable[[float], str] = fmt,
) -> str:
    """Horizontal bars, one per :class:`Stack`, each split into ``parts`` (name, colour) laid end to
    end (a zero part draws nothing), the sum printed at the end; ``inset`` (part index, name,
    colour) draws a thinner bar inside that part, over its last ``Stack.inset`` units (the commit
    at the end of the hold). A legend names the parts above the bars."""
    legend, top = _legend([*parts, *([inset[1:]] if inset else [])], left=8, y=14)
    bar_h, gap = 14, 10
    height = top + 8 + len(stacks) * (bar_h + gap) + 30
    biggest = max((sum(stack.values) for stack in stacks), default=1) or 1
    left = label_left([stack.label for stack in stacks])
    plot = Plot(height=height, x_max=biggest * 1.18, y_max=1, left=left, right=14, top=top + 4, bottom=30)
    body = legend + [
        f'<line class="grid" x1="{num(plot.x(tick))}" x2="{num(plot.x(tick))}" y1="{plot.top}" y2="{plot.base}"/>'
        for tick in plot.x_ticks
    ]
    body += plot.x_axis(unit)
    y = plot.top + gap / 2
    for stack in stacks:
        body.append(row_label(stack.label, left=plot.left, y=y + bar_h / 2 + 4))
        body += _stacked_bar(stack, plot, y=y, height=bar_h, parts=parts, inset=inset, unit=unit)
        body.append(
            f'<text class="value" x="{num(plot.x(sum(stack.values)) + 4)}" y="{num(y + bar_h - 3)}">'
            f"{esc(value_format(sum(stack.values)))}</text>"
        )
        y += bar_h + gap
    return _svg(height=height, title=title, desc=desc, body=body, css_class="chart-stacked")


def _stacked_bar(
    stack: Stack,
    plot: Plot,
    *,
    y: float,
    height: int,
    parts: Sequence[tuple[str, str]],
    inset: tuple[int, str, str] | None,
    unit: str,
) -> list[str]:
    """One bar of :func:`stacked_bar_chart`: its parts end to end, and the inset."""
    body, start = [], 0.0

    def rect(begin: float, width: float, top: float, tall: float, colour: str, name: str) -> str:
        x1, x2 = plot.x(begin), plot.x(begin + width)
        return (
            f'<rect x="{num(min(x1, x2 - 1))}" y="{num(top)}" width="{num(max(x2 - x1, 1))}" height="{num(tall)}" '
            f'fill="{esc(colour)}"><title>{esc(stack.label)} {esc(name)}: {fmt(width)} {esc(unit)}</title></rect>'
        )

    for index, ((name, colour), value) in enumerate(zip(parts, stack.values, strict=True)):
        if value <= 0:
            continue
        body.append(rect(start, value, y, height, colour, name))
        if inset and index == inset[0] and stack.inset > 0:
            inner = min(stack.inset, value)
            body.append(rect(start + value - inner, inner, y + height / 4, height / 2, inset[2], inset[1]))
        start += value
    return body
