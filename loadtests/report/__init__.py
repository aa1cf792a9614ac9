"""The burst report: one self-contained HTML file that says, per strategy, what a run showed.

:func:`render_report` turns the burst JSON (``manage.py flashsale --json``; schema in
``INTERFACES.md``) into a page with the side-by-side table, the machine and the command, and per
strategy its stock over time, latency histogram, throughput against the floor, server-side
split and one sentence computed from its figures. :func:`write_report` writes it.

What holds for the page:

- it loads nothing: styles are inline, charts are inline SVG, there is no script to run (one
  inert ``application/json`` block carries the sentences for the admin dashboard) and no font
  or image is fetched;
- every string taken from the JSON is HTML-escaped, in text and in attributes;
- a missing key is shown as "–" (older runs and rows that do not exist yet lack keys); only a
  document without a list of runs, a run that is not an object, or a run without a backend name
  is refused, with :class:`ReportError`.

The machine block is the JSON's ``machine``, shown as recorded. :func:`machine_info` measures this
machine (it needs Django's database connection and the shop's Redis settings) and
:func:`complete_machine` fills in what a recorded block lacks; ``manage.py report`` does that
before rendering. :func:`read_summary` gives back the sentences of a written report.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import platform
import re
import subprocess
from datetime import datetime, timezone
from html import escape
from pathlib import Path

from inventory.charts import colour_for

from . import svg

#: Where ``make demo`` and ``manage.py report`` write the report; the admin dashboard links it.
LATEST_REPORT = Path(__file__).resolve().parents[2] / "artifacts" / "report.html"
DEFAULT_JSON = LATEST_REPORT.with_name("burst.json")
STYLE = (Path(__file__).resolve().parent / "report.css").read_text()

#: Strategies that exist to fail: overselling is what they are meant to show.
CONTROLS = {"local", "unsafe"}
MISSING = "–"
_SUMMARY = re.compile(r'<script type="application/json" id="report-summary">(.*?)</script>', re.S)


class ReportError(ValueError):
    """The burst JSON cannot be rendered; the message says what is wrong with it."""


# Reading figures: every key may be missing, and a present key may hold something unexpected.


def number(value: object) -> float | None:
    """``value`` if it is a finite number (not a bool), else None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return value


def figure(run: dict, key: str) -> float | None:
    """``run[key]`` if it is a finite number, else None."""
    return number(run.get(key))


def status_count(run: dict, status: str) -> int | None:
    counts = run.get("status_counts")
    if not isinstance(counts, dict):
        return None
    value = counts.get(status, 0)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def timing(run: dict, part: str, quantile: str) -> float | None:
    split = run.get("server_timing")
    if not isinstance(split, dict) or not isinstance(split.get(part), dict):
        return None
    return figure(split[part], quantile)


def count(value: float) -> str:
    """1912 → "1,912"."""
    return f"{value:,.0f}"


def ms(value: float) -> str:
    return f"{value:.1f}" if value < 10 else f"{value:,.0f}"


def ratio(value: float) -> str:
    return f"{value:.2f}×"


def plural(n: float, one: str, many: str) -> str:
    return f"{count(n)} {one if n == 1 else many}"


def validate(data: object) -> list[dict]:
    """The runs of a burst document; :class:`ReportError` saying what is wrong otherwise."""
    if not isinstance(data, dict):
        raise ReportError(f'the top level must be a JSON object with a "runs" list, not {type(data).__name__}')
    runs = data.get("runs")
    if not isinstance(runs, list):
        raise ReportError('there is no "runs" list at the top level')
    for i, run in enumerate(runs):
        if not isinstance(run, dict):
            raise ReportError(f"runs[{i}] must be an object, not {type(run).__name__}")
        if not isinstance(run.get("backend"), str) or not run["backend"].strip():
            raise ReportError(f'runs[{i}] has no "backend" name')
    return runs


def with_floor_ratios(runs: list[dict]) -> list[dict]:
    """The runs, each with ``floor_ratio`` filled from the first floor row when the JSON lacks it."""
    floor_rps = next((figure(r, "rps") for r in runs if r["backend"] == "floor" and figure(r, "rps")), None)
    filled = []
    for run in runs:
        if run["backend"] != "floor" and figure(run, "floor_ratio") is None and floor_rps and figure(run, "rps"):
            run = {**run, "floor_ratio": figure(run, "rps") / floor_rps}
        filled.append(run)
    return filled


