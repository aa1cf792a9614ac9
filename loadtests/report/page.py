"""The report page: render_report assembles the HTML, write_report and read_summary store and recover it."""

from __future__ import annotations

import json
import os
from datetime import datetime, timezone
from pathlib import Path

from .base import (
    CONTROLS,
    MISSING,
    STYLE,
    SUMMARY,
    count,
    figure,
    ms,
    plural,
    ratio,
    status_count,
    validate,
    with_floor_ratios,
)
from .batching import batching_section
from .charts import floor_chart, floor_share, histogram_figure, rate_figure, split_figure, timeline_figure
from .machine import MACHINE_LABELS
from .sentences import GUARD_STATE, durability, phases
from .views import View, cell, esc, views


def machine_rows(machine: dict) -> list[tuple[str, str]]:
    labels = {**MACHINE_LABELS, "measured": "Measured", "cpus": "CPU cores", "platform": "OS"}
    rows = []
    for key, value in machine.items():
        if key == "memory_bytes" and figure(machine, key) is not None:
            value = f"{value / 2**30:.1f} GiB"
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


def render_report(data: dict, *, command: str | None = None) -> str:
    """The report for burst document ``data`` as one HTML page.

    ``command`` is shown as the exact command when given, else ``data["command"]``.
    Raises :class:`ReportError` for a document :func:`validate` refuses.
    """
    shown = views(with_floor_ratios(validate(data)))
    machine = data.get("machine") if isinstance(data.get("machine"), dict) else {}
    command = command if command is not None else data.get("command")
    started = when(data.get("started_at"))
    summary = {
        "started_at": data.get("started_at") if isinstance(data.get("started_at"), str) else None,
        "command": command if isinstance(command, str) else None,
        "sentences": [{"backend": v.name, "sentence": v.sentence, "ok": v.run.get("invariants_ok")} for v in shown],
    }
    title = "Flash-sale burst report" + (f", {started}" if started else "")
    parts = [
        "<!doctype html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>{esc(title)}</title><style>{STYLE}</style></head>",
        "<body><main>",
        "<header><h1>Flash-sale burst report</h1>",
        f'<p class="lede">{esc(_lede(shown, started))}</p></header>',
        '<section aria-labelledby="showed"><h2 id="showed">What each strategy showed</h2><ul class="sentences">',
    ]
    for v in shown:
        verdict = _verdict(v.run)
        parts.append(
            f'<li class="sentence" data-backend="{esc(v.name)}"><span class="swatch" '
            f'style="background:{esc(v.colour)}" aria-hidden="true"></span>'
            f'<a href="#{v.anchor}">{esc(v.sentence)}</a> '
            f'<span class="verdict verdict-{verdict[0]}">{esc(verdict[1])}</span></li>'
        )
    parts.append("</ul></section>")
    parts.append(_comparison(shown))
    parts.append(batching_section(shown))
    parts.append(_machine_section(machine, command))
    parts.append('<section aria-labelledby="per-strategy"><h2 id="per-strategy">Per strategy</h2>')
    parts += [_strategy(v, machine) for v in shown]
    parts.append("</section>")
    parts.append(_durability_table(shown, machine))
    generated = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    parts.append(
        f"<footer><p>Written {esc(generated)} from the burst JSON. The page loads nothing: its styles and charts "
        "are inline.</p></footer></main>"
    )
    parts.append(f'<script type="application/json" id="report-summary">{_json_for_html(summary)}</script>')
    parts.append("</body></html>\n")
    return "\n".join(parts)


def _lede(shown: list[View], started: str | None) -> str:
    names = list(dict.fromkeys(v.name for v in shown))
    broken = sum(v.run.get("invariants_ok") is False for v in shown)
    verdict = f" {plural(broken, 'run', 'runs')} broke an invariant." if broken else ""
    begun = f"Started {started}. " if started else ""
    return f"{begun}{plural(len(shown), 'run', 'runs')}: {', '.join(names) or 'none'}.{verdict}"


