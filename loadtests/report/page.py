"""The report page: render_report assembles the HTML, write_report stores it."""

from __future__ import annotations

import os
import shutil
from datetime import datetime, timezone
from pathlib import Path

from django.template import Context, Engine
from django.utils.safestring import mark_safe

from .base import (
    CONTROLS,
    MISSING,
    STYLE,
    count,
    figure,
    ms,
    plural,
    ratio,
    status_count,
    validate,
    with_floor_ratios,
)
from .batching import batching_section, hot_row_section
from .charts import (
    breakdown_figure,
    floor_chart,
    floor_share,
    histogram_figure,
    rate_figure,
    split_figure,
    timeline_figure,
)
from .machine import MACHINE_LABELS
from .sentences import GUARD_STATE, durability, kill_stalls, phases
from .servers import servers_section
from .views import View, cell, views


def machine_rows(machine: dict) -> list[tuple[str, str]]:
    labels = {**MACHINE_LABELS, "measured": "Measured", "cpus": "CPU cores", "platform": "OS"}
    labels["steadiness"] = "Steadiness (flashsale --steadiness)"
    labels["wake_up"] = "Wake-up (loadtests/wakeup.py)"
    rows = []
    for key, value in machine.items():
        if key == "memory_bytes" and figure(machine, key) is not None:
            value = f"{value / 2**30:.1f} GiB"
        elif key == "steadiness" and isinstance(value, dict) and value.get("seconds"):
            seconds = [float(s) for s in value["seconds"]]
            value = (
                f"one fixed CPU job took {min(seconds):.2f}-{max(seconds):.2f} s over {len(seconds)} runs in a row "
                f"({max(seconds) / min(seconds):.2f}x): the machine's own noise"
            )
        elif (
            key == "wake_up" and isinstance(value, dict) and (round_trip := figure(value, "round_trip_us")) is not None
        ):
            value = (
                f"one round trip through a pipe between two processes {round_trip:.1f} µs: "
                "every round trip of a row or a floor pays it"
            )
        elif isinstance(value, dict):
            value = ", ".join(f"{k} {v if v != '' else '(empty)'}" for k, v in value.items())
        rows.append((labels.get(key, key), str(value)))
    return rows


def when(value: object) -> str | None:
    """An ISO 8601 time as "2026-11-30 02:40:11 UTC" (or as given when it does not parse)."""
    if not isinstance(value, str) or not value:
        return None
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        return value
    if moment.tzinfo is not None:
        moment = moment.astimezone(timezone.utc)
        return moment.strftime("%Y-%m-%d %H:%M:%S UTC")
    return moment.strftime("%Y-%m-%d %H:%M:%S")


_ENGINE = Engine(dirs=[Path(__file__).resolve().parent / "templates"])


def render_report(data: dict, *, command: str | None = None) -> str:
    """The report for burst document ``data`` as one HTML page (Django templates under
    ``templates/report/``, autoescaped: every string from the JSON is inert).

    ``command`` is shown as the exact command when given, else ``data["command"]``.
    Raises :class:`ReportError` for a document :func:`validate` refuses.
    """
    shown = views(with_floor_ratios(validate(data)))
    machine = data.get("machine") if isinstance(data.get("machine"), dict) else {}
    command = command if command is not None else data.get("command")
    started = when(data.get("started_at"))
    ran = {v.name for v in shown}
    context = {
        "title": "Flash-sale burst report" + (f", {started}" if started else ""),
        "style": mark_safe(STYLE),  # the project's own stylesheet, inlined
        "lede": _lede(shown, started, incomplete=data.get("incomplete")),
        "strategies": [_strategy(v, machine) for v in shown],
        "comparison": _comparison(shown),
        "hot_row": mark_safe(hot_row_section(data.get("hot_row"), shown)),  # escaped as it is built
        "batching": mark_safe(batching_section(shown)),  # built with every figure and label escaped
        "servers": mark_safe(servers_section(shown)),  # the same
        "command": command if isinstance(command, str) else "",
        "machine_rows": machine_rows(machine),
        "durability": [
            {"name": name, "where": where, "said": durability(name, machine), "ran": name in ran}
            for name, where in GUARD_STATE
        ],
        "generated": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
    }
    return _ENGINE.get_template("report/page.html").render(Context(context))


def _lede(shown: list[View], started: str | None, *, incomplete: object = None) -> str:
    names = list(dict.fromkeys(v.name for v in shown))
    broken = sum(v.run.get("invariants_ok") is False for v in shown)
    verdict = f" {plural(broken, 'run', 'runs')} broke an invariant." if broken else ""
    begun = f"Started {started}. " if started else ""
    # A command that stopped on a row's failure (or an interruption) keeps the rows that ran before it.
    stopped = f" The command stopped before its other rows: {incomplete}" if isinstance(incomplete, str) else ""
    return f"{begun}{plural(len(shown), 'run', 'runs')}: {', '.join(names) or 'none'}.{verdict}{stopped}"


def _verdict(run: dict) -> tuple[str, str]:
    ok = run.get("invariants_ok")
    if ok is True:
        return "ok", "invariants hold"
    if ok is False:
        return ("control", "broke, as a control should") if run["row"] in CONTROLS else ("bad", "broke")
    return "unknown", "not audited"


def _num(value: float | None, formatter=count, *, bad: bool = False) -> dict:
    return {"text": cell(value, formatter), "bad": bool(bad and value)}


#: Columns of the side-by-side table shown only when some run has the figure: (heading, key, format).
SOMETIMES = [("hold p50 ms", "hold_p50", ms), ("hold p99 ms", "hold_p99", ms), ("× hot row", "hot_row_ratio", ratio)]