# The sentence: what this run showed, from its own figures only.


def sentence(run: dict) -> str:
    """One plain sentence saying what ``run`` showed: first whether the stock came out right, then
    what it cost (connections, conflicts, busy answers, lock waits, throughput against the floor),
    then what a fault did. Figures the run lacks are left out, never guessed."""
    name = str(run.get("backend"))
    rps = figure(run, "rps")
    if name == "floor":
        said = f"{count(rps)} requests/s" if rps is not None else "no throughput figure"
        return f"floor: {said} with no storage touched; every ratio in this report is against it."
    outcome = _outcome(run, name)
    costs = _costs(run, name)
    text = (
        f"{name}: {'; '.join(filter(None, [', '.join(outcome), ', '.join(costs)]))}"
        if outcome or costs
        else f"{name}: this run carries no figures"
    )
    fault = _fault(run)
    return f"{text}{'; ' + fault if fault else ''}."


def _outcome(run: dict, name: str) -> list[str]:
    parts = []
    oversold, lost, undersold = figure(run, "oversold"), figure(run, "lost"), figure(run, "undersold")
    hits, errors = figure(run, "constraint_hits"), figure(run, "errors_5xx")
    orders, initial, final = figure(run, "orders"), figure(run, "stock_initial"), figure(run, "stock_final")
    if oversold:
        detail = f" ({count(orders)} orders for {count(initial)} units)" if orders is not None and initial else ""
        parts.append(f"oversold {plural(oversold, 'unit', 'units')}{detail}")
    if lost:
        parts.append(f"lost {plural(lost, 'unit', 'units')} (stock fell by more than was ordered)")
    if undersold:
        parts.append(f"left {plural(undersold, 'unit', 'units')} unsold while shoppers were told sold out")
    if hits:
        parts.append(f"{plural(hits, 'write', 'writes')} stopped only by a database constraint")
    if errors:
        parts.append(plural(errors, "server error", "server errors"))
    if parts:
        return parts
    if name in CONTROLS and oversold == 0:
        return ["did not oversell this time (the race it exists to show was not hit)"]
    if initial is not None and final is not None:
        sold = initial - final
        return [f"sold {count(sold)} of {count(initial)} units{', none oversold' if oversold == 0 else ''}"]
    return []


def _costs(run: dict, name: str) -> list[str]:
    parts = []
    peak = figure(run, "peak_db_connections")
    if name == "db" and peak is not None:
        parts.append(f"{plural(peak, 'database connection', 'database connections')} at peak")
    conflicts, retries, busy = figure(run, "conflicts"), figure(run, "retries"), status_count(run, "503")
    if conflicts:
        parts.append(plural(conflicts, "conflict", "conflicts"))
    if retries:
        parts.append(plural(retries, "retry", "retries"))
    if busy:
        parts.append(f"{plural(busy, 'shopper', 'shoppers')} told busy")
    wait = timing(run, "lock_wait_ms", "p99")
    if wait:
        parts.append(f"p99 lock wait {ms(wait)} ms")
    floor_ratio, rps = figure(run, "floor_ratio"), figure(run, "rps")
    if floor_ratio is not None:
        parts.append(f"{ratio(floor_ratio)} floor")
    elif rps is not None:
        parts.append(f"{count(rps)} requests/s")
    return parts


def _fault(run: dict) -> str:
    during = next((p for p in phases(run) if p["name"] == "during"), None)
    if during is None:
        return ""
    fault = str(run.get("fault") or "the fault")
    counts = during.get("status_counts") if isinstance(during.get("status_counts"), dict) else {}
    busy = counts.get("503", 0) if isinstance(counts.get("503", 0), int) else 0
    said = [f"{plural(busy, 'shopper', 'shoppers')} told busy"]
    answers = during.get("busy_answers")
    if isinstance(answers, int) and not isinstance(answers, bool) and answers > busy:
        # Shoppers resend a 503 + Retry-After: the final status hides the busy answers they got.
        said.append(f"{plural(answers, 'busy answer', 'busy answers')} in all, resent")
    if figure(during, "p99_ms") is not None:
        said.append(f"p99 {ms(figure(during, 'p99_ms'))} ms")
    resumed = figure(run, "resumed_after_s")
    tail = f", served again {resumed:.1f} s after it" if resumed is not None else ""
    return f"during {fault}: {', '.join(said)}{tail}"


