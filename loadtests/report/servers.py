"""The report's servers section: each strategy on WSGI pods beside the same strategy on ASGI pods.

``flashsale --server wsgi,asgi`` runs every row on both; each row's ``×floor`` is read against the
floor round on its own pods, so the two servers' ratios are comparable even though their floors
differ. Each sentence is computed from the two rows of one strategy (at one BATCH size) in the same
document, and says where the time went from the servers' own ``Server-Timing``: the hold (the lock's
grant to release, or the section's transaction) and the database time.
"""

from __future__ import annotations

from django.utils.html import escape as esc

from .base import count, figure, ms, ratio, timing
from .views import View, paired_rows

HEAD = ["strategy", "server", "purchases/s", "× WSGI", "×floor", "floor purchases/s", "hold p50 ms", "db p99 ms"]


def server_of(run: dict) -> str:
    return run.get("server") if run.get("server") == "asgi" else "wsgi"  # older documents: WSGI


def server_pairs(shown: list[View]) -> list[tuple[View, View]]:
    """(the row on WSGI, the same row on ASGI), for every strategy, BATCH size and queue that ran on both."""
    on_wsgi = {_key(v): v for v in shown if server_of(v.run) == "wsgi" and v.name != "floor"}
    return [(on_wsgi[_key(v)], v) for v in shown if server_of(v.run) == "asgi" and _key(v) in on_wsgi]


def _key(view: View) -> tuple:
    """The row's strategy, BATCH size and queue; a size or queue of the wrong type (a document
    edited by hand) counts as missing."""
    batch, queue = view.run.get("batch"), view.run.get("queue")
    return view.name, batch if isinstance(batch, int) else None, queue if isinstance(queue, str) else None


def _floor_rps(run: dict) -> float | None:
    floor = run.get("floor")
    return figure(floor, "rps") if isinstance(floor, dict) else None


def server_sentence(wsgi: dict, asgi: dict) -> str | None:
    """``redis: on ASGI 0.93× its purchases/s on WSGI (812 against 873); ×floor 0.55 and 0.57; hold p50 ...``."""
    rps_asgi, rps_wsgi = figure(asgi, "rps"), figure(wsgi, "rps")
    if not rps_asgi or not rps_wsgi:
        return None
    said = f"{asgi['row']}: on ASGI {ratio(rps_asgi / rps_wsgi)} its purchases/s on WSGI"
    said += f" ({count(rps_asgi)} against {count(rps_wsgi)})"
    floors = figure(asgi, "floor_ratio"), figure(wsgi, "floor_ratio")
    if None not in floors:
        said += f"; ×floor {floors[0]:.2f} on ASGI's own floor, {floors[1]:.2f} on WSGI's"
    holds = figure(asgi, "hold_p50"), figure(wsgi, "hold_p50")
    if None not in holds:
        said += f"; hold p50 {ms(holds[0])} ms against {ms(holds[1])} ms"
    return said


def _cells(run: dict, wsgi: dict | None) -> str:
    rps, floor_rps, db = figure(run, "rps"), _floor_rps(run), timing(run, "db_ms", "p99")
    values = [
        server_of(run),
        count(rps) if rps is not None else "–",
        ratio(rps / figure(wsgi, "rps")) if wsgi and rps and figure(wsgi, "rps") else "–",
        f"{figure(run, 'floor_ratio'):.2f}" if figure(run, "floor_ratio") is not None else "–",
        count(floor_rps) if floor_rps is not None else "–",
        ms(figure(run, "hold_p50")) if figure(run, "hold_p50") is not None else "–",
        ms(db) if db is not None else "–",
    ]
    return "".join(f'<td class="num">{esc(value)}</td>' for value in values)


def servers_section(shown: list[View]) -> str:
    """The section, or nothing when no strategy ran on both servers."""
    found = server_pairs(shown)
    if not found:
        return ""
    rows, said = paired_rows(found, _cells, server_sentence)
    head = "".join(f"<th scope=col>{esc(title)}</th>" for title in HEAD)
    return (
        '<section aria-labelledby="servers"><h2 id="servers">Two servers: WSGI threads and the ASGI event loop</h2>'
        "<p>Each strategy on gunicorn's threads (WSGI) and on uvicorn workers, where the purchase is an async view "
        "holding the asyncio lock on the event loop and the section runs on ORM threads (ASGI). Each row's ×floor "
        "is read against the floor round on its own pods.</p>"
        f'<ul class="sentences">{"".join(said)}</ul>'
        f'<table class="comparison"><thead><tr>{head}</tr></thead><tbody>{"".join(rows)}</tbody></table></section>'
    )
