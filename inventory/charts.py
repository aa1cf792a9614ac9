"""Small server-side SVG charts for the admin dashboard: no JavaScript, no CDN.

Each function returns a complete ``<svg>`` element as a string, with a ``<title>`` and
``<desc>`` for screen readers; the dashboard shows the same figures in a table as well. All
text is XML-escaped, so labels may come from the database.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from xml.sax.saxutils import escape

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


def colour_for(name: str, index: int = 0) -> str:
    return BACKEND_COLOURS.get(name, FALLBACK_COLOURS[index % len(FALLBACK_COLOURS)])


@dataclass(frozen=True)
class Series:
    label: str
    points: Sequence[tuple[float, float]]
    colour: str


@dataclass(frozen=True)
class Bar:
    label: str
    value: float
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


def _attrs(**attrs) -> str:
    return " ".join(
        f'{k.rstrip("_").replace("_", "-")}="{escape(str(v), {chr(34): "&quot;"})}"' for k, v in attrs.items()
    )


class _Frame:
    """The plot area inside the SVG, with scales from data to pixels."""

    def __init__(self, *, width: int, height: int, x_max: float, y_max: float, left: int = 52, bottom: int = 40):
        self.width, self.height = width, height
        self.left, self.right, self.top, self.bottom = left, 16, 16, bottom
        self.x_ticks = nice_ticks(x_max)
        self.y_ticks = nice_ticks(y_max)
        self.x_max, self.y_max = self.x_ticks[-1], self.y_ticks[-1]

    def x(self, value: float) -> float:
        span = self.width - self.left - self.right
        return self.left + span * (value / self.x_max if self.x_max else 0)

    def y(self, value: float) -> float:
        span = self.height - self.top - self.bottom
        return self.height - self.bottom - span * (value / self.y_max if self.y_max else 0)

    def y_axis(self, label: str) -> list[str]:
        parts = []
        for tick in self.y_ticks:
            y = self.y(tick)
            parts.append(
                f'<line class="grid" {_attrs(x1=self.left, x2=self.width - self.right, y1=f"{y:.1f}", y2=f"{y:.1f}")}/>'
            )
            at = _attrs(x=self.left - 6, y=f"{y + 4:.1f}", text_anchor="end")
            parts.append(f'<text class="tick" {at}>{fmt(tick)}</text>')
        mid = (self.top + self.height - self.bottom) / 2
        at = _attrs(x=12, y=f"{mid:.1f}", text_anchor="middle", transform=f"rotate(-90 12 {mid:.1f})")
        parts.append(f'<text class="axis-label" {at}>{escape(label)}</text>')
        return parts

    def x_axis(self, label: str) -> list[str]:
        base = self.height - self.bottom
        parts = [f'<line class="axis" {_attrs(x1=self.left, x2=self.width - self.right, y1=base, y2=base)}/>']
        for tick in self.x_ticks:
            x = self.x(tick)
            at = _attrs(x=f"{x:.1f}", y=base + 16, text_anchor="middle")
            parts.append(f'<text class="tick" {at}>{fmt(tick)}</text>')
        at = _attrs(x=(self.left + self.width - self.right) / 2, y=self.height - 4, text_anchor="middle")
        parts.append(f'<text class="axis-label" {at}>{escape(label)}</text>')
        return parts


def _svg(*, width: int, height: int, title: str, desc: str, body: list[str], css_class: str) -> str:
    at = _attrs(class_=css_class, viewBox=f"0 0 {width} {height}", role="img", preserveAspectRatio="xMidYMid meet")
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" {at}>'
        f"<title>{escape(title)}</title><desc>{escape(desc)}</desc>{''.join(body)}</svg>"
    )


def line_chart(
    series: Sequence[Series], *, title: str, x_label: str, y_label: str, width: int = 640, height: int = 280
) -> str:
    """Lines from (x, y) points, one per series, on shared axes starting at zero."""
    xs = [x for s in series for x, _ in s.points]
    ys = [y for s in series for _, y in s.points]
    frame = _Frame(width=width, height=height, x_max=max(xs, default=1), y_max=max(ys, default=1))
    body = frame.y_axis(y_label) + frame.x_axis(x_label)
    for s in series:
        if not s.points:
            continue
        path = " ".join(f"{frame.x(x):.1f},{frame.y(y):.1f}" for x, y in s.points)
        at = _attrs(points=path, fill="none", stroke=s.colour, stroke_width=2.5, stroke_linejoin="round")
        body.append(f'<polyline class="line" {at}><title>{escape(s.label)}</title></polyline>')
        last_x, last_y = s.points[-1]
        body.append(
            f"<circle {_attrs(cx=f'{frame.x(last_x):.1f}', cy=f'{frame.y(last_y):.1f}', r=3.5, fill=s.colour)}/>"
        )
    desc = (
        "; ".join(
            f"{s.label}: from {fmt(s.points[0][1])} to {fmt(s.points[-1][1])} over {fmt(s.points[-1][0])} {x_label}"
            for s in series
            if s.points
        )
        or "no data"
    )
    return _svg(width=width, height=height, title=title, desc=desc, body=body, css_class="chart chart-line")


def bar_chart(bars: Sequence[Bar], *, title: str, unit: str, width: int = 320, height: int = 240) -> str:
    """Vertical bars with their values printed on top."""
    frame = _Frame(
        width=width, height=height, x_max=1, y_max=max((b.value for b in bars), default=1), left=48, bottom=28
    )
    body = frame.y_axis(unit)
    base = height - frame.bottom
    body.append(f'<line class="axis" {_attrs(x1=frame.left, x2=width - frame.right, y1=base, y2=base)}/>')
    slot = (width - frame.left - frame.right) / max(len(bars), 1)
    bar_width = min(56.0, slot * 0.6)
    for i, bar in enumerate(bars):
        centre = frame.left + slot * (i + 0.5)
        top = frame.y(bar.value)
        at = _attrs(
            x=f"{centre - bar_width / 2:.1f}",
            y=f"{top:.1f}",
            width=f"{bar_width:.1f}",
            height=f"{base - top:.1f}",
            fill=bar.colour,
            rx=3,
        )
        body.append(f"<rect {at}><title>{escape(bar.label)}: {fmt(bar.value)} {escape(unit)}</title></rect>")
        at = _attrs(x=f"{centre:.1f}", y=f"{top - 5:.1f}", text_anchor="middle")
        body.append(f'<text class="value" {at}>{fmt(bar.value)}</text>')
        at = _attrs(x=f"{centre:.1f}", y=base + 16, text_anchor="middle")
        body.append(f'<text class="tick" {at}>{escape(bar.label)}</text>')
    desc = "; ".join(f"{b.label}: {fmt(b.value)} {unit}" for b in bars) or "no data"
    return _svg(width=width, height=height, title=title, desc=desc, body=body, css_class="chart chart-bar")