def sentences(data: dict) -> list[str]:
    """One :func:`sentence` per run of a burst document, in its order."""
    return [sentence(run) for run in with_floor_ratios(validate(data))]


def phases(run: dict) -> list[dict]:
    """The run's fault phases that have a name and numeric, ordered bounds."""
    found = run.get("phases")
    if not isinstance(found, list):
        return []
    return [
        p
        for p in found
        if isinstance(p, dict)
        and isinstance(p.get("name"), str)
        and figure(p, "start_s") is not None
        and figure(p, "end_s") is not None
        and p["end_s"] >= p["start_s"]
    ]


# How durable each strategy's lock state is.


def redis_persistence(machine: dict) -> str:
    """What the machine's Redis keeps across a restart, from ``machine["redis_persistence"]``."""
    config = machine.get("redis_persistence")
    if not isinstance(config, dict):
        return "its persistence was not recorded"
    save, appendonly = config.get("save"), config.get("appendonly")
    if appendonly == "yes":
        return f"append-only file on, appendfsync {config.get('appendfsync', 'everysec')}"
    if save == "" and appendonly == "no":
        return "this machine's Redis keeps nothing across a restart (no snapshots, no append-only file)"
    if save:
        return f"snapshots only (save {save}): keys written since the last snapshot are lost on a crash"
    return "its persistence was not recorded"


def durability(name: str, machine: dict) -> str:
    """How durable the lock (or guard) state of strategy ``name`` is, as one or two sentences."""
    redis = redis_persistence(machine)
    facts = {
        "floor": "No lock and no storage: nothing to keep.",
        "db": "The row lock lives in PostgreSQL for one transaction; stock and orders go to its write-ahead "
        "log, flushed at commit. A crash aborts the holder's transaction and frees the lock; nothing "
        "committed is lost.",
        "optimistic": "No lock: the version column in PostgreSQL (write-ahead log, flushed at commit) is the "
        "whole guard.",
        "redis": f"The lock key lives in one Redis; {redis}. A restart or a failover to a replica that never "
        "saw the key frees the lock early; the fence in PostgreSQL still refuses the stale holder's write.",
        "redlock": 'Five private redis-server nodes run with --save "" --appendonly no: a restarted node comes '
        "back empty, so restarting a majority within one TTL lets a second holder in; the fence in "
        "PostgreSQL refuses the late write.",
        "etcd": "The lock key is a Raft write, fsynced to the write-ahead log on disk of a majority of the "
        "three members before it is acknowledged: it survives restarts. Its lease can still expire "
        "while a holder is paused; the fence (its create revision) refuses the late write.",
        "atomic": "No lock: one conditional UPDATE in PostgreSQL (write-ahead log, flushed at commit).",
        "redis-stock": f"The stock counter lives in Redis; {redis}. Orders are written to PostgreSQL after the "
        "decrement, so a Redis restart leaves the two apart until `reconcile` rebuilds the "
        "counter from the database.",
        "local": "A threading.Lock in each gunicorn worker's memory: gone with the process and never shared "
        "between processes or pods.",
        "unsafe": "No lock at all.",
    }
    return facts.get(name, "Not recorded for this strategy.")


#: (strategy, where its guard state lives) for the fact table, in the order the design lists them.
GUARD_STATE = [
    ("floor", "nowhere"),
    ("db", "PostgreSQL row lock (one transaction)"),
    ("optimistic", "PostgreSQL version column"),
    ("redis", "one Redis key"),
    ("redlock", "five private Redis nodes"),
    ("etcd", "three etcd members (Raft)"),
    ("atomic", "PostgreSQL conditional UPDATE"),
    ("redis-stock", "a Redis counter, orders in PostgreSQL"),
    ("local", "process memory"),
    ("unsafe", "nowhere"),
]


# The machine.