def _verdict(run: dict) -> tuple[str, str]:
    ok = run.get("invariants_ok")
    if ok is True:
        return "ok", "invariants hold"
    if ok is False:
        return ("control", "broke, as a control should") if run["backend"] in CONTROLS else ("bad", "broke")
    return "unknown", "not audited"


def _json_for_html(value: object) -> str:
    """JSON that cannot end its ``<script>`` element early."""
    return json.dumps(value).replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def _num_cell(value: float | None, formatter=count, *, bad: bool = False) -> str:
    return f'<td class="num{" bad" if bad and value else ""}">{cell(value, formatter)}</td>'


def _comparison(shown: list[View]) -> str:
    runs = [v.run for v in shown]
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
        "verdict",
    ]
    rows = []
    for v in shown:
        run = v.run
        scenario = " · ".join(str(run[k]) for k in ("scenario", "fault") if isinstance(run.get(k), str) and run[k])
        cells = [
            f"<td>{esc(scenario or MISSING)}</td>",
            _num_cell(figure(run, "pods")),
            _num_cell(figure(run, "requests")),
            _num_cell(figure(run, "rps")),
            _num_cell(1.0 if v.name == "floor" else figure(run, "floor_ratio"), ratio),
            *[_num_cell(status_count(run, s)) for s in statuses],
            *[_num_cell(figure(run, k), bad=True) for k in ("oversold", "undersold", "lost")],
            _num_cell(figure(run, "conflicts")),
            _num_cell(figure(run, "retries")),
            _num_cell(figure(run, "constraint_hits"), bad=True),
            _num_cell(figure(run, "peak_db_connections")),
            _num_cell(figure(run, "p50_ms"), ms),
            _num_cell(figure(run, "p99_ms"), ms),
        ]
        verdict = _verdict(run)
        rows.append(
            f'<tr><th scope="row"><a href="#{v.anchor}">{esc(v.label)}</a></th>{"".join(cells)}'
            f'<td><span class="verdict verdict-{verdict[0]}">{esc(verdict[1])}</span></td></tr>'
        )
    header = "".join(f'<th scope="col">{esc(h)}</th>' for h in head)
    return (
        '<section aria-labelledby="side-by-side"><h2 id="side-by-side">Side by side</h2>'
        '<div class="table-scroll" tabindex="0" role="region" aria-label="All runs, side by side">'
        '<table class="runs"><caption>Every run of this burst; "–" means the JSON has no such figure.</caption>'
        f"<thead><tr>{header}</tr></thead><tbody>{''.join(rows)}</tbody></table></div>"
        f"{floor_chart(shown)}</section>"
    )


def _machine_section(machine: dict, command: object) -> str:
    rows = "".join(f"<dt>{esc(k)}</dt><dd>{esc(v)}</dd>" for k, v in machine_rows(machine))
    said = (
        f"<pre><code>{esc(command)}</code></pre>"
        if isinstance(command, str) and command
        else "<p>The JSON does not record the command.</p>"
    )
    described = f'<dl class="machine">{rows}</dl>' if rows else "<p>The JSON does not describe the machine.</p>"
    return f'<section aria-labelledby="machine"><h2 id="machine">Command and machine</h2>{said}{described}</section>'


def _strategy(v: View, machine: dict) -> str:
    run = v.run
    pods, requests = figure(run, "pods"), figure(run, "requests")
    facts = [
        str(run.get("scenario") or ""),
        plural(pods, "pod", "pods") if pods else "",
        plural(requests, "request", "requests") if requests is not None else "",
        f"fault: {run['fault']}" if isinstance(run.get("fault"), str) else "",
    ]
    figures = [timeline_figure(v), rate_figure(v), histogram_figure(v), split_figure(v)]
    problems = run.get("problems") if isinstance(run.get("problems"), list) else []
    problem_list = "".join(f"<li>{esc(p)}</li>" for p in problems)
    return (
        f'<article class="strategy" id="{v.anchor}" data-backend="{esc(v.name)}" style="--accent:{esc(v.colour)}">'
        f"<h3>{esc(v.label)} <small>{esc(' · '.join(f for f in facts if f))}</small></h3>"
        f'<p class="sentence">{esc(v.sentence)}</p>'
        f'<p class="durability"><strong>Lock state:</strong> {esc(durability(v.name, machine))}</p>'
        f"{f'<ul class=problems>{problem_list}</ul>' if problem_list else ''}"
        f"{floor_share(v)}"
        f'<div class="charts">{"".join(figures)}</div>{_phase_table(run)}</article>'
    )