def _comparison(shown: list[View]) -> dict:
    runs = [v.run for v in shown]
    extra = [column for column in SOMETIMES if any(figure(run, column[1]) is not None for run in runs)]
    statuses = sorted({s for run in runs if isinstance(run.get("status_counts"), dict) for s in run["status_counts"]})
    head = [
        "strategy",
        "scenario",
        "pods",
        "requests",
        "req/s",
        "× floor",
        *statuses,
        "oversold",
        "undersold",
        "lost",
        "conflicts",
        "retries",
        "constraint hits",
        "peak DB conn.",
        "p50 ms",
        "p99 ms",
        *[heading for heading, _, _ in extra],
        "verdict",
    ]
    rows = []
    for v in shown:
        run = v.run
        scenario = " · ".join(str(run[k]) for k in ("scenario", "fault") if isinstance(run.get(k), str) and run[k])
        cells = [
            _num(figure(run, "pods")),
            _num(figure(run, "requests")),
            _num(figure(run, "rps")),
            _num(1.0 if v.name == "floor" else figure(run, "floor_ratio"), ratio),
            *[_num(status_count(run, s)) for s in statuses],
            *[_num(figure(run, k), bad=True) for k in ("oversold", "undersold", "lost")],
            _num(figure(run, "conflicts")),
            _num(figure(run, "retries")),
            _num(figure(run, "constraint_hits"), bad=True),
            _num(figure(run, "peak_db_connections")),
            _num(figure(run, "p50_ms"), ms),
            _num(figure(run, "p99_ms"), ms),
            *[_num(figure(run, key), formatter) for _, key, formatter in extra],
        ]
        rows.append({"view": v, "scenario": scenario or MISSING, "cells": cells, "verdict": _verdict(run)})
    return {"head": head, "rows": rows, "chart": floor_chart(shown)}


def _strategy(v: View, machine: dict) -> dict:
    run = v.run
    pods, requests = figure(run, "pods"), figure(run, "requests")
    balancer, workers = run.get("balancer"), figure(run, "locust_workers")
    facts = [
        str(run.get("scenario") or ""),
        plural(pods, "pod", "pods") if pods else "",
        f"through {balancer}" if isinstance(balancer, str) and balancer != "none" else "",
        "ASGI (uvicorn workers)" if run.get("server") == "asgi" else "",
        f"Locust master + {plural(workers, 'worker', 'workers')}" if workers else "",
        plural(requests, "request", "requests") if requests is not None else "",
        f"fault: {run['fault']}" if isinstance(run.get("fault"), str) else "",
    ]
    figures = [timeline_figure(v), rate_figure(v), histogram_figure(v), split_figure(v), breakdown_figure(v)]
    return {
        "view": v,
        "verdict": _verdict(run),
        "facts": " · ".join(f for f in facts if f),
        "durability": durability(v.name, machine),
        "problems": [str(p) for p in run["problems"]] if isinstance(run.get("problems"), list) else [],
        "share": floor_share(v),
        "figures": [f for f in figures if f],
        "phases": _phase_table(run),
        "locust_report": run["locust_report"] if isinstance(run.get("locust_report"), str) else None,
    }


def _phase_table(run: dict) -> dict | None:
    found = phases(run)
    if not found:
        return None
    statuses = sorted({s for p in found if isinstance(p.get("status_counts"), dict) for s in p["status_counts"]})
    answers = any(figure(p, "busy_answers") is not None for p in found)
    rows = []
    for p in found:
        counts = p.get("status_counts") if isinstance(p.get("status_counts"), dict) else {}
        cells = [
            f"{p['start_s']:.1f}–{p['end_s']:.1f}",
            *[cell(figure(counts, s) if s in counts else 0) for s in statuses],
            cell(figure(p, "p99_ms"), ms),
            *([cell(figure(p, "busy_answers"))] if answers else []),
        ]
        rows.append({"name": p["name"], "cells": cells})
    extra = []
    if figure(run, "max_lock_wait_ms") is not None:
        extra.append(f"longest lock wait {ms(figure(run, 'max_lock_wait_ms'))} ms")
    if figure(run, "resumed_after_s") is not None:
        extra.append(f"served again {figure(run, 'resumed_after_s'):.1f} s after the fault")
    return {
        "fault": run.get("fault") or "the fault",
        "head": ["phase", "seconds", *statuses, "p99 ms", *(["503 answers received"] if answers else [])],
        "rows": rows,
        "note": f"{'; '.join(extra).capitalize()}." if extra else "",
        "kills": kill_stalls(run),
    }


def write_report(data: dict, path: str | os.PathLike, *, command: str | None = None) -> Path:
    """Render ``data`` and write it to ``path`` (parent folders created; written to a temporary file
    then renamed, so a reader never sees half a report). Returns the absolute path."""
    target = Path(path).resolve()
    if target.exists() and not target.is_file():
        raise OSError(f"{target} is not a regular file: a report is renamed over its target")
    html = render_report(data, command=command)
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(f".{target.name}.partial")
    partial.write_text(html, encoding="utf-8")
    partial.replace(target)
    return target


def place_locust_reports(runs: list[dict], beside: str | os.PathLike) -> None:
    """Copy each run's Locust report (HTML and CSV files) into ``locust/`` next to ``beside`` and
    point ``locust_report`` at the copy, relative to it; a missing report becomes None."""
    folder = Path(beside).resolve().parent / "locust"
    for run in runs:
        source = Path(run.get("locust_report") or "")
        if not source.name or not source.is_file():
            run["locust_report"] = None
            continue
        folder.mkdir(parents=True, exist_ok=True)
        stem = source.name.removesuffix(".html")
        for part in source.parent.glob(f"{stem}*"):
            shutil.copyfile(part, folder / part.name)
        run["locust_report"] = f"locust/{source.name}"
