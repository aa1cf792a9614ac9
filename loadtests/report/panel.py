"""The bursts' part of the admin dashboard: charts of the newest run of each backend, from the
stored ``BurstRun`` rows (:func:`burst_charts`), registered with the dashboard in ``loadtests.apps``."""

from __future__ import annotations

from django.utils.safestring import mark_safe

from inventory.models import BurstRun

from .svg import Series, colour_for, fmt, hbar_chart, line_chart


def latest_run_per_backend(runs: list[BurstRun]) -> list[BurstRun]:
    latest: dict[str, BurstRun] = {}
    for run in runs:  # newest first
        latest.setdefault(run.backend, run)
    return sorted(latest.values(), key=lambda r: r.backend)


def per_backend(latest: list[BurstRun], field: str, *, title: str, unit: str) -> str:
    """One horizontal bar per backend: ``field`` of its newest run."""
    return hbar_chart(
        [(run.backend, [("", getattr(run, field))]) for run in latest],
        colours=[colour_for(run.backend, i) for i, run in enumerate(latest)],
        unit=unit,
        title=title,
        desc="; ".join(f"{run.backend}: {fmt(getattr(run, field))} {unit}" for run in latest),
    )


def burst_charts(runs: list[BurstRun]) -> dict:
    """The dashboard's SVG charts from the newest run of each backend."""
    latest = latest_run_per_backend(runs)
    if not latest:
        return {}
    series = [
        Series(
            f"{run.backend} ({run.started_at:%b %d %H:%M})",
            [(float(point[0]), float(point[1])) for point in run.timeline if len(point) >= 2],
            colour_for(run.backend, i),
        )
        for i, run in enumerate(latest)
    ]
    return {
        "stock": mark_safe(
            line_chart(series, title="Stock left during the latest burst of each backend", y_label="units left")
        ),
        "throughput": mark_safe(
            per_backend(latest, "rps", title="Throughput per backend (latest burst)", unit="requests/s")
        ),
        "p99": mark_safe(
            per_backend(latest, "p99_ms", title="99th percentile latency per backend (latest burst)", unit="ms")
        ),
        "legend": [(s.label, s.colour) for s in series],
    }
