"""The report's words: one sentence per run, its phases, and what a crash would keep (durability)."""

from __future__ import annotations

from .base import (
    BREAKDOWN_PARTS,
    CONTROLS,
    batched,
    breakdown_of,
    count,
    figure,
    ms,
    plural,
    ratio,
    row_label,
    status_count,
    timing,
    validate,
    with_floor_ratios,
)

# The sentence: what this run showed, from its own figures only.


def sentence(run: dict, *, name: str | None = None) -> str:
    """One plain sentence saying what ``run`` showed: first whether the stock came out right, then
    what it cost (connections, conflicts, busy answers, lock waits, throughput against the floor),
    then what a fault did. Figures the run lacks are left out, never guessed. It opens with ``name``
    (by default the row's, with its BATCH size when above 1: ``db ×64``)."""
    row = str(run.get("row", run.get("backend")))  # "backend": a document from before the rename
    name = name or row_label({**run, "row": row})
    rps = figure(run, "rps")
    if row == "floor":
        said = f"{count(rps)} requests/s" if rps is not None else "no throughput figure"
        if run.get("floor_of"):  # each row measured its own floor round; this row is the best of them
            return (
                f"floor: {said} with no storage touched, the best floor round (on {run['floor_of']}'s pods); "
                "each strategy's ratio is against the floor round on its own pods."
            )
        return f"floor: {said} with no storage touched; every ratio in this report is against it."
    outcome = _outcome(run, row)
    costs = _costs(run, row)
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


#: The article's claim that ``flashsale --fault kill-holder`` measures.
ARTICLE_CLAIM = "If a client disconnects, the lock is automatically released."


def kill_stalls(run: dict) -> str:
    """kill-holder's note: the article's claim beside the stall measured after each SIGKILL."""
    kills = [kill for kill in run.get("kills") or [] if isinstance(kill, dict)]
    if not kills:
        return ""
    stalls = ", ".join("never" if figure(k, "stalled_s") is None else f"{figure(k, 'stalled_s'):.2f}" for k in kills)
    timeout = figure(run, "lock_timeout_ms")
    bound = f"its timeout is {timeout:.0f} ms" if timeout is not None else "no timeout"
    freed = kills[0].get("freed_by")
    freed_text = f"; freed when {freed}" if isinstance(freed, str) else ""
    return f'the article: "{ARTICLE_CLAIM}" Measured: stalled {stalls} s after each SIGKILL ({bound}{freed_text})'


def sentences(data: dict) -> list[str]:
    """One :func:`sentence` per run of a burst document, in its order (each strategy row naming its
    BATCH size when some row ran batched, as the page does)."""
    runs = with_floor_ratios(validate(data))
    return [sentence(run, name=row_label(run, with_batch_1=batched(runs))) for run in runs]


def _share(part: float, total: float) -> str:
    return f"{part / total:.0%}" if total else "–"


def time_sentence(run: dict, *, name: str | None = None) -> str | None:
    """Where the server time of the row's purchases went, from its ``breakdown`` (means over the
    purchases whose section ran), the largest part first: ``redis ×64: 31 ms per purchase on the
    server (mean of 2,000 that reached their section): queued for a batch 18 ms (58%), holding the
    lock 7.1 ms (23%; its section sent 7 SQL statements, commit 0.4 ms), ...``. None without one."""
    parts = breakdown_of(run)
    if parts is None:
        return None
    hold = "holding the lock" if parts["locked"] else "in its transaction"
    words = dict(
        zip(BREAKDOWN_PARTS, ("queued for a batch", "waiting for the lock", hold, "outside the section"), strict=True)
    )
    total = sum(parts[key] for key in BREAKDOWN_PARTS)
    said = []
    for key in sorted(BREAKDOWN_PARTS, key=lambda key: -parts[key]):
        if parts[key] <= 0:
            continue
        text = f"{words[key]} {ms(parts[key])} ms ({_share(parts[key], total)}"
        if key == "lock_hold_ms":
            statements = f"{parts['sql_statements']:.1f}".removesuffix(".0")
            trips = f" in {ms(parts['sql_ms'])} ms of round trips" if parts["sql_ms"] is not None else ""
            text += f"; its section sent {statements} SQL statements{trips}, commit {ms(parts['commit_ms'])} ms"
        said.append(text + ")")
    name = name or row_label(run)
    return (
        f"{name}: {ms(total)} ms per purchase on the server (mean of {count(parts['answers'])} that reached "
        f"their section): {', '.join(said)}"
    )


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
        "zookeeper": "The lock znode is a ZooKeeper write, fsynced to the transaction log on disk of a majority "
        "of the three members before it is acknowledged: it survives restarts. It is ephemeral: it ends "
        "with its session, which can time out while a holder is paused; the fence (its sequence) refuses "
        "the late write.",
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
    ("zookeeper", "three ZooKeeper members (Zab)"),
    ("atomic", "PostgreSQL conditional UPDATE"),
    ("redis-stock", "a Redis counter, orders in PostgreSQL"),
    ("local", "process memory"),
    ("unsafe", "nowhere"),
]
