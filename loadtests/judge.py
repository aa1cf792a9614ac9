"""Whether one row of the burst held: the database's audit and the client's and server's counts.

Each problem is one sentence; a row with none has ``invariants_ok``. No Django import: the audit
comes in as an ``inventory.services.AuditReport`` (or None for the floor).
"""

from __future__ import annotations

#: The spike's target: every purchase sent within this many seconds of the first (client clock).
SPIKE_ARRIVAL_LIMIT_S = 1.0
#: A fault run fails when, from a second after the recovery on, no purchase was confirmed for longer.
GAP_LIMIT_S = 2.0
#: A connection reset by a fault is noticed at the shopper's next send, which may wait out a
#: Retry-After first: resets this long after the fault's window still count as inside it.
RESET_GRACE_S = 5.0


def judge(*, backend: str, plan, figures: dict, report, errors_5xx: int) -> list[str]:
    """The problems of one row; ``report`` is None for the floor, which sells nothing and is not audited."""
    problems = [f"the load generator failed: {error}" for error in figures.get("errors", [])[:3]]
    if report is not None:
        problems += report.problems
        # Every shopper told "confirmed" holds an order, and every order was confirmed to its shopper
        # (one unit a purchase, one key each): the audit alone balances stock against orders only.
        confirmed = sum(n for status, n in figures["status_counts"].items() if str(status).startswith("2"))
        if confirmed != report.orders:
            problems.append(f"{confirmed} purchases were confirmed, but the database holds {report.orders} orders")
        if figures["constraint_hits"]:
            problems.append(f"{figures['constraint_hits']} writes stopped only by a database constraint")
        if min((point[1] for point in figures["timeline"] if point[1] is not None), default=0) < 0:
            problems.append("stock went below 0 during the burst")
    problems += figures.get("fault_problems", [])
    gap = figures.get("longest_gap_s")
    if gap is not None and gap > GAP_LIMIT_S:
        problems.append(
            f"no purchase was confirmed for {gap:.2f}s after {figures.get('fault')} recovered (limit {GAP_LIMIT_S:g}s)"
        )
    if errors_5xx:
        problems.append(f"{errors_5xx} server errors")
    if figures["transport_errors"]:
        problems.append(f"{figures['transport_errors']} purchases got no HTTP answer (refused, reset or timed out)")
    if figures["page_failures"]:
        problems.append(f"{figures['page_failures']} shoppers could not be prepared (GET /api/session)")
    if figures["sent"] != plan.requests or figures["answered"] != plan.requests:
        problems.append(f"sent {figures['sent']} purchases, {figures['answered']} answered, not {plan.requests}")
    problems += reset_problems(figures)
    killed_threads = len(figures.get("kills") or []) * plan.threads  # kill-holder's workers
    if figures.get("fault") == "kill-pod":
        killed_threads += plan.workers * plan.threads  # one whole pod, every worker SIGKILLed
    problems += post_count_problems(figures, killed_threads=killed_threads)
    window = figures["arrival_window_s"]
    if plan.scenario == "spike" and window is not None and window > SPIKE_ARRIVAL_LIMIT_S:
        problems.append(
            f"the spike took {window:.2f}s to send (over {SPIKE_ARRIVAL_LIMIT_S:.1f}s): "
            "not a spike; use more --locust-workers or fewer --requests"
        )
    return problems


def reset_problems(figures: dict) -> list[str]:
    """A purchase resent after no answer is fine only inside a fault's window (its resend was
    answered, or it is a transport error already); anywhere else the shop dropped a connection."""
    window = figures.get("fault_window") or [None, None]
    start, end = window[0], window[1]
    resets = [at for purchase in figures.get("purchases", []) for at in (purchase[5] if len(purchase) > 5 else ())]
    outside = [at for at in resets if start is None or at < start or (end is not None and at > end + RESET_GRACE_S)]
    if not outside:
        return []
    return [f"{len(outside)} purchases got no answer outside a fault's window and were resent"]


def post_count_problems(figures: dict, *, killed_threads: int = 0) -> list[str]:
    """The purchase POSTs the pods logged against those Locust sent them: every try but those the
    balancer answered itself. One that got no answer, or a balancer's 502, may have died with its
    worker or pod before it was logged: up to one per resend after no answer, and per final transport
    error. A worker SIGKILLed (by kill-holder, or with its whole pod by kill-pod) may also have
    answered and not yet logged up to one request per thread (gunicorn logs after the response):
    ``killed_threads`` in all."""
    resends, by_balancer = figures.get("transport_resends", 0), figures.get("balancer_answers", 0)
    posts = figures["sent"] + figures["client_retries"] + resends - by_balancer
    unlogged = resends + figures["transport_errors"] + killed_threads
    if posts - unlogged <= figures["server_purchases"] <= posts:
        return []
    return [
        f"the pods logged {figures['server_purchases']} purchase POSTs, Locust sent {posts} to them "
        f"({figures['sent']} purchases + {figures['client_retries']} retries + {resends} resends after no answer"
        f" - {by_balancer} answered by the balancer" + (f"; {unlogged} unanswered" if unlogged else "") + ")"
    ]


def floor_problems(floor: dict, *, requests: int) -> list[str]:
    """A floor round's problems: it must answer every one of ``requests`` shoppers ``200`` (it
    touches no storage), or the rate a row's ``×floor`` is read against is not the floor's."""
    sent, answered = floor.get("sent"), floor.get("answered")
    problems = [] if sent == answered == requests else [f"sent {sent}, {answered} answered, not {requests}"]
    others = {status: n for status, n in sorted((floor.get("status_counts") or {}).items()) if status != "200" and n}
    if others:
        said = ", ".join(f"{n} × {'no answer' if status == '0' else status}" for status, n in others.items())
        problems.append(f"{sum(others.values())} answers other than 200 ({said})")
    return problems