def machine_info() -> dict:
    """Cores, memory and the versions of what the burst ran on, measured now.

    PostgreSQL answers ``SELECT version()`` on Django's default connection, Redis ``INFO server``
    and ``CONFIG GET`` on the shop's ``REDIS_URL``, etcd ``etcd --version``. A part that cannot be
    asked says why instead of a version; this function does not raise for an unreachable service.
    """
    import django
    import redis
    from django.conf import settings
    from django.db import DatabaseError, connection

    info: dict = {
        "cores": os.cpu_count(),
        "memory_bytes": _memory_bytes(),
        "os": platform.platform(terse=True),
        "python": platform.python_version(),
        "django": django.get_version(),
    }
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT version()")
            info["postgresql"] = cursor.fetchone()[0]
    except DatabaseError as exc:
        info["postgresql"] = f"unknown ({str(exc).strip().splitlines()[0] if str(exc).strip() else 'no answer'})"
    url = settings.INVENTORY["REDIS_URL"]
    try:
        with redis.Redis.from_url(url, socket_timeout=2, socket_connect_timeout=2) as client:
            info["redis"] = client.info("server")["redis_version"]
            try:
                info["redis_persistence"] = {
                    **client.config_get("save"),
                    **client.config_get("appendonly"),
                    **client.config_get("appendfsync"),
                }
            except redis.ResponseError:  # CONFIG renamed or disabled on this server
                info["redis_persistence"] = "not readable (CONFIG is disabled)"
    except redis.RedisError as exc:
        info["redis"] = f"unknown ({exc})"
    info["etcd"] = _etcd_version()
    return info


#: What :func:`machine_info` measures (``redis_persistence`` only when Redis answers), as the page names it.
MACHINE_LABELS = {
    "cores": "CPU cores",
    "memory_bytes": "Memory",
    "os": "OS",
    "python": "Python",
    "django": "Django",
    "postgresql": "PostgreSQL",
    "redis": "Redis",
    "redis_persistence": "Redis persistence",
    "etcd": "etcd",
}
MACHINE_KEYS = tuple(MACHINE_LABELS)
#: Names the burst runner may use for what :func:`machine_info` calls otherwise.
MACHINE_ALIASES = {"cpus": "cores", "platform": "os"}


def complete_machine(recorded: object) -> dict:
    """The machine as recorded in the JSON, with what it lacks of :func:`machine_info` measured now
    (and a ``measured`` entry naming those parts); recorded values are kept as they are."""
    known = {MACHINE_ALIASES.get(k, k): v for k, v in recorded.items()} if isinstance(recorded, dict) else {}
    if all(key in known for key in MACHINE_KEYS):
        return known
    measured = machine_info()
    missing = [key for key in MACHINE_KEYS if key not in known and key in measured]
    return {
        **known,
        **{key: measured[key] for key in missing},
        "measured": f"when the report was written: {', '.join(MACHINE_LABELS[key] for key in missing)}",
    }


def _memory_bytes() -> int | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def _etcd_version() -> str:
    try:
        result = subprocess.run(["etcd", "--version"], capture_output=True, text=True, timeout=10)
    except FileNotFoundError:
        return "not installed"
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"unknown ({exc})"
    found = re.search(r"etcd Version:\s*(\S+)", result.stdout)
    return found.group(1) if found else f"unknown (etcd --version exited {result.returncode})"


# Rendering.


def esc(value: object) -> str:
    return escape(str(value), quote=True)


def cell(value: float | None, formatter=count) -> str:
    return MISSING if value is None else formatter(value)


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


class View:
    """One run as the page shows it: its figures, a label unique on the page, its sentence, colour and anchor."""

    def __init__(self, run: dict, *, index: int, label: str):
        self.run, self.name, self.label = run, run["backend"], label
        self.sentence = sentence(run)
        self.colour = colour_for(self.name, index)
        self.anchor = f"run-{index + 1}-{re.sub(r'[^a-z0-9]+', '-', self.name.lower()).strip('-')}"


def views(runs: list[dict]) -> list[View]:
    """A view per run; a backend that ran more than once is labelled by its fault or scenario too."""
    seen: dict[str, int] = {}
    for run in runs:
        seen[run["backend"]] = seen.get(run["backend"], 0) + 1
    made = []
    for i, run in enumerate(runs):
        label = run["backend"]
        if seen[label] > 1:
            detail = run.get("fault") or run.get("scenario")
            label += f" ({detail if isinstance(detail, str) and detail else f'run {i + 1}'})"
        made.append(View(run, index=i, label=label))
    return made


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
        f"{_floor_chart(shown)}</section>"
    )