def _phase_table(run: dict) -> str:
    found = phases(run)
    if not found:
        return ""
    statuses = sorted({s for p in found if isinstance(p.get("status_counts"), dict) for s in p["status_counts"]})
    answers = any(figure(p, "busy_answers") is not None for p in found)
    head = "".join(
        f'<th scope="col">{esc(h)}</th>'
        for h in ["phase", "seconds", *statuses, "p99 ms", *(["503 answers received"] if answers else [])]
    )
    rows = []
    for p in found:
        counts = p.get("status_counts") if isinstance(p.get("status_counts"), dict) else {}
        cells = [
            f"{p['start_s']:.1f}–{p['end_s']:.1f}",
            *[cell(figure(counts, s) if s in counts else 0) for s in statuses],
            cell(figure(p, "p99_ms"), ms),
            *([cell(figure(p, "busy_answers"))] if answers else []),
        ]
        rows.append(
            f'<tr><th scope="row">{esc(p["name"])}</th>' + "".join(f'<td class="num">{c}</td>' for c in cells) + "</tr>"
        )
    extra = []
    if figure(run, "max_lock_wait_ms") is not None:
        extra.append(f"longest lock wait {ms(figure(run, 'max_lock_wait_ms'))} ms")
    if figure(run, "resumed_after_s") is not None:
        extra.append(f"served again {figure(run, 'resumed_after_s'):.1f} s after the fault")
    note = f"<p>{esc('; '.join(extra).capitalize())}.</p>" if extra else ""
    return (
        f'<div class="table-scroll"><table class="phases"><caption>Before, during and after '
        f"{esc(run.get('fault') or 'the fault')}</caption><thead><tr>{head}</tr></thead>"
        f"<tbody>{''.join(rows)}</tbody></table></div>{note}"
    )


def _durability_table(shown: list[View], machine: dict) -> str:
    ran = {v.name for v in shown}
    rows = "".join(
        f'<tr{" class=ran" if name in ran else ""}><th scope="row">{esc(name)}'
        f"{' <span class=ran-mark>in this burst</span>' if name in ran else ''}</th>"
        f'<td data-label="lives in">{esc(where)}</td><td data-label="across a restart">'
        f"{esc(durability(name, machine))}</td></tr>"
        for name, where in GUARD_STATE
    )
    return (
        '<section aria-labelledby="durability"><h2 id="durability">How durable each lock state is</h2>'
        '<div class="table-scroll"><table class="facts"><caption>Every strategy the project has, whether or not it '
        'ran in this burst.</caption><thead><tr><th scope="col">strategy</th><th scope="col">guard state lives in'
        f'</th><th scope="col">across a crash or restart</th></tr></thead><tbody>{rows}</tbody></table></div>'
        "</section>"
    )


def write_report(data: dict, path: str | os.PathLike, *, command: str | None = None) -> Path:
    """Render ``data`` and write it to ``path`` (parent folders created; written to a temporary file
    then renamed, so a reader never sees half a report). Returns the absolute path."""
    target = Path(path).resolve()
    html = render_report(data, command=command)
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(f".{target.name}.partial")
    partial.write_text(html, encoding="utf-8")
    partial.replace(target)
    return target


def read_summary(path: str | os.PathLike) -> dict | None:
    """The sentences a written report carries (``{"started_at", "command", "sentences": [{"backend",
    "sentence", "ok"}]}``), or None when there is no readable report at ``path``."""
    try:
        found = SUMMARY.search(Path(path).read_text(encoding="utf-8"))
        return json.loads(found.group(1)) if found else None
    except (OSError, ValueError):
        return None
