"""One Locust process's share of the flash sale (:class:`Sale`): its shoppers, the gate, and the
figures it counts for the summary that ``loadtests/locustfile.py`` writes."""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING

import gevent
from gevent.event import Event

from loadtests.figures import TIMING_KEYS

if TYPE_CHECKING:
    from loadtests.locustfile import Shopper

#: The last counter fields of a response body that the burst adds up.
BODY_COUNTS = ("conflicts", "retries", "constraint_hits")


class Sale:
    """This process's share of the sale: its shoppers, the gate, and what came back."""

    def __init__(self, limit: int, users: int) -> None:
        self.limit = limit
        self.users = users
        self.next_user = 0  # Shopper instances take their index from here
        self.prepared = 0
        self.page_failures = 0  # shoppers whose product page failed every attempt
        self.gate = Event()
        self.phase = "preparing"
        self.sent = 0  # purchases sent (a retried purchase counts once)
        self.answered = 0  # purchases with a final answer (or a transport error)
        self.status_counts: Counter[str] = Counter()  # final answers; "0" = no HTTP answer
        self.busy = 0  # final 503 + Retry-After answers (retries exhausted)
        self.client_retries = 0
        self.transport_resends = 0  # resends after no answer (a reset connection)
        self.transport_errors = 0
        self.counts = Counter()  # conflicts, retries, constraint_hits from the response bodies
        self.outcomes: Counter[str] = Counter()  # the body's "outcome" of each final answer
        self.latencies_ms: list[float] = []
        self.sent_times: list[float] = []  # wall clock of each purchase's first send
        self.answer_times: list[float] = []  # wall clock of each purchase's final answer
        # Per purchase: [first send, final answer (wall clock), final status, server's lock wait ms or None,
        # wall clock of each 503 + Retry-After answer it got (resent or final), of each try that got no answer
        # and was resent]
        self.purchases: list[list] = []
        self.timing: dict[str, list[float]] = {name: [] for name in TIMING_KEYS}
        self.first_sent_at: float | None = None
        self.last_sent_at: float | None = None
        self.last_answered_at: float | None = None
        self.last_confirmed_at: float | None = None
        self.quitting = False
        self.errors: list[str] = []  # exceptions in this file's own code: the run is void
        self.opening: list[tuple[Shopper, bytes]] = []  # spike: the purchases to write at the opening

    def shoppers_of(self, user_index: int) -> int:
        """How many of the share's shoppers user ``user_index`` (0-based) prepares and buys for."""
        return len(range(user_index, self.limit, self.users))

    @property
    def finished(self) -> bool:
        return self.answered + self.page_failures >= self.limit

    def quit_when_finished(self, environment) -> None:
        if self.finished and not self.quitting:
            self.quitting = True
            gevent.spawn(environment.runner.quit)

    def progress(self) -> dict:
        return {
            "phase": self.phase,
            "prepared": self.prepared,
            "page_failures": self.page_failures,
            "sent": self.sent,
            "answered": self.answered,
            "limit": self.limit,
        }

    def summary(self) -> dict:
        return {
            **self.progress(),
            **{name: self.counts[name] for name in BODY_COUNTS},
            "status_counts": dict(sorted(self.status_counts.items())),
            "outcomes": dict(sorted(self.outcomes.items())),
            "busy": self.busy,
            "client_retries": self.client_retries,
            "transport_resends": self.transport_resends,
            "transport_errors": self.transport_errors,
            "errors": self.errors,
            "first_sent_at": self.first_sent_at,
            "last_sent_at": self.last_sent_at,
            "last_answered_at": self.last_answered_at,
            "last_confirmed_at": self.last_confirmed_at,
            "latencies_ms": [round(value, 2) for value in self.latencies_ms],
            "sent_times": [round(value, 4) for value in self.sent_times],
            "answer_times": [round(value, 4) for value in self.answer_times],
            "purchases": self.purchases,
            "server_timing": self.timing,
        }