def _floor_chart(shown: list[View]) -> str:
    bars = [
        (v.label, figure(v.run, "floor_ratio"), v.colour)
        for v in shown
        if v.name != "floor" and figure(v.run, "floor_ratio") is not None
    ]
    if not bars:
        return ""
    desc = "; ".join(f"{label}: {ratio(value)} the floor's throughput" for label, value, _ in bars)
    chart = svg.hbar_chart(
        [(label, [("", value)]) for label, value, _ in bars],
        colours=[c for _, _, c in bars],
        unit="× the floor's requests/s",
        title="Throughput as a share of the floor",
        desc=desc,
        reference=("floor", 1.0),
        value_format=ratio,
    )
    return f'<figure class="card overview"><figcaption>Throughput as a share of the floor</figcaption>{chart}</figure>'


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
    figures = [_timeline_figure(v), _rate_figure(v), _histogram_figure(v), _split_figure(v)]
    problems = run.get("problems") if isinstance(run.get("problems"), list) else []
    problem_list = "".join(f"<li>{esc(p)}</li>" for p in problems)
    return (
        f'<article class="strategy" id="{v.anchor}" data-backend="{esc(v.name)}" style="--accent:{esc(v.colour)}">'
        f"<h3>{esc(v.label)} <small>{esc(' · '.join(f for f in facts if f))}</small></h3>"
        f'<p class="sentence">{esc(v.sentence)}</p>'
        f'<p class="durability"><strong>Lock state:</strong> {esc(durability(v.name, machine))}</p>'
        f"{f'<ul class=problems>{problem_list}</ul>' if problem_list else ''}"
        f"{_floor_share(v)}"
        f'<div class="charts">{"".join(figures)}</div>{_phase_table(run)}</article>'
    )


def _timeline_rows(run: dict) -> list[list]:
    rows = run.get("timeline")
    if not isinstance(rows, list):
        return []
    return [r for r in rows if isinstance(r, list) and r and number(r[0]) is not None]


def _timeline_points(run: dict) -> tuple[list[tuple[float, float]], str]:
    """(seconds, stock left) from the timeline, or (seconds, purchases answered) for the floor row
    (which touches no stock) and when no stock was sampled; with the label of what is plotted."""
    rows = _timeline_rows(run)
    columns = ((1, "units left"), (3, "purchases answered"), (2, "purchases sent"))
    for column, label in columns[1:] if run.get("backend") == "floor" else columns:
        points = [(r[0], r[column]) for r in rows if len(r) > column and number(r[column]) is not None]
        if points:
            return points, label
    return [], "units left"


def _timeline_figure(v: View) -> str:
    run = v.run
    points, label = _timeline_points(run)
    found = phases(run)
    what = "Stock over time" if label == "units left" else f"{label.capitalize()} over time"
    if points:
        desc = (
            f"{label} from {count(points[0][1])} at {points[0][0]:.1f} s to {count(points[-1][1])} "
            f"at {points[-1][0]:.1f} s"
        )
        sold_out = figure(run, "sold_out_after_s")
        if sold_out is not None:
            desc += f"; sold out after {sold_out:.1f} s"
    else:
        return (
            f'<figure class="card"><figcaption>{esc(what)}</figcaption><p class="no-chart">This run has no '
            "timeline.</p></figure>"
        )
    if found:
        desc += "; phases: " + ", ".join(f"{p['name']} {p['start_s']:.1f}–{p['end_s']:.1f} s" for p in found)
    chart = svg.timeline_chart(
        points, phases=found, colour=v.colour, title=f"{v.label}: {what.lower()}", y_label=label, desc=desc
    )
    return f'<figure class="card"><figcaption>{esc(what)}</figcaption>{chart}</figure>'


def _rate_figure(v: View) -> str:
    """Purchases answered per second between samples, for fault runs (where the dip is the story)."""
    found = phases(v.run)
    rows = [r for r in _timeline_rows(v.run) if len(r) > 3 and number(r[3]) is not None]
    if not found or len(rows) < 2:
        return ""
    points = [(b[0], max(0.0, (b[3] - a[3]) / (b[0] - a[0]))) for a, b in itertools.pairwise(rows) if b[0] > a[0]]
    if not points:
        return ""
    by_phase = []
    for p in found:
        inside = [rate for t, rate in points if p["start_s"] < t <= p["end_s"]]
        if inside:
            by_phase.append(f"{p['name']}: {count(sum(inside) / len(inside))} answers/s on average")
    chart = svg.timeline_chart(
        points,
        phases=found,
        colour=v.colour,
        title=f"{v.label}: purchases answered per second",
        y_label="answers/s",
        desc="; ".join(by_phase) or "no samples inside the phases",
    )
    return f'<figure class="card"><figcaption>Purchases answered per second</figcaption>{chart}</figure>'


