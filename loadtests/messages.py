"""What the locustfile's processes tell each other: the names of Locust's custom messages, and
the fields of a worker's report (``loadtests/sale.py`` writes them, ``loadtests/conductor.py``
reads them). No import of the project: the three modules share this one."""

from __future__ import annotations

#: Worker → master: how many users it runs, once they are spawned.
USERS = "flashsale_users"
#: Worker → master: every shopper has its request for a round built.
READY = "flashsale_ready"
#: Worker → master: its last report of a round, with every purchase of it.
REPORT = "flashsale_report"
#: Master → one worker: its share of the sale.
SHARE = "flashsale_share"
#: Master → every worker at once: a round's gate opens.
OPEN = "flashsale_open"

#: The last counter fields of a response body that the burst adds up.
BODY_COUNTS = ("conflicts", "retries", "constraint_hits")
#: Counters a report carries as the worker's totals so far.
TOTALS = (
    "limit",
    "prepared",
    "page_failures",
    "sent",
    "answered",
    "busy",
    "client_retries",
    "transport_resends",
    "balancer_answers",
    "transport_errors",
)
#: Lists a report carries as the items added since the previous report.
SERIES = ("latencies_ms", "sent_times", "answer_times", "purchases")
#: Fields of a report that are the worker's totals so far (the master keeps the latest).
LATEST = (
    *TOTALS,
    "phase",
    "finished",
    *BODY_COUNTS,
    "status_counts",
    "outcomes",
    "errors",
    "first_sent_at",
    "last_sent_at",
    "last_answered_at",
    "last_confirmed_at",
    "breakdown",
    "whole",
)