def _histogram_figure(v: View) -> str:
    run = v.run
    raw = run.get("latency_histogram_ms")
    buckets = sorted(
        (b[0], b[1])
        for b in (raw if isinstance(raw, list) else [])
        if isinstance(b, list) and len(b) == 2 and number(b[0]) is not None and isinstance(b[1], int)
    )
    known = {q: figure(run, f"{q}_ms") for q in ("p50", "p95", "p99") if figure(run, f"{q}_ms") is not None}
    said = ", ".join(f"{q} {ms(value)} ms" for q, value in known.items())
    if not buckets:
        return (
            f'<figure class="card"><figcaption>Latency</figcaption><p class="no-chart">This run has no latency '
            f"histogram{'; ' + esc(said) if said else ''}.</p></figure>"
        )
    busiest = max(buckets, key=lambda b: b[1])
    desc = (
        f"{count(sum(c for _, c in buckets))} purchase requests in {len(buckets)} buckets; most "
        f"({count(busiest[1])}) took up to {ms(busiest[0])} ms; {said or 'no percentiles'}"
    )
    chart = svg.histogram_chart(
        buckets, colour=v.colour, percentiles=known, title=f"{v.label}: latency of purchase requests", desc=desc
    )
    table = "".join(f'<tr><td>≤ {ms(u)}</td><td class="num">{count(c)}</td></tr>' for u, c in buckets if c)
    return (
        f'<figure class="card"><figcaption>Latency distribution <small>(purchase POSTs)</small></figcaption>{chart}'
        '<details><summary>Counts per bucket</summary><table class="small"><thead><tr><th scope="col">ms</th>'
        f'<th scope="col">requests</th></tr></thead><tbody>{table}</tbody></table></details></figure>'
    )


def _floor_share(v: View) -> str:
    rps = figure(v.run, "rps")
    if v.name == "floor":
        return f'<p class="share-text">Throughput: {cell(rps)} requests/s, the floor (1×).</p>'
    value = figure(v.run, "floor_ratio")
    if value is None:
        return f'<p class="share-text">Throughput: {cell(rps)} requests/s; no floor row to compare with.</p>'
    desc = f"{ratio(value)} the floor's throughput" + (f" ({count(rps)} requests/s)" if rps is not None else "")
    chart = svg.hbar_chart(
        [("throughput", [("", value)])],
        colours=[v.colour],
        unit="× the floor's requests/s",
        title=f"{v.label}: throughput as a share of the floor",
        desc=desc,
        reference=("floor", 1.0),
        value_format=ratio,
    )
    return (
        f'<figure class="share"><figcaption class="visually-hidden">Throughput against the floor</figcaption>'
        f"{chart}</figure>"
    )


def _split_figure(v: View) -> str:
    run = v.run
    parts = [("lock wait", "lock_wait_ms"), ("lock hold", "lock_hold_ms"), ("database", "db_ms"), ("total", "total_ms")]
    rows = []
    for label, key in parts:
        p50, p99 = timing(run, key, "p50"), timing(run, key, "p99")
        if key.startswith("lock") and not (p50 or p99):
            continue  # no lock was taken: a zero bar would only crowd the others
        if p50 is not None or p99 is not None:
            rows.append((label, [("p50", p50 or 0.0), ("p99", p99 or 0.0)]))
    if not rows:
        return (
            '<figure class="card"><figcaption>Server-side split</figcaption><p class="no-chart">This run has no '
            "Server-Timing figures.</p></figure>"
        )
    desc = "; ".join(f"{label}: p50 {ms(bars[0][1])} ms, p99 {ms(bars[1][1])} ms" for label, bars in rows)
    locked = any(label.startswith("lock") for label, _ in rows)
    note = "lock hold includes the database work done under the lock" if locked else "no lock taken"
    chart = svg.hbar_chart(
        rows,
        colours=["#94a3b8", "#334155"],
        unit="ms on the server",
        title=f"{v.label}: where a request's server time went",
        desc=desc,
        value_format=ms,
    )
    return f'<figure class="card"><figcaption>Server-side split <small>({note})</small></figcaption>{chart}</figure>'


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
        found = _SUMMARY.search(Path(path).read_text(encoding="utf-8"))
        return json.loads(found.group(1)) if found else None
    except (OSError, ValueError):
        return None
